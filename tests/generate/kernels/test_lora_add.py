"""``nvkit.generate.kernels.lora_add`` (an adapter's low-rank products added to a projection) and
``linear`` (a projection with them) against the torch reference, run by Triton's interpreter on the
CPU (TRITON_INTERPRET=1 must be set before triton is imported: hence a child process)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def lora_add_reference(y, x, a, b):
    """``lora_add`` in torch's operations (``llama_step.linear``'s products apart)."""
    import torch.nn.functional as F
    return (y + F.linear(F.linear(x.to(a.dtype), a), b)).to(y.dtype)


def test_the_adapters_products_match_torch():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels.lora_add import linear, lora_add
        from tests.generate.kernels.test_lora_add import lora_add_reference
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.float32):
            # rank 48 (q, k and v of rank 16 stacked), the adapter in float32 or the model's dtype
            for adt in (torch.float32, dtype):
                x = torch.randn(2, 300, dtype=dtype)
                y = torch.randn(2, 1000, dtype=dtype)
                a, b = torch.randn(48, 300, dtype=adt) * 0.1, torch.randn(1000, 48, dtype=adt) * 0.1
                got, want = lora_add(y, x, a, b), lora_add_reference(y, x, a, b)
                assert got.dtype == dtype and got.shape == y.shape
                assert torch.allclose(got.float(), want.float(), atol=2e-3, rtol=2e-3), (got - want).abs().max()
            w = torch.randn(1000, 300, dtype=dtype) * 0.1
            assert torch.equal(linear(x, w, None), torch.nn.functional.linear(x, w))  # no adapter: the projection
            assert torch.equal(linear(x, w, None, (a, b)), lora_add(torch.nn.functional.linear(x, w), x, a, b))
        try:
            lora_add(torch.ones(1, 10), torch.ones(1, 8), torch.ones(4, 8), torch.ones(10, 3))
        except ValueError as e:
            print("refused:", e)
        else:
            raise AssertionError("a wrong shape was accepted")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 1, out
