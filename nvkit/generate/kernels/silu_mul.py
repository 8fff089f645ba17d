"""SiLU(gate) × up in one Triton kernel, for the decode steps that run without ``torch.compile``
(why a kernel for so little work: at batch 1 a launch costs more than the work; see
``add_rms_norm``, which with this kernel does a layer's norms and activation in four launches).

The kernel rounds where transformers' operations round (SiLU's output to the input's dtype before
the product with ``up``). The torch reference is in tests/generate/kernels/test_silu_mul.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import as_rows


@triton.jit
def _silu_mul_kernel(GU, OUT, n, stride_gu, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    g = tl.load(GU + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + n + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (s * u).to(OUT.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times the second half."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul expects an even last dimension, not {gate_up.shape[-1]}")
    gu = as_rows(gate_up)
    rows, n = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gu, out, n, gu.stride(0), out.stride(0), BLOCK=block)
    return out.view(*gate_up.shape[:-1], n)
