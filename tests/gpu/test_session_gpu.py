"""The spine on a real GPU: load → generate → unload for the demo model and the Qwen3-0.6B shape."""

import time

import pytest
import torch

import nvkit


def _check_roundtrip(model, expect_params):
    s = nvkit.load(model, device_map="cuda")
    assert s.device.type == "cuda"
    cap = torch.cuda.get_device_capability(0)
    assert s.info["dtype"] == ("bfloat16" if cap >= (8, 0) else "float16")
    assert expect_params[0] <= s.info["parameters"] <= expect_params[1]
    allocated = torch.cuda.memory_allocated()
    assert allocated > 0
    t0 = time.perf_counter()
    out = s.generate("NVIDIA GPUs are", max_new_tokens=32, fast=False)
    dt = time.perf_counter() - t0
    print(f"\n{model}: {s.summary()}\n  generate: {s.last_stats} ({dt:.2f} s)")
    assert isinstance(out, str) and s.last_stats.new_tokens > 0
    outs = s.generate(["NVIDIA GPUs are", "Memory"], max_new_tokens=8)
    assert len(outs) == 2
    freed = s.unload()
    print(f"  unload freed {freed / 2**20:.1f} MiB (allocated before {allocated / 2**20:.1f} MiB)")
    assert freed >= 0.9 * allocated - 64 * 2**20
    return out


def test_demo_on_cuda_matches_cpu_greedy():
    cuda_out = _check_roundtrip("demo", (1e6, 10e6))
    cpu = nvkit.load("demo", device_map="cpu", dtype="bfloat16")
    cpu_out = cpu.generate("NVIDIA GPUs are", max_new_tokens=32)
    cpu.unload()
    # same weights, same dtype: the first words agree (bf16 kernels differ slightly between devices)
    assert cuda_out.split()[:3] == cpu_out.split()[:3]


def test_qwen3_shape_on_cuda():
    path = nvkit.demo.shaped("qwen3-0.6b")
    _check_roundtrip(path, (0.55e9, 0.8e9))


def test_stop_on_cuda_ends_early():
    s = nvkit.load("demo", device_map="cuda")
    import threading
    threading.Timer(0.5, s.stop).start()
    s.generate("NVIDIA GPUs are", max_new_tokens=100000, min_new_tokens=100000, fast=False)
    assert s.last_stats.stopped and s.last_stats.new_tokens < 100000
    s.unload()
