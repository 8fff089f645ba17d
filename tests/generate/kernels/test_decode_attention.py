"""nvkit's batch-1 decode attention (``nvkit.generate.kernels.decode_attention``: the split-K kernel
over a contiguous static cache and its variant with the q/k norms, RoPE and the cache write fused
in), run by Triton's interpreter on the CPU (TRITON_INTERPRET=1, which must be set before triton is
imported: hence a child process), against the references in plain torch: ``attend_rope_reference``
below, built on ``attend_reference`` and ``rope_reference`` (in ``nvkit.benchmarks.attention``,
whose paged-attention benchmark checks against them too). The GPU run of the same kernels is
tests/gpu/test_fast_gpu.py and the "fast+split" decode benchmark."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from nvkit.benchmarks.attention import attend_reference, rope_reference  # noqa: E402
from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def attend_rope_reference(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale: float, eps: float):
    """``decode_attention_rope`` in plain torch (writes into ``k``/``v`` the same way)."""
    nkv = k.shape[0]
    nh = qkv.shape[0] - 2 * nkv
    q = rope_reference(qkv[:nh], q_weight, cos, sin, eps)
    k[:, int(pos)] = rope_reference(qkv[nh:nh + nkv], k_weight, cos, sin, eps).to(k.dtype)
    v[:, int(pos)] = qkv[nh + nkv:]
    return attend_reference(q, k, v, pos, scale).to(qkv.dtype)


def test_kernel_matches_reference_at_every_kind_of_position():
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        # (query heads, KV heads, head_dim, cache length, dtype): Qwen3-0.6B's layout, an odd group
        # (3 query heads per KV head, padded inside the kernel), no grouping, bf16
        for nh, nkv, hd, length, dtype in [(16, 8, 128, 512, torch.float32), (6, 2, 32, 256, torch.float32),
                                           (8, 8, 64, 256, torch.float32), (4, 2, 16, 256, torch.bfloat16)]:
            q, k, v = torch.randn(nh, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype)
            for p in (0, 1, 37, length // 2, length - 1):  # first slice only ... every slice full
                pos = torch.tensor(p)
                got = da.decode_attention(q, k, v, pos, hd ** -0.5)
                ref = attend_reference(q, k, v, pos, hd ** -0.5)
                tol = 1e-5 if dtype == torch.float32 else 3e-2  # bf16: a couple of ulps at |x| ~ 2-4
                err = (got.float() - ref.float()).abs().max().item()
                assert got.dtype == dtype and got.shape == (nh, hd)
                assert err <= tol, (nh, nkv, hd, length, p, err)
                # positions past pos must not matter (they hold whatever the cache had)
                k2, v2 = k.clone(), v.clone()
                k2[:, p + 1:] = 1e4
                v2[:, p + 1:] = float("nan")
                assert torch.equal(da.decode_attention(q, k2, v2, pos, hd ** -0.5), got)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_shape_checks():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels import decode_attention as da
        ok = da.check_shapes(torch.zeros(16, 128), torch.zeros(8, 512, 128), torch.zeros(8, 512, 128))
        assert ok is None, ok
        assert "powers of two" in da.check_shapes(torch.zeros(4, 96), torch.zeros(2, 256, 96), torch.zeros(2, 256, 96))
        assert "cannot attend" in da.check_shapes(torch.zeros(5, 64), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64))
        assert da.splits_for(256) == 8 and da.splits_for(512) == 16 and da.splits_for(8192) == 16
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_fast_decoder_with_triton_attention_decodes_like_matmul():
    """The whole fused step with attention='triton-split' and 'triton-fused' (no CUDA graphs: the CPU
    checks the logic):
    the demo model's greedy tokens are the matmul path's, logits within bf16 rounding."""
    out = _interpret("""
        import torch, nvkit
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import nvkit.generate.fast as fast
        m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
        tok = AutoTokenizer.from_pretrained(nvkit.demo.path())
        ids = tok("NVIDIA GPUs are", return_tensors="pt")["input_ids"]
        sampling, _ = fast.resolve(m, dict(max_new_tokens=12, do_sample=False, eos_token_id=10 ** 7))
        with torch.inference_mode():
            ref = fast.FastDecoder(m, k_steps=4, graphs=False)
            a, ref_logits = ref.trace(ids, sampling)
            for kind in ("triton-split", "triton-fused"):
                tri = fast.FastDecoder(m, k_steps=4, graphs=False, attention=kind)
                b, lb = tri.trace(ids, sampling)
                assert a == b, (kind, a, b)
                la, lb = torch.stack(ref_logits), torch.stack(lb)
                diff, scale = (la - lb).abs().max().item(), la.abs().max().item()
                # the demo weights are bf16: the matmul path rounds the probabilities (and q after
                # its norm and RoPE) to bf16, the kernels keep them in fp32, so the logits differ by
                # bf16 rounding of the attention output
                assert m.dtype == torch.bfloat16 and diff <= 0.01 * scale, (kind, diff, scale)
                print(kind, diff)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_the_op_traces_whole_under_torch_compile():
    """The fused step is compiled with fullgraph=True: the op must trace (through its fake) without
    a graph break, read the cache as written just before it, and give the eager result."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        q, k, v = torch.randn(16, 128), torch.randn(8, 512, 128), torch.randn(8, 512, 128)
        new_k = torch.randn(8, 1, 128)

        def step(q, k, v, pos, new_k):
            k.index_copy_(1, pos.view(1), new_k)  # like the step: write the new key, then attend
            return da.decode_attention(q, k, v, pos, 0.125) * 2

        pos = torch.tensor(37)
        want = step(q, k.clone(), v, pos, new_k)
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k.clone(), v, pos, new_k)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        ref = attend_reference(q, k.index_copy(1, pos.view(1), new_k), v, pos, 0.125) * 2
        assert torch.allclose(got, ref, atol=1e-5)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_rope_kernel_norms_rotates_writes_the_cache_and_attends():
    """decode_attention_rope against plain torch: q/k RMS norm (or none), RoPE, the new key and
    value written at pos (nothing else in the cache touched), attention over 0..pos."""
    out = _interpret("""
        import torch
        from tests.generate.kernels.test_decode_attention import attend_rope_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        for nh, nkv, hd, length, dtype, norm in [(16, 8, 128, 512, torch.float32, True),
                                                 (6, 2, 32, 256, torch.float32, False),
                                                 (4, 2, 16, 256, torch.bfloat16, True)]:
            for p in (0, 1, 37, length - 1):
                qkv = torch.randn(nh + 2 * nkv, hd, dtype=dtype)
                qw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
                kw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
                ang = torch.randn(hd // 2).repeat(2)
                cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
                k, v = torch.randn(nkv, length, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype)
                k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
                k1[:, p + 1:] = 1e4
                v1[:, p + 1:] = float("nan")  # past pos: whatever the cache held, never read
                pos = torch.tensor(p)
                got = da.decode_attention_rope(qkv, qw, kw, cos, sin, k1, v1, pos, hd ** -0.5, 1e-6)
                ref = attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, pos, hd ** -0.5, 1e-6)
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                assert got.shape == (nh, hd) and got.dtype == dtype
                err = (got.float() - ref.float()).abs().max().item()
                kerr = (k1[:, p].float() - k2[:, p].float()).abs().max().item()
                assert err <= tol and kerr <= tol, (nh, p, err, kerr)
                assert torch.equal(v1[:, :p + 1], v2[:, :p + 1])
                assert torch.equal(k1[:, :p], k[:, :p]) and (k1[:, p + 1:] == 1e4).all()
        bad = torch.zeros(20, 64)
        for args, why in [((bad, None, None, torch.zeros(64), torch.zeros(64), torch.zeros(2, 256, 32), torch.zeros(2, 256, 32)), "cannot attend"),
                          ((bad, None, None, torch.zeros(32), torch.zeros(32), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64)), "cos and sin"),
                          ((bad, torch.ones(64), None, torch.zeros(64), torch.zeros(64), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64)), "both norm weights")]:
            try:
                da.decode_attention_rope(*args, torch.tensor(0), 0.1, 1e-6)
            except ValueError as e:
                assert why in str(e), e
            else:
                raise AssertionError(why)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_rope_op_compiles_in_place_on_the_cache():
    """Under torch.compile (inductor, on the CPU here) the op that writes the cache is called on the
    cache itself: no copy of a cache-sized buffer per step, and the cache ends as in eager."""
    out = _interpret("""
        import re
        import torch
        from torch._inductor.utils import run_and_get_code
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        nh, nkv, hd, L = 16, 8, 128, 256
        cache_k, cache_v = torch.zeros(1, nkv, L, hd), torch.zeros(1, nkv, L, hd)
        w = torch.randn((nh + 2 * nkv) * hd, 64) * 0.1
        qw, kw = torch.rand(hd) + 0.5, torch.rand(hd) + 0.5
        ang = torch.randn(hd // 2).repeat(2)
        cos, sin = ang.cos(), ang.sin()
        pos = torch.tensor(0)

        def step(x):  # like nvkit.fast's fused step: projection, the op on the cache, advance pos
            qkv = (w @ x).view(nh + 2 * nkv, hd)
            o = da.decode_attention_rope(qkv, qw, kw, cos, sin, cache_k[0], cache_v[0], pos, 0.1, 1e-6)
            pos.add_(1)
            return o.sum(0) * 2

        f = torch.compile(step, fullgraph=True)
        xs = [torch.randn(64) for _ in range(5)]
        first, codes = run_and_get_code(f, xs[0])
        outs = [first] + [f(x) for x in xs[1:]]
        got_k, got_v = cache_k.clone(), cache_v.clone()
        code = "\\n".join(codes)
        assert "decode_attention_rope" in code
        # a copy would show as a new cache-sized buffer (or a clone) in the generated code
        assert not re.search(rf"empty_strided_\\w+\\(\\((1, )?{nkv}, {L}, {hd}\\)|clone", code), code
        cache_k.zero_(); cache_v.zero_(); pos.zero_()
        ref = [step(x) for x in xs]
        assert int(pos) == 5 and (cache_k[0, :, 5:] == 0).all() and (got_k[0, :, 5:] == 0).all()
        assert torch.allclose(got_k, cache_k, atol=1e-5) and torch.allclose(got_v, cache_v, atol=1e-5)
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(outs, ref))
        print("ok")
    """)
    assert out.strip().endswith("ok")
