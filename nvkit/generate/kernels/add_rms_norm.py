"""The residual sum with the RMSNorm after it, in one Triton kernel, for the decode steps that run
without ``torch.compile`` (``llama_step``'s and ``llama_rows_step``' steps with ``kernels=True``).

Why: the uncompiled step launches each elementwise operation as a kernel of its own (the norm
alone is eight), and at batch 1 every launch costs a few microseconds whatever its work; inside
one CUDA graph this kernel and ``silu_mul`` do a layer's norms and activation in four launches
where eager torch takes about twenty. The compiled step does not use them: inductor fuses the same
operations into its own kernels.

The same kernel takes the layouts with norms after the branches: Gemma 2/3 norm the attention's
output before the sum (``delta_norm``: that norm, the sum and the MLP's input norm in one launch)
and their MLP's output (``rms_norm``: a norm alone); OLMo 2 norms both branches' outputs and its q
and k over all heads. In eager torch each of those norms is eight more launches a layer.

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
from .launch import launch


@triton.jit
def _add_rms_norm_kernel(H, D, W, DW, H_OUT, X_OUT, n, eps, d_eps, stride_h, stride_d, stride_ho, stride_xo,
                         BLOCK: tl.constexpr, WEIGHT_FIRST: tl.constexpr, HAS_H: tl.constexpr,
                         NORM_D: tl.constexpr, HAS_W: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    d = tl.load(D + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
    if NORM_D:  # delta normed before the sum (a post-branch norm), rounded as the branch's output is
        yd = d * tl.rsqrt(tl.sum(d * d, axis=0) / n + d_eps)
        if not WEIGHT_FIRST:
            yd = yd.to(D.dtype.element_ty).to(tl.float32)
        dw = tl.load(DW + cols, mask=ok, other=0.0).to(tl.float32)
        d = (dw * yd).to(D.dtype.element_ty).to(tl.float32)
    if HAS_H:
        h = tl.load(H + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
        s = (h + d).to(H_OUT.dtype.element_ty)
        tl.store(H_OUT + row * stride_ho + cols, s, mask=ok)
    else:
        s = d.to(H_OUT.dtype.element_ty)
    if HAS_W:
        f = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(f * f, axis=0) / n + eps)
        y = f * rstd
        if not WEIGHT_FIRST:
            y = y.to(H_OUT.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(X_OUT + row * stride_xo + cols, (w * y).to(X_OUT.dtype.element_ty), mask=ok)


def _norm_dtype(x: torch.Tensor, weight: torch.Tensor, weight_first: bool):
    # llama_step.rms_norm's result: the input's dtype (weight_first), else torch's promotion of the
    # weight and the rounded row
    return x.dtype if weight_first else torch.result_type(weight, x)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor | None, eps: float,
                 weight_first: bool = False, delta_norm: torch.Tensor | None = None, delta_eps: float = 0.0):
    """(h + delta, rms_norm(h + delta) × weight) for rows of ``h`` (..., n); ``weight_first``: the
    product in float32 and the result in ``h``'s dtype (``llama_step.rms_norm``'s two roundings).

    ``delta_norm``: ``delta`` is first normed with this weight and ``delta_eps`` (rounded to
    ``delta``'s dtype, as the norm module's output is): the norm after a branch that Gemma 2/3 and
    OLMo 2 apply before the residual sum. ``weight`` None: no norm after the sum, and the sum is
    returned twice (OLMo 2's MLP reads the sum itself)."""
    if h.shape != delta.shape or (weight is not None and weight.shape != (h.shape[-1],)) \
            or (delta_norm is not None and delta_norm.shape != (h.shape[-1],)):
        widths = tuple(w.shape for w in (weight, delta_norm) if w is not None)
        raise ValueError(f"add_rms_norm expects h and delta of one shape and weights of ({h.shape[-1]},), "
                         f"not {tuple(h.shape)}, {tuple(delta.shape)} and {widths}")
    h2, d2 = as_rows(h), as_rows(delta)
    rows, n = h2.shape
    total = torch.empty((rows, n), dtype=h.dtype, device=h.device)
    out = total if weight is None else torch.empty((rows, n), dtype=_norm_dtype(h, weight, weight_first),
                                                   device=h.device)
    launch(_add_rms_norm_kernel, (rows,), h2, d2, total if weight is None else weight,
           total if delta_norm is None else delta_norm, total, out, n, float(eps), float(delta_eps), h2.stride(0),
           d2.stride(0), total.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(n),
           WEIGHT_FIRST=bool(weight_first), HAS_H=True, NORM_D=delta_norm is not None, HAS_W=weight is not None)
    return total.view(h.shape), out.view(h.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_first: bool = False) -> torch.Tensor:
    """``llama_step.rms_norm`` of rows of ``x`` (..., n) in one kernel (eager torch takes eight):
    the norm after a branch that is not summed at once (the MLP's output in Gemma 2/3 and OLMo 2,
    OLMo 2's q and k over all heads)."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm expects a weight of ({x.shape[-1]},), not {tuple(weight.shape)}")
    x2 = as_rows(x)
    rows, n = x2.shape
    out = torch.empty((rows, n), dtype=_norm_dtype(x, weight, weight_first), device=x.device)
    # x itself stands in for the unused sum (never written: HAS_H) and gives the rounding dtype
    launch(_add_rms_norm_kernel, (rows,), x2, x2, weight, weight, x2, out, n, float(eps), 0.0, x2.stride(0),
           x2.stride(0), x2.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(n),
           WEIGHT_FIRST=bool(weight_first), HAS_H=False, NORM_D=False, HAS_W=True)
    return out.view(x.shape)
