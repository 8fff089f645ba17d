"""Shapes drawn on the GPU (``nvkit.demo.shaped(..., device="cuda")``, what the benchmarks use):
the same model as a CPU build — tensors, buffers, init spread — and a folder that loads and runs."""
import time

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (the GPU draws the weights)", allow_module_level=True)

import nvkit  # noqa: E402
from nvkit.demo.shaped import SHAPES, random_model  # noqa: E402

from tests.demo.test_shaped_build import cut  # noqa: E402


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_gpu_draw_is_the_cpu_draws_model(name):
    cfg = cut(name)
    cpu, gpu = random_model(cfg, "cpu"), random_model(cfg, "cuda")
    ours, theirs = {k: v.cpu() for k, v in gpu.state_dict().items()}, cpu.state_dict()
    assert ours.keys() == theirs.keys()
    for key, want in theirs.items():
        got = ours[key]
        assert (got.shape, got.dtype) == (want.shape, want.dtype) and torch.isfinite(got.float()).all(), key
        if want.numel() < 1000 or want.float().std() == 0:
            assert torch.equal(got, want), key
        else:
            assert abs(got.float().std() - want.float().std()) < 0.1 * want.float().std(), key
    cpu_buffers = dict(cpu.named_buffers())
    for key, got in gpu.named_buffers():
        torch.testing.assert_close(got.cpu(), cpu_buffers[key], msg=key)
    del gpu
    torch.cuda.empty_cache()


def test_a_shape_built_on_the_gpu_loads_and_generates(tmp_path):
    before = torch.cuda.memory_allocated()
    t = time.perf_counter()
    path = nvkit.demo.shaped("gemma-3-1b", cache_dir=tmp_path, device="cuda")
    built = time.perf_counter() - t
    print(f"\ngemma-3-1b drawn on the GPU and written in {built:.1f} s")
    assert torch.cuda.memory_allocated() - before < 2**20  # the build's copy is gone before the caller loads
    s = nvkit.load(path, device_map="cuda", dtype="bfloat16")
    try:
        text = s.generate("The history of", max_new_tokens=8, min_new_tokens=8)
        assert isinstance(text, str) and s.last_stats.new_tokens == 8
    finally:
        s.unload()
