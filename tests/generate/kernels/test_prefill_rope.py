"""``nvkit.generate.kernels.prefill_rope`` (the rows prefill's q/k norms, RoPE and KV pool writes in
one launch) against its torch reference, run by Triton's interpreter on the CPU (a child process:
TRITON_INTERPRET=1 must be set before triton is imported); bf16 on the GPU runs inside the families'
list tests (tests/gpu/test_families_gpu.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def prefill_rope_reference(*args):
    """``prefill_rope`` in torch's operations: the eager rows prefill's own
    (``llama_rows_step.prefill_heads``), its norms multiplied by the weight in float32 and rounded
    after, as the kernel rounds."""
    from nvkit.generate.fast.llama_rows_step import prefill_heads
    return prefill_heads(*args, weight_first=True)


def test_the_heads_and_the_pool_match_torch():
    """Float32, 3 rows of 11 positions whose slots are scattered in a pool (the padded positions of
    shorter prompts all in one scratch slot, whose contents are never read): grouped heads with and
    without per-head norms, full and partial rotary tables (Phi-3's), tables in float32 or the
    model's dtype (float16), and heads of 64, 128 and 96 (Phi-4-mini's: not a power of two, its lanes
    padded to 128, with its partial table of 72 and a full one); then the refusals."""
    out = _interpret("""
        import torch
        from nvkit.generate.kernels.prefill_rope import fits, prefill_rope
        from tests.generate.kernels.test_prefill_rope import prefill_rope_reference
        from tests.triton_interpreter import refused
        g = torch.Generator().manual_seed(0)
        rows, length, scratch = 3, 11, 0
        lens = (11, 4, 7)
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
            for nh, nkv, hd, rot, norm in ((4, 2, 64, 64, True), (4, 4, 64, 32, False), (2, 1, 128, 128, False),
                                           (6, 2, 64, 48, True), (4, 2, 96, 72, False), (2, 2, 96, 96, False)):
                width = (nh + 2 * nkv) * hd
                qkv = torch.randn(rows, length, width, generator=g).to(dtype)
                qn = (1 + 0.1 * torch.randn(hd, generator=g)).to(dtype) if norm else None
                kn = (1 + 0.1 * torch.randn(hd, generator=g)).to(dtype) if norm else None
                angle = torch.arange(length)[:, None] * torch.rand(rot // 2, generator=g)[None, :]
                angle = torch.cat((angle, angle), dim=-1)
                tdtype = torch.float32 if rot == 32 else dtype
                cos, sin = angle.cos().to(tdtype).view(1, length, 1, rot), angle.sin().to(tdtype).view(1, length, 1, rot)
                slots = (torch.randperm(60, generator=g)[:rows * length] + 1).view(rows, length)
                for r, n in enumerate(lens):
                    slots[r, n:] = scratch
                flat = slots.reshape(-1)
                pools = [torch.zeros(64, nkv, hd, dtype=dtype) for _ in range(4)]
                ref = prefill_rope_reference(qkv, qn, kn, cos, sin, flat, pools[0], pools[1], 1e-6, nh, nkv, hd)
                assert fits(hd, qn)
                got = prefill_rope(qkv, qn, kn, cos, sin, flat, pools[2], pools[3], 1e-6, nh, nkv, hd)
                for a, b in zip(got, ref):
                    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape)
                    assert torch.allclose(a.float(), b.float(), atol=tol * 8, rtol=tol), (nh, nkv, hd, rot, norm, dtype)
                read = flat[flat != scratch]
                for a, b in ((pools[2], pools[0]), (pools[3], pools[1])):
                    assert torch.allclose(a[read].float(), b[read].float(), atol=tol * 8, rtol=tol)
                    untouched = torch.ones(64, dtype=torch.bool)
                    untouched[flat] = False
                    assert not a[untouched].any()  # nothing written outside the tokens' slots
                print(dtype, nh, nkv, hd, rot, norm, "ok")
        ones = torch.ones(1, 4, 4 * 48)
        tables = torch.ones(4, 48), torch.zeros(4, 48)
        pool = torch.zeros(8, 1, 48)
        # per-head norms on a head that is not a power of two; norms over all heads; an odd head
        assert fits(48, None) and not fits(48, torch.ones(48)) and not fits(64, torch.ones(128)) and not fits(47, None)
        refused(lambda: prefill_rope(ones, torch.ones(48), torch.ones(48), *tables, torch.arange(4), pool, pool, 1e-6,
                                     2, 1, 48), "per-head norms on a head of 48")
        ones = torch.ones(1, 4, 4 * 64)
        pool = torch.zeros(8, 1, 64)
        refused(lambda: prefill_rope(ones, torch.ones(64), None, torch.ones(4, 64), torch.zeros(4, 64),
                                     torch.arange(4), pool, pool, 1e-6, 2, 1, 64), "a q norm without a k norm")
        refused(lambda: prefill_rope(ones, None, None, torch.ones(3, 64), torch.zeros(3, 64), torch.arange(4), pool,
                                     pool, 1e-6, 2, 1, 64), "tables shorter than the prompts")
        across = torch.zeros(8, 1, 128)[..., ::2]  # (slots, 1, 64), a head's values two apart
        refused(lambda: prefill_rope(ones, None, None, torch.ones(4, 64), torch.zeros(4, 64), torch.arange(4), across,
                                     pool, 1e-6, 2, 1, 64), "a pool whose head values are not side by side")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count(" ok") == 12 and out.count("refused:") == 4, out
