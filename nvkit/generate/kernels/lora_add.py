"""An adapter's low-rank products added to a projection's output, in two Triton kernels, for the
decode steps that run without ``torch.compile``; ``linear`` is a projection with them.

Why: torch launches five kernels for ``y + (x A.T) B.T`` (the input's cast, two products, the sum,
the cast back), and at batch 1 every launch costs a few microseconds whatever its work. Here the
rank's dot products run side by side, one program each, then the second product with the sum.
The products round where torch's do (the input to the adapter's dtype, ``x A.T`` in it), so the
result matches the eager operations up to the order of the sums. The torch reference is in
tests/generate/kernels/test_lora_add.py.

With the adapter's A folded into the weight's spare rows (``lora.LoraSlots(fold=True)``: the
weight's rows, then A split into a high and a low half in the weight's dtype), ``folded_linear``
runs one matrix product over all of them with float32 output (cuBLAS, ``torch.mm(out_dtype=)``),
which gives the projection and x A.T at once, and one kernel that adds ``(x A.T) B.T``: two
launches per projection group where the products apart take three. It rounds where
``llama_step.linear``'s folded form does, the form the compiled steps run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import as_rows
from .launch import launch


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


def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``y + (x A.T) B.T`` in ``y``'s dtype, the products in the adapter's (``a``: (r, in),
    ``b``: (out, r), its scaling folded in), for rows of ``x`` (..., in) and ``y`` (..., out)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or x.shape[-1] != a.shape[1] \
            or y.shape[-1] != b.shape[0] or y.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"lora_add expects y (..., out), x (..., in), A (r, in) and B (out, r), not "
                         f"{tuple(y.shape)}, {tuple(x.shape)}, {tuple(a.shape)} and {tuple(b.shape)}")
    y2, x2 = as_rows(y), as_rows(x)
    a = a if a.stride(-1) == 1 else a.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    rows, n_out = y2.shape
    n_in, r = x2.shape[1], a.shape[0]
    t = torch.empty((rows, r), dtype=a.dtype, device=y.device)
    launch(_lora_down_kernel, (rows, r), x2, a, t, n_in, r, x2.stride(0), a.stride(0), t.stride(0),
           BK=min(1024, triton.next_power_of_2(n_in)))
    out = torch.empty((rows, n_out), dtype=y.dtype, device=y.device)
    bn = 128
    launch(_lora_up_add_kernel, (rows, triton.cdiv(n_out, bn)), y2, t, b, out, n_out, r, y2.stride(0), t.stride(0),
           b.stride(0), out.stride(0), R=max(16, triton.next_power_of_2(r)), BN=bn)
    return out.view(y.shape)


@triton.jit
def _folded_up_add_kernel(FULL, BIAS, B, OUT, n_out, r, stride_f, stride_b, stride_o,
                          HAS_BIAS: tl.constexpr, R: tl.constexpr, BN: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    rr = tl.arange(0, R)
    live = rr < r
    # x A.T: its high and low halves' products, summed in float32, in the adapter's dtype
    t = tl.load(FULL + row * stride_f + n_out + rr, mask=live, other=0.0) \
        + tl.load(FULL + row * stride_f + n_out + r + rr, mask=live, other=0.0)
    t = t.to(B.dtype.element_ty).to(tl.float32)
    ok = cols < n_out
    b = tl.load(B + cols[:, None] * stride_b + rr[None, :], mask=ok[:, None] & live[None, :], other=0.0).to(tl.float32)
    u = tl.sum(b * t[None, :], axis=1).to(B.dtype.element_ty).to(tl.float32)
    y = tl.load(FULL + row * stride_f + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        y += tl.load(BIAS + cols, mask=ok, other=0.0).to(tl.float32)
    y = y.to(OUT.dtype.element_ty).to(tl.float32)  # the projection in the model's dtype, as alone
    tl.store(OUT + row * stride_o + cols, (y + u).to(OUT.dtype.element_ty), mask=ok)


_fp32_products: dict[str, bool] = {}


def fp32_products(device: torch.device) -> bool:
    """Whether ``torch.mm`` gives float32 products of this device's half-precision matrices
    (``out_dtype``: CUDA, torch >= 2.8), tried once per device type; ``folded_linear`` needs it."""
    dev = torch.device(device)
    if dev.type not in _fp32_products:
        try:
            one = torch.ones(1, 16, dtype=torch.bfloat16, device=dev)
            _fp32_products[dev.type] = torch.mm(one, one.t(), out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _fp32_products[dev.type] = False
    return _fp32_products[dev.type]


def full_product(x2: torch.Tensor, stacked: torch.Tensor) -> torch.Tensor:
    """``x2 @ stacked.T`` in float32 from half-precision matrices: exact products, float32 sums
    (a float32 model's are float32 already; off CUDA, both cast to float32: for checks on a CPU)."""
    if x2.is_cuda and x2.dtype != torch.float32:
        return torch.mm(x2, stacked.t(), out_dtype=torch.float32)
    return torch.mm(x2.to(torch.float32), stacked.to(torch.float32).t())


def folded_linear(x: torch.Tensor, weight: torch.Tensor, bias, a: torch.Tensor, b: torch.Tensor,
                  stacked: torch.Tensor) -> torch.Tensor:
    """``llama_step.linear(x, weight, bias, (a, b, stacked))``: ``stacked`` holds ``weight``'s rows,
    then A's high and low halves (see the module docstring); (..., in) -> (..., out) in x's dtype."""
    n, r = weight.shape[0], a.shape[0]
    if stacked.shape != (n + 2 * r, weight.shape[1]) or b.shape != (n, r) or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"folded_linear expects x (..., in), weight (out, in), A (r, in), B (out, r) and the "
                         f"stacked (out + 2r, in), not {tuple(x.shape)}, {tuple(weight.shape)}, {tuple(a.shape)}, "
                         f"{tuple(b.shape)} and {tuple(stacked.shape)}")
    x2 = as_rows(x)
    full = full_product(x2, stacked)
    # R at least 64 (the ranks of a group of projections up to rank 16 each): one compile of the
    # kernel serves every group, where the first request after a fine-tune waits for each
    b = b if b.stride(-1) == 1 else b.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    bn = 128
    launch(_folded_up_add_kernel, (rows, triton.cdiv(n, bn)), full, bias if bias is not None else full, b, out, n, r,
           full.stride(0), b.stride(0), out.stride(0), HAS_BIAS=bias is not None,
           R=max(64, triton.next_power_of_2(r)), BN=bn)
    return out.view(*x.shape[:-1], n)


def linear(x: torch.Tensor, weight: torch.Tensor, bias, lora=None) -> torch.Tensor:
    """``llama_step.linear`` with an adapter's products (``lora`` = (A, B)) in ``lora_add``'s
    kernels; ``lora`` = (A, B, stacked), A folded into the weight's spare rows, in
    ``folded_linear``'s where the device gives float32 products (``fp32_products``)."""
    if lora is not None and len(lora) == 3 and fp32_products(x.device):
        return folded_linear(x, weight, bias, *lora)
    y = torch.nn.functional.linear(x, weight, bias)
    return y if lora is None else lora_add(y, x, lora[0], lora[1])
