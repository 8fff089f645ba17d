"""``nvkit.generate.kernels.gemv`` (one token's projection with the norm before it, the residual
sum after it, or the gated activation of a stacked gate/up weight) against its torch reference,
run by Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set before triton is imported:
hence a child process), in float32 and float16 (the interpreter rounds bfloat16 by truncation).
``python -m nvkit.benchmarks.gemv`` times it on a GPU against torch's operations."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def gemv_reference(x, weight, bias=None, norm=None, eps: float = 1e-6, weight_first: bool = False,
                   glu: bool = False, scale=None, residual=None, lora=None):
    """``gemv`` in the eager step's operations (``llama_step``'s norm, ``llama_step.linear`` with
    an adapter's products ``lora`` = (A, B) where given, SiLU × up, the branch multiplier, the
    residual sum), each rounding where it rounds."""
    import torch.nn.functional as F

    from nvkit.generate.fast.llama_step import linear, rms_norm
    x = x.reshape(1, -1)
    if norm is not None:
        x = rms_norm(x, norm, eps, weight_first)
    y = linear(x, weight, bias, lora)
    if glu:
        g, up = y.chunk(2, dim=-1)
        y = F.silu(g) * up
    if scale is not None:
        y = y * scale
    return y if residual is None else residual.reshape(1, -1) + y


def test_every_form_matches_the_eager_operations():
    """Each form alone and together, widths that are and are not multiples of the tiles, the
    automatic and explicit launches (a program's rows past N, a step's inputs past K)."""
    out = _interpret("""
        import itertools
        import torch
        from nvkit.generate.kernels.gemv import gemv
        from tests.generate.kernels.test_gemv import gemv_reference
        torch.manual_seed(0)
        checked = 0
        # every form in float32 at three widths, two launches each; float16's roundings at one width
        cases = [(torch.float32, nk, launches) for nk in ((64, 96), (40, 300), (7, 16))
                 for launches in ((dict(), dict(block_n=4, block_k=32)),)]
        cases.append((torch.float16, (40, 300), (dict(block_n=64, block_k=16, num_warps=2),)))
        for dtype, (n, k), launches in cases:
            for norm, glu, bias, scale, residual in itertools.product((False, True), repeat=5):
                rows = 2 * n if glu else n
                w = torch.randn(rows, k, dtype=dtype) / k ** 0.5
                x = torch.randn(k, dtype=dtype) * 2
                kw = dict(bias=torch.randn(rows, dtype=dtype) if bias else None,
                          norm=torch.rand(k, dtype=dtype) + 0.5 if norm else None, glu=glu,
                          scale=0.25 if scale else None, residual=torch.randn(1, n, dtype=dtype) if residual else None)
                ref = gemv_reference(x, w, **kw)
                for launch in launches:
                    got = gemv(x, w, **kw, **launch)
                    tol = 1e-4 if dtype == torch.float32 else 4e-3
                    assert got.shape == (1, n) and got.dtype == dtype, (got.shape, got.dtype)
                    err = (got.float() - ref.float()).abs().max().item()
                    assert err <= tol * (1 + ref.float().abs().max().item()), (dtype, n, k, kw.keys(), launch, err)
                    checked += 1
        # Gemma's and OLMo 2's rounding: the norm weight in float32, multiplied before rounding
        w, x = torch.randn(32, 64) / 8, torch.randn(64)
        nw = 1.0 + torch.randn(64) * 0.1
        assert torch.allclose(gemv(x, w, norm=nw, weight_first=True),
                              gemv_reference(x, w, norm=nw, weight_first=True), atol=1e-5)
        print("ok", checked)
    """)
    assert out.strip() == "ok 224", out


def test_wrong_inputs_and_launches_are_refused():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels.gemv import gemv
        from tests.triton_interpreter import refused
        w, x = torch.randn(8, 16), torch.randn(16)
        for call in (lambda: gemv(torch.randn(15), w), lambda: gemv(torch.randn(2, 16), w),
                     lambda: gemv(x, torch.randn(8, 16).t()), lambda: gemv(x, torch.randn(7, 16), glu=True),
                     lambda: gemv(x, w, torch.randn(7)), lambda: gemv(x, w, norm=torch.randn(8)),
                     lambda: gemv(x, w, residual=torch.randn(1, 4)), lambda: gemv(x, w.half()),
                     lambda: gemv(x.double(), w), lambda: gemv(x, w, residual=torch.randn(1, 8).half()),
                     lambda: gemv(x, w, lora=torch.randn(4)), lambda: gemv(x, w, lora=(torch.randn(4),)),
                     lambda: gemv(x, w, lora=(torch.randn(4), torch.randn(7, 4))),
                     lambda: gemv(x, w, lora=(torch.randn(3), torch.randn(8, 4))),
                     lambda: gemv(x, w, lora=(torch.randn(2, 4), torch.randn(8, 4))),
                     lambda: gemv(x, w, block_n=3), lambda: gemv(x, w, block_k=0), lambda: gemv(x, w, num_stages=9),
                     lambda: gemv(x, w, pdl="yes"), lambda: gemv(x, w, pdl=True)):
            refused(call)
        assert torch.allclose(gemv(x, w), (w @ x).view(1, -1), atol=1e-5)  # usable after every refusal
        print("ok")
    """)
    assert out.count("refused:") == 20 and out.strip().endswith("ok"), out
    assert "pdl must be True or False" in out and "compute capability 9.0" in out  # a CPU has no PDL


def test_an_unmerged_adapter_is_added_as_the_eager_step_adds_it():
    """``lora=(t, B)``: t = x A.T from ``gemv`` itself (A float32 over an fp16 stream, as PEFT keeps
    adapters, its norm rounded as the stream's), then the base product with B's product added
    before the activation, the multiplier and the residual sum; ranks that are and are not
    powers of two, the gate's and up's rows of B stacked as the weight's."""
    out = _interpret("""
        import itertools
        import torch
        from nvkit.generate.kernels.gemv import gemv
        from tests.generate.kernels.test_gemv import gemv_reference
        torch.manual_seed(1)
        checked = 0
        for dtype, adapter, (n, k), rank in ((torch.float32, torch.float32, (40, 96), 8),
                                             (torch.float16, torch.float32, (24, 64), 5),
                                             (torch.float16, torch.float16, (24, 64), 16)):
            for norm, glu, bias, scale, residual in itertools.product((False, True), repeat=5):
                rows = 2 * n if glu else n
                w = torch.randn(rows, k, dtype=dtype) / k ** 0.5
                x = torch.randn(k, dtype=dtype) * 2
                a = (torch.randn(rank, k) / k ** 0.5).to(adapter)
                b = (torch.randn(rows, rank) * 0.5).to(adapter)
                kw = dict(bias=torch.randn(rows, dtype=dtype) if bias else None, glu=glu,
                          scale=0.25 if scale else None, residual=torch.randn(1, n, dtype=dtype) if residual else None)
                nw = torch.rand(k, dtype=dtype) + 0.5 if norm else None
                t = gemv(x, a, norm=nw)
                assert t.shape == (1, rank) and t.dtype == adapter
                got = gemv(x, w, norm=nw, lora=(t, b), **kw)
                ref = gemv_reference(x, w, norm=nw, lora=(a, b), **kw)
                assert got.shape == (1, n) and got.dtype == dtype
                tol = 1e-4 if dtype == torch.float32 else 4e-3
                err = (got.float() - ref.float()).abs().max().item()
                assert err <= tol * (1 + ref.float().abs().max().item()), (dtype, adapter, rank, norm, glu, err)
                checked += 1
        print("ok", checked)
    """)
    assert out.strip() == "ok 96", out


def test_the_launch_gives_several_programs_per_sm_within_the_tile():
    from nvkit.generate.kernels.gemv import K_STEP, PROGRAMS_PER_SM, TILE, gemv_launch
    for n, k, sms in ((1024, 2048, 132), (4096, 1024, 132), (2560, 9728, 132), (151936, 1024, 132), (7, 16, 132),
                      (64, 40, 1)):
        bn, bk, warps = gemv_launch(n, k, sms)
        assert warps in (4, 8) and bn & (bn - 1) == 0 and bk & (bk - 1) == 0 and bn * bk <= TILE
        assert 16 <= bk <= K_STEP and (bk >= k or bk == K_STEP) and 1 <= bn <= 32
        # about PROGRAMS_PER_SM programs per SM where the rows allow: never fewer, under twice as many
        programs = -(-n // bn)
        assert bn == 1 or programs >= PROGRAMS_PER_SM * sms, (n, k, bn)
        assert bn == 32 or programs < 2 * PROGRAMS_PER_SM * sms or bn * bk == TILE or n < PROGRAMS_PER_SM * sms
    # the Qwen3-4B layer's forms as the fit table picked them (docs/benchmarks.md)
    assert [gemv_launch(n, k, 132) for n, k in ((6144, 2560), (2560, 4096), (9728, 2560), (2560, 9728))] == \
        [(4, 1024, 4), (2, 1024, 4), (8, 1024, 4), (2, 1024, 4)]
    assert gemv_launch(151936, 1024, 132) == (16, 1024, 4)  # the LM head: the tile's limit
    assert gemv_launch(4096, 1024, 132, cap=512, per_sm=1, wide=4096) == (16, 512, 8)
