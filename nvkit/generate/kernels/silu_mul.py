"""SiLU(gate) × up, or GELU(gate) × up (GELU's tanh form: the Gemma family), in one Triton kernel,
for the decode steps that run without ``torch.compile`` (why a kernel for so little work: at batch 1
a launch costs more than the work; see ``add_rms_norm``, which with this kernel does a layer's norms
and activation in four launches).

The kernel rounds where transformers' operations round (the activation's output to the input's
dtype before the product with ``up``). The torch reference is in tests/generate/kernels/test_silu_mul.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import as_rows
from .launch import launch


@triton.jit
def _silu_mul_kernel(GU, OUT, n, stride_gu, stride_o, BLOCK: tl.constexpr, GELU: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    g = tl.load(GU + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + n + cols, mask=ok, other=0.0).to(tl.float32)
    if GELU:  # 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), tanh as 1 - 2 / (e^2t + 1) on |t| (no overflow)
        t = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        th = 1.0 - 2.0 / (tl.exp(2.0 * tl.abs(t)) + 1.0)
        s = 0.5 * g * (1.0 + tl.where(t < 0, -th, th))
    else:
        s = g / (1.0 + tl.exp(-g))
    s = s.to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (s * u).to(OUT.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor, act: str = "silu") -> torch.Tensor:
    """The activation (``act``: "silu" or "gelu_tanh") of the first half of the last dimension
    times the second half."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul expects an even last dimension, not {gate_up.shape[-1]}")
    if act not in ("silu", "gelu_tanh"):
        raise ValueError(f"silu_mul's activation is 'silu' or 'gelu_tanh', not {act!r}")
    gu = as_rows(gate_up)
    rows, n = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    launch(_silu_mul_kernel, (rows, triton.cdiv(n, block)), gu, out, n, gu.stride(0), out.stride(0), BLOCK=block,
           GELU=act == "gelu_tanh")
    return out.view(*gate_up.shape[:-1], n)
