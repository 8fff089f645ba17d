"""The residual sum with the RMSNorm after it, in one Triton kernel, for the decode steps that run
without ``torch.compile`` (``llama_step``'s and ``llama_rows_step``' steps with ``kernels=True``).

Why: the uncompiled step launches each elementwise operation as a kernel of its own (the norm
alone is eight), and at batch 1 every launch costs a few microseconds whatever its work; inside
one CUDA graph this kernel and ``silu_mul`` do a layer's norms and activation in four launches
where eager torch takes about twenty. The compiled step does not use them: inductor fuses the same
operations into its own kernels.

The kernel rounds where transformers' operations round (the sum, and the normalised row to the
input's dtype before the weight multiplies it: Llama's norm; or after, ``weight_first``: OLMo 2's
and the Gemma family's, whose float32 1 + w the steps hand in as the weight), so the result matches
the eager operations up to the order of the sums. The torch reference is in tests/generate/kernels/test_add_rms_norm.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import as_rows


@triton.jit
def _add_rms_norm_kernel(H, D, W, H_OUT, X_OUT, n, eps, stride_h, stride_d, stride_ho, stride_xo,
                         BLOCK: tl.constexpr, WEIGHT_FIRST: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    h = tl.load(H + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
    d = tl.load(D + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
    s = (h + d).to(H_OUT.dtype.element_ty)
    tl.store(H_OUT + row * stride_ho + cols, s, mask=ok)
    f = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(f * f, axis=0) / n + eps)
    y = f * rstd
    if not WEIGHT_FIRST:
        y = y.to(H_OUT.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(X_OUT + row * stride_xo + cols, (w * y).to(X_OUT.dtype.element_ty), mask=ok)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, weight_first: bool = False):
    """(h + delta, rms_norm(h + delta) × weight) for rows of ``h`` (..., n); ``weight_first``: the
    product in float32 and the result in ``h``'s dtype (``llama_step.rms_norm``'s two roundings)."""
    if h.shape != delta.shape or weight.shape != (h.shape[-1],):
        raise ValueError(f"add_rms_norm expects h and delta of one shape and a weight of ({h.shape[-1]},), "
                         f"not {tuple(h.shape)}, {tuple(delta.shape)} and {tuple(weight.shape)}")
    h2, d2 = as_rows(h), as_rows(delta)
    rows, n = h2.shape
    total = torch.empty((rows, n), dtype=h.dtype, device=h.device)
    out = torch.empty((rows, n), dtype=h.dtype if weight_first else torch.result_type(weight, h), device=h.device)
    _add_rms_norm_kernel[(rows,)](h2, d2, weight, total, out, n, float(eps), h2.stride(0), d2.stride(0),
                                  total.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(n),
                                  WEIGHT_FIRST=bool(weight_first))
    return total.view(h.shape), out.view(h.shape)
