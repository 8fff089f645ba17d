"""``nvkit.generate.kernels.add_rms_norm`` (the residual sum with the RMSNorm after it) against its
torch reference, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set before
triton is imported: hence a child process), in float16 and float32 (the interpreter rounds bfloat16
by truncation, so bf16 is checked on the GPU: tests/gpu/test_norm_kernels_gpu.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def add_rms_norm_reference(h, delta, weight, eps: float):
    """``add_rms_norm`` in torch's operations (transformers' RMSNorm after the sum)."""
    import torch
    total = h + delta
    f = total.float()
    f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)
    return total, weight * f.to(h.dtype)


def test_the_sum_and_its_norm_match_torch():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels.add_rms_norm import add_rms_norm
        from tests.generate.kernels.test_add_rms_norm import add_rms_norm_reference
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.float32):
            for shape in ((1, 1024), (3, 1000), (2, 2, 64)):   # one token; rows; a width not a power of two
                h, d = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
                w = torch.randn(shape[-1], dtype=dtype)
                total, x = add_rms_norm(h, d, w, 1e-6)
                rt, rx = add_rms_norm_reference(h, d, w, 1e-6)
                assert total.shape == shape and x.shape == shape and x.dtype == dtype
                assert torch.equal(total, rt)
                tol = 2e-3 if dtype == torch.float16 else 1e-5
                assert torch.allclose(x.float(), rx.float(), atol=tol * 8, rtol=tol), (x - rx).abs().max()
        # the norm's weight in float32 (a model that keeps it so): the output follows torch's promotion
        h = torch.randn(1, 64, dtype=torch.float16)
        assert add_rms_norm(h, h, torch.ones(64), 1e-6)[1].dtype == torch.float32
        from tests.triton_interpreter import refused
        refused(lambda: add_rms_norm(h, h[:, :32], torch.ones(64), 1e-6))
        refused(lambda: add_rms_norm(h, h, torch.ones(32), 1e-6))
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 2, out


def test_the_weight_first_norm_matches_the_gemma_and_olmo2_rounding():
    """``weight_first``: the normalised row times the weight in float32, rounded once at the end, as
    ``llama_step.rms_norm(..., weight_first=True)`` (OLMo 2's norm, and the Gemma family's with its
    float32 1 + w) computes it; the result keeps the input's dtype even with a float32 weight, and
    differs from the Llama rounding, so the flag is seen."""
    out = _interpret("""
        import torch
        from nvkit.generate.fast.llama_step import rms_norm
        from nvkit.generate.kernels.add_rms_norm import add_rms_norm
        torch.manual_seed(0)
        h, d = torch.randn(3, 1000, dtype=torch.float16), torch.randn(3, 1000, dtype=torch.float16)
        w = 1.0 + torch.randn(1000) * 0.1                  # Gemma's 1 + w, in float32
        total, x = add_rms_norm(h, d, w, 1e-6, weight_first=True)
        ref = rms_norm(h + d, w, 1e-6, weight_first=True)
        assert x.dtype == torch.float16 and torch.equal(total, h + d)
        assert torch.allclose(x.float(), ref.float(), atol=1e-2, rtol=2e-3), (x - ref).abs().max()
        llama = add_rms_norm(h, d, w, 1e-6)[1]
        assert llama.dtype == torch.float32 and not torch.allclose(llama, x.float(), atol=0, rtol=0)
        print("OK")
    """)
    assert out.strip().endswith("OK"), out


def test_a_branch_norm_before_the_sum_and_a_norm_alone_match_the_eager_layouts():
    """``delta_norm``: Gemma 2/3's layout (the attention's output normed, added, the sum normed for
    the MLP) and OLMo 2's (normed and added, no norm after: ``weight`` None returns the sum twice) in
    one kernel; ``rms_norm``: a norm alone (the MLP's output). Each against ``llama_step.rms_norm``
    and a plain sum, in both roundings, for rows and for a strided view (OLMo 2's q of a stacked qkv);
    wrong widths refused."""
    out = _interpret("""
        import torch
        from nvkit.generate.fast.llama_step import rms_norm as ref_norm
        from nvkit.generate.kernels.add_rms_norm import add_rms_norm, rms_norm
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.float32):
            tol = dict(atol=1e-2, rtol=2e-3) if dtype == torch.float16 else dict(atol=1e-5, rtol=1e-5)
            for wf in (True, False):
                h, a = torch.randn(3, 1000, dtype=dtype), torch.randn(3, 1000, dtype=dtype) * 4
                post = (1.0 + torch.randn(1000) * 0.1) if wf else torch.randn(1000, dtype=dtype)
                pre = (1.0 + torch.randn(1000) * 0.1) if wf else torch.randn(1000, dtype=dtype)
                normed = ref_norm(a, post, 1e-6, wf)
                total, x = add_rms_norm(h, a, pre, 1e-5, wf, delta_norm=post, delta_eps=1e-6)
                assert torch.allclose(total.float(), (h + normed).float(), **tol), (total - (h + normed)).abs().max()
                assert torch.allclose(x.float(), ref_norm(h + normed, pre, 1e-5, wf).float(), **tol)
                total2, same = add_rms_norm(h, a, None, 0.0, wf, delta_norm=post, delta_eps=1e-6)
                assert same is total2 or torch.equal(same, total2)
                assert torch.equal(total2, total)
                alone = rms_norm(a, post, 1e-6, wf)
                assert alone.dtype == normed.dtype and torch.allclose(alone.float(), normed.float(), **tol)
                qkv = torch.randn(2, 96, dtype=dtype)
                q = qkv[:, :64]                                    # a view with the stacked row's stride
                assert torch.allclose(rms_norm(q, pre[:64], 1e-6, wf).float(), ref_norm(q, pre[:64], 1e-6, wf).float(),
                                      **tol)
        h = torch.randn(1, 64)
        from tests.triton_interpreter import refused
        refused(lambda: add_rms_norm(h, h, torch.ones(64), 1e-6, delta_norm=torch.ones(32)), "a wrong width")
        refused(lambda: rms_norm(h, torch.ones(32), 1e-6), "a wrong width")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 2, out
