"""Triton kernels for the decode steps that run without ``torch.compile``: the residual sum with
the RMSNorm after it, SiLU(gate) × up, and an adapter's low-rank products added to a projection.

Why: the uncompiled step launches each elementwise operation as a kernel of its own (the norm
alone is eight), and at batch 1 every launch costs a few microseconds whatever its work; inside
one CUDA graph these two kernels do a layer's norms and activation in four launches where eager
torch takes about twenty. The compiled step does not use them: inductor fuses the same operations
into its own kernels.

Each kernel rounds where transformers' operations round (the sum and the normalised row to the
input's dtype before the weight multiplies it; SiLU's output before the product with ``up``),
so the results match the eager operations up to the order of the sums. The adapter's products
(``lora_add``) are two kernels where torch launches five (the input's cast, two products, the sum,
the cast back): the rank's dot products, one program each, then the second product with the sum;
``linear`` is a projection with them. ``*_reference`` are the same in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(H, D, W, H_OUT, X_OUT, n, eps, stride_h, stride_d, stride_ho, stride_xo,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    h = tl.load(H + row * stride_h + cols, mask=ok, other=0.0).to(tl.float32)
    d = tl.load(D + row * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
    s = (h + d).to(H_OUT.dtype.element_ty)
    tl.store(H_OUT + row * stride_ho + cols, s, mask=ok)
    f = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(f * f, axis=0) / n + eps)
    y = (f * rstd).to(H_OUT.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(X_OUT + row * stride_xo + cols, (w * y).to(X_OUT.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(GU, OUT, n, stride_gu, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    g = tl.load(GU + row * stride_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_gu + n + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (s * u).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _lora_down_kernel(X, A, T, n_in, r, stride_x, stride_a, stride_t, BK: tl.constexpr):
    row = tl.program_id(0)
    j = tl.program_id(1)  # one row of A per program: the rank's dot products run side by side
    acc = tl.zeros((BK,), tl.float32)
    for k0 in range(0, n_in, BK):
        ks = k0 + tl.arange(0, BK)
        ok = ks < n_in
        xk = tl.load(X + row * stride_x + ks, mask=ok, other=0.0).to(A.dtype.element_ty).to(tl.float32)
        acc += xk * tl.load(A + j * stride_a + ks, mask=ok, other=0.0).to(tl.float32)
    tl.store(T + row * stride_t + j, tl.sum(acc, axis=0).to(A.dtype.element_ty))  # x A.T in the adapter's dtype


@triton.jit
def _lora_up_add_kernel(Y, T, B, OUT, n_out, r, stride_y, stride_t, stride_b, stride_o,
                        R: tl.constexpr, BN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    rr = tl.arange(0, R)
    t = tl.load(T + row * stride_t + rr, mask=rr < r, other=0.0).to(tl.float32)
    ok = cols < n_out
    b = tl.load(B + cols[:, None] * stride_b + rr[None, :], mask=ok[:, None] & (rr[None, :] < r),
                other=0.0).to(tl.float32)
    u = tl.sum(b * t[None, :], axis=1).to(B.dtype.element_ty).to(tl.float32)
    y = tl.load(Y + row * stride_y + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (y + u).to(OUT.dtype.element_ty), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(h + delta, rms_norm(h + delta) × weight) for rows of ``h`` (..., n)."""
    if h.shape != delta.shape or weight.shape != (h.shape[-1],):
        raise ValueError(f"add_rms_norm expects h and delta of one shape and a weight of ({h.shape[-1]},), "
                         f"not {tuple(h.shape)}, {tuple(delta.shape)} and {tuple(weight.shape)}")
    h2, d2 = _rows(h), _rows(delta)
    rows, n = h2.shape
    total = torch.empty((rows, n), dtype=h.dtype, device=h.device)
    out = torch.empty((rows, n), dtype=torch.result_type(weight, h), device=h.device)
    _add_rms_norm_kernel[(rows,)](h2, d2, weight, total, out, n, float(eps), h2.stride(0), d2.stride(0),
                                  total.stride(0), out.stride(0), BLOCK=triton.next_power_of_2(n))
    return total.view(h.shape), out.view(h.shape)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times the second half."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul expects an even last dimension, not {gate_up.shape[-1]}")
    gu = _rows(gate_up)
    rows, n = gu.shape[0], gu.shape[1] // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gu, out, n, gu.stride(0), out.stride(0), BLOCK=block)
    return out.view(*gate_up.shape[:-1], n)


def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``y + (x A.T) B.T`` in ``y``'s dtype, the products in the adapter's (``a``: (r, in),
    ``b``: (out, r), its scaling folded in), for rows of ``x`` (..., in) and ``y`` (..., out)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or x.shape[-1] != a.shape[1] \
            or y.shape[-1] != b.shape[0] or y.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"lora_add expects y (..., out), x (..., in), A (r, in) and B (out, r), not "
                         f"{tuple(y.shape)}, {tuple(x.shape)}, {tuple(a.shape)} and {tuple(b.shape)}")
    y2, x2 = _rows(y), _rows(x)
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    rows, n_out = y2.shape
    n_in, r = x2.shape[1], a.shape[0]
    t = torch.empty((rows, r), dtype=a.dtype, device=y.device)
    _lora_down_kernel[(rows, r)](x2, a, t, n_in, r, x2.stride(0), a.stride(0), t.stride(0),
                                 BK=min(1024, triton.next_power_of_2(n_in)))
    out = torch.empty((rows, n_out), dtype=y.dtype, device=y.device)
    bn = 128
    _lora_up_add_kernel[(rows, triton.cdiv(n_out, bn))](y2, t, b, out, n_out, r, y2.stride(0), t.stride(0),
                                                         b.stride(0), out.stride(0),
                                                         R=max(16, triton.next_power_of_2(r)), BN=bn)
    return out.view(y.shape)


def linear(x: torch.Tensor, weight: torch.Tensor, bias, lora=None) -> torch.Tensor:
    """``fused.linear`` with an adapter's products (``lora`` = (A, B)) in ``lora_add``'s kernels."""
    y = torch.nn.functional.linear(x, weight, bias)
    return y if lora is None else lora_add(y, x, lora[0], lora[1])


def lora_add_reference(y, x, a, b):
    """``lora_add`` in torch's operations (``fused.linear``'s products apart)."""
    import torch.nn.functional as F
    return (y + F.linear(F.linear(x.to(a.dtype), a), b)).to(y.dtype)


def add_rms_norm_reference(h, delta, weight, eps: float):
    """``add_rms_norm`` in torch's operations (transformers' RMSNorm after the sum)."""
    total = h + delta
    f = total.float()
    f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)
    return total, weight * f.to(h.dtype)


def silu_mul_reference(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
