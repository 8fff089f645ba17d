"""The paged-attention launch-shape benchmark's inputs and refusals (the timing itself needs CUDA:
``python -m nvkit.benchmarks.attention`` on the GPU machine; the shapes' results are checked
against the reference on the CPU in tests/generate/test_decode_attention.py)."""

import pytest

from nvkit.benchmarks import attention as A
from nvkit.errors import NvkitError


def test_shapes_parse_and_bad_ones_say_the_form():
    assert A.parse_shapes("auto/1/auto, 2/2/8") == ((None, 1, None), (2, 2, 8))
    for bad, words in (("2/2", "splits/pages/warps"), ("x/1/4", "'x'"), ("auto/auto/4", "pages per step"),
                       ("0/1/4", "'0'"), ("1/-2/4", "'-2'")):
        with pytest.raises(NvkitError, match=words):
            A.parse_shapes(bad)


@pytest.mark.parametrize("kw, words", [
    (dict(model="gpt-17"), "model must be one of"),
    (dict(rows=()), "rows must be"),
    (dict(rows=(64, 0)), "rows must be"),
    (dict(rows=(True,)), "rows must be"),
    (dict(lo=600, hi=512), "lo .600. must not be more than hi"),
    (dict(repeats=0), "repeats must be"),
    (dict(shapes=((1, 1),)), "triples"),
])
def test_bad_arguments_are_refused_before_any_work(kw, words):
    with pytest.raises(NvkitError, match=words):
        A.paged(**kw)


def test_without_cuda_it_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the benchmark runs (tests/gpu/test_batched_gpu.py)")
    with pytest.raises(NvkitError, match="CUDA GPU"):
        A.paged(rows=(4,))
    assert A.main(["--rows", "4"]) == 2
    assert A.main(["--shapes", "nope"]) == 2
