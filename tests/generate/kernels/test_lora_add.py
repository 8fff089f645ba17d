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
        from tests.triton_interpreter import refused
        refused(lambda: lora_add(torch.ones(1, 10), torch.ones(1, 8), torch.ones(4, 8), torch.ones(10, 3)))
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 1, out


def test_the_folded_products_match_the_steps_folded_form():
    """``folded_linear`` (A folded into the weight's spare rows: one float32 product, one kernel)
    against ``llama_step.linear``'s folded form, the one the compiled steps run: with and without a
    bias, an adapter in float32 or the model's dtype, one row and several; on a device without
    float32 products ``linear`` keeps the products apart."""
    out = _interpret("""
        import torch
        from nvkit.generate.fast import llama_step
        from nvkit.generate.kernels.lora_add import folded_linear, fp32_products, linear, lora_add
        torch.manual_seed(0)
        assert not fp32_products(torch.device("cpu"))  # CUDA's out_dtype products only
        for dtype in (torch.float16, torch.float32):
            for adt in (torch.float32, dtype):
                for rows, with_bias in ((1, False), (3, True)):
                    x = torch.randn(rows, 300, dtype=dtype)
                    w = torch.randn(1000, 300, dtype=dtype) * 0.1
                    bias = torch.randn(1000, dtype=dtype) if with_bias else None
                    a, b = torch.randn(48, 300, dtype=adt) * 0.1, torch.randn(1000, 48, dtype=adt) * 0.1
                    high = a.to(dtype)
                    stacked = torch.cat([w, high, (a.float() - high.float()).to(dtype)])
                    got = folded_linear(x, w, bias, a, b, stacked)
                    want = llama_step.linear(x, w, bias, (a, b, stacked))
                    assert got.dtype == dtype and got.shape == (rows, 1000)
                    assert torch.allclose(got.float(), want.float(), atol=2e-3, rtol=2e-3), (got - want).abs().max()
                    if dtype == torch.float16:  # the same roundings: only the float32 sums' order differs
                        assert (got != want).float().mean() <= 0.02, (got != want).float().mean()
                    else:
                        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
                    apart = lora_add(torch.nn.functional.linear(x, w, bias), x, a, b)
                    assert torch.equal(linear(x, w, bias, (a, b, stacked)), apart)  # no float32 products here
        # the adapter's products alone (a zero weight), large: x A.T to A's float32 precision
        x = torch.randn(2, 300, dtype=torch.float16)
        w = torch.zeros(1000, 300, dtype=torch.float16)
        a, b = torch.randn(48, 300) * 0.1, torch.randn(1000, 48) * 10
        high = a.to(torch.float16)
        stacked = torch.cat([w, high, (a - high.float()).to(torch.float16)])
        got, want = folded_linear(x, w, None, a, b, stacked), llama_step.linear(x, w, None, (a, b, stacked))
        assert (got != want).float().mean() <= 0.02, (got != want).float().mean()
        from tests.triton_interpreter import refused
        refused(lambda: folded_linear(x, w, None, a, b, stacked[:-1]))
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 1, out
