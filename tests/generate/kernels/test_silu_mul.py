"""``nvkit.generate.kernels.silu_mul`` (SiLU(gate) × up) against its torch reference, run by
Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set before triton is imported: hence a
child process), in float16 and float32 (bf16 is checked on the GPU: tests/gpu/test_fast_gpu.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def silu_mul_reference(gate_up):
    """``silu_mul`` in torch's operations (transformers' MLP activation)."""
    import torch
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def test_the_activation_matches_torch():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels.silu_mul import silu_mul
        from tests.generate.kernels.test_silu_mul import silu_mul_reference
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.float32):
            tol = 2e-3 if dtype == torch.float16 else 1e-5
            for shape in ((1, 1024), (3, 1000), (2, 2, 64), (1, 3000)):  # ...; wider than one block
                gu = torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)
                act = silu_mul(gu)
                assert act.shape == shape and act.dtype == dtype
                assert torch.allclose(act.float(), silu_mul_reference(gu).float(), atol=tol * 8, rtol=tol)
        from tests.triton_interpreter import refused
        refused(lambda: silu_mul(torch.ones(1, 7)), "an odd width")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 1, out


def test_the_gelu_tanh_activation_matches_torch():
    """``act="gelu_tanh"``: the Gemma family's GELU (torch's tanh approximation, what transformers'
    ``gelu_pytorch_tanh`` runs) times up, large inputs included (its tanh written so it cannot
    overflow); another activation is refused."""
    out = _interpret("""
        import torch
        from nvkit.generate.kernels.silu_mul import silu_mul
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.float32):
            tol = 2e-3 if dtype == torch.float16 else 1e-5
            gu = torch.cat([torch.randn(3, 2000, dtype=dtype), torch.full((1, 2000), 60.0, dtype=dtype),
                            torch.full((1, 2000), -60.0, dtype=dtype)])
            gate, up = gu.chunk(2, dim=-1)
            ref = torch.nn.functional.gelu(gate.float(), approximate="tanh").to(dtype).float() * up.float()
            act = silu_mul(gu, "gelu_tanh")
            assert act.dtype == dtype and torch.isfinite(act).all()
            assert torch.allclose(act.float(), ref, atol=tol * 8, rtol=tol), (act.float() - ref).abs().max()
            assert not torch.allclose(silu_mul(gu).float(), ref, atol=tol * 8, rtol=tol)
        from tests.triton_interpreter import refused
        refused(lambda: silu_mul(torch.ones(1, 8), "relu"), "an unknown activation")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 1, out
