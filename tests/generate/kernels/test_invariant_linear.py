"""``nvkit.generate.kernels.invariant_linear`` (the batch-invariant decode step's projection)
against torch's product, and each row's result against the same row computed alone, run by
Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set before triton is imported: hence a
child process). The GPU check, where cuBLAS would differ, is tests/gpu/test_batched_gpu.py's
alone-against-list test."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def test_every_row_is_computed_as_it_is_alone_and_matches_torch():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels import invariant_linear as il
        torch.manual_seed(0)
        # K not a multiple of the K loop's step, N not of the tile; a bias or none; several slices of K
        # one slice of K (the kernel writes the output itself) with a bias and without
        for n, k, bias, dtype in [(100, 300, True, torch.float32), (64, 1024, False, torch.float32),
                                  (96, 200, True, torch.float16), (80, 120, False, torch.float32)]:
            w = torch.randn(n, k, dtype=dtype) * 0.05
            b = torch.randn(n, dtype=dtype) if bias else None
            x = torch.randn(40, k, dtype=dtype)
            splits = il.splits_for(n, k, il._sm_count(x.device))
            full = il.invariant_linear(x, w, b)
            want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
            tol = 1e-4 if dtype == torch.float32 else 2e-2
            assert full.dtype == dtype and full.shape == (40, n), (full.dtype, full.shape)
            assert (full.float() - want).abs().max() <= tol, (n, k, (full.float() - want).abs().max())
            for rows in (1, 3, 16, 17):  # fewer rows than a tile, one tile, a tile and one more
                part = il.invariant_linear(x[:rows], w, b)
                assert torch.equal(part, full[:rows]), (n, k, rows, (part.float() - full[:rows].float()).abs().max())
            # rows beside it that hold other values change nothing either
            other = torch.cat([x[5:6], torch.randn(20, k, dtype=dtype) * 100])
            assert torch.equal(il.invariant_linear(other, w, b)[0], full[5])
            # any leading shape: (rows, length, k) as (rows * length, k)
            assert torch.equal(il.invariant_linear(x.view(4, 10, k), w, b).view(40, n), full)
            print(n, k, splits)
        assert il.splits_for(96, 200, 64) == 1 and il.splits_for(80, 120, 64) == 1 and il.splits_for(100, 300, 64) == 2
        assert il.splits_for(4096, 1024, 132) == 8 and il.splits_for(151936, 1024, 132) == 1
        assert il.splits_for(1024, 64, 132) == 1  # no slice shorter than two steps of the K loop
        from tests.triton_interpreter import refused
        for bad in [(torch.ones(2, 8), torch.ones(4, 9), None), (torch.ones(2, 8), torch.ones(4, 8), torch.ones(3)),
                    (torch.ones(2, 8), torch.ones(4, 8, dtype=torch.float16), None)]:
            refused(lambda: il.invariant_linear(*bad), f"{[None if t is None else tuple(t.shape) for t in bad]}")
        a, bb = torch.randn(8, 300) * 0.1, torch.randn(100, 8) * 0.1
        w = torch.randn(100, 300) * 0.05
        x = torch.randn(5, 300)
        from nvkit.generate.kernels.lora_add import lora_add
        assert torch.equal(il.linear(x, w, None, (a, bb)), lora_add(il.invariant_linear(x, w), x, a, bb))
        assert torch.equal(il.linear(x[:1], w, None, (a, bb)), il.linear(x, w, None, (a, bb))[:1])
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 3, out
