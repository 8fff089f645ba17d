"""The batch-1 attention op (``decode_attention_rope``) on a real GPU with the launch its rule picks
for each cache (``decode_attention.default_launch``), against the fp32 reference in plain torch:
short positions in a short cache, a short chat in a long prompt's cache, and long prompts, with and
without a sliding window and the q/k norms. The interpreter tests (tests/generate/kernels) check
the arithmetic; these check that the launches the GPU compiles give the same."""

import pytest
import torch

from nvkit.benchmarks.attention import attend_rope_reference
from nvkit.generate.kernels import decode_attention as da

CASES = [  # (position, cache size, window)
    (0, 1024, 0), (5, 1024, 0), (300, 1024, 0), (100, 16384, 0), (7967, 16384, 0), (8191, 16384, 0),
    (16000, 32768, 0), (7967, 16384, 4096), (1500, 16384, 512),
]


@pytest.mark.parametrize("norms", [True, False])
@pytest.mark.parametrize("pos, cache, window", CASES)
def test_the_default_launch_matches_the_reference(pos, cache, window, norms):
    g = torch.Generator(device="cpu").manual_seed(pos + cache)
    nh, nkv, hd = 16, 8, 128  # Qwen3-0.6B's attention
    dev, dt = "cuda", torch.bfloat16
    k = torch.randn((nkv, cache, hd), generator=g).to(dev, dt)
    v = torch.randn((nkv, cache, hd), generator=g).to(dev, dt)
    qkv = torch.randn((nh + 2 * nkv, hd), generator=g).to(dev, dt)
    qw = (torch.rand(hd, generator=g) + 0.5).to(dev, dt) if norms else None
    kw = (torch.rand(hd, generator=g) + 0.5).to(dev, dt) if norms else None
    ang = torch.randn(hd // 2, generator=g).repeat(2)
    cos, sin = ang.cos().to(dev, dt), ang.sin().to(dev, dt)
    p = torch.tensor(pos, device=dev)
    ref_k, ref_v = k.clone(), v.clone()
    ref = attend_rope_reference(qkv, qw, kw, cos, sin, ref_k, ref_v, p, hd ** -0.5, 1e-6, window).float()
    out = da.decode_attention_rope(qkv, qw, kw, cos, sin, k, v, p, hd ** -0.5, 1e-6, window)
    torch.cuda.synchronize()
    assert out.shape == (nh, hd) and torch.isfinite(out).all()
    err = (out.float() - ref).abs().max().item()
    assert err < 2e-2, (pos, cache, window, da.default_launch(k), err)
    # the new key and value were written where the reference wrote them (the key within a rounding
    # of the reference's fp32 norm and rotation), and nothing else changed
    assert torch.equal(v, ref_v)
    assert (k[:, pos].float() - ref_k[:, pos].float()).abs().max().item() < 2e-2
    k[:, pos] = ref_k[:, pos]
    assert torch.equal(k, ref_k)


def test_a_16_bit_cache_on_the_gpu_attends_on_tensor_cores_and_an_fp32_one_does_not():
    for dtype, dot in ((torch.bfloat16, True), (torch.float16, True), (torch.float32, False)):
        for length, blocks in ((32, 1), (1024, 2), (32768, 2)):
            launch = da.default_launch(torch.zeros((8, length, 128), dtype=dtype, device="cuda"))
            assert launch["dot"] == (dot and length >= 64), (dtype, length, launch)
            assert launch["blocks_per_step"] == (blocks if launch["dot"] else 1), (dtype, length, launch)
