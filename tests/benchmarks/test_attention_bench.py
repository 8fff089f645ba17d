"""The paged-attention launch-shape benchmark: its inputs and refusals, and a whole run under
Triton's interpreter on the CPU (the figures need CUDA: ``python -m nvkit.benchmarks.attention`` on
the GPU machine, tests/gpu/test_batched_gpu.py)."""

import os
import subprocess
import sys
import textwrap

import pytest

from nvkit.benchmarks import attention as A
from nvkit.errors import NvkitError


def test_shapes_parse_and_bad_ones_say_the_form():
    assert A.parse_shapes("auto/1/auto, 2/2/8, 4/2/4/dot/3, 1/1/4/sum") == (
        (None, 1, None, False, None), (2, 2, 8, False, None), (4, 2, 4, True, 3), (1, 1, 4, False, None))
    for bad, words in (("2/2", "splits/pages/warps"), ("x/1/4", "'x'"), ("auto/auto/4", "pages per step"),
                       ("0/1/4", "'0'"), ("1/-2/4", "'-2'"), ("1/1/4/mma", "'dot' or 'sum'"),
                       ("1/1/4/dot/0", "'0'"), ("1/1/4/dot/3/9", "splits/pages/warps")):
        with pytest.raises(NvkitError, match=words):
            A.parse_shapes(bad)


@pytest.mark.parametrize("kw, words", [
    (dict(model="gpt-17"), "model must be one of"),
    (dict(rows=()), "rows must be"),
    (dict(rows=(64, 0)), "rows must be"),
    (dict(rows=(True,)), "rows must be"),
    (dict(lo=600, hi=512), "lo .600. must not be more than hi"),
    (dict(repeats=0), "repeats must be"),
    (dict(shapes=((1, 1, 4),)), "tuples"),
    (dict(device="tpu"), "device must be"),
    (dict(device="cpu"), "TRITON_INTERPRET=1"),
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


def test_a_whole_run_in_the_interpreter_checks_every_shape_against_the_reference():
    pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent("""
        from nvkit.benchmarks import attention as A
        shapes = (A.SHAPES[0], A.SHAPES[3], A.SHAPES[10], A.SHAPES[-1])
        df = A.paged(rows=(3,), lo=16, hi=40, new_tokens=8, repeats=1, shapes=shapes, device="cpu")
        assert list(df["shape"])[0] == "default" and len(df) == 4, df
        assert "note" not in df.columns or df["note"].isna().all(), df["note"].tolist()
        assert (df["max_err"] < 1e-4).all() and (df["us_per_call"] > 0).all() and (df["kv_mib"] > 0).all()
        assert df.attrs["layers"] == 28 and df.attrs["heads"] == (16, 8, 128)
        print("ok", df["shape"].tolist())
    """)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
