"""A projection ``x @ weight.T + bias`` whose every output row is computed the same way whatever
the number of rows: the matrix product of the batch-invariant decode step (``deterministic=True``).

Why: cuBLAS picks its kernel, its tiles and its split of the K dimension from the problem's shape,
so one row's result changes, in its last bits, with the number of rows beside it; a greedy
decode that meets a near tie then takes another token, and a prompt's text differs alone and in
a list. Here the launch depends on the weight's shape (N, K) and the GPU alone: fixed tiles
(``BM`` × ``BN``, ``BK`` per step of the K loop), and a fixed number of K slices, each summed in
order, then the slices summed in order by a second kernel. A row's arithmetic is then the same in
a list of one and of 256; only how many tiles run beside it changes.

The K slices are what keeps a single row fast: one row reads the whole weight and does almost no
arithmetic, so the weight's N tiles alone would leave most SMs idle; ``splits`` slices of K give
about two programs per SM at one row. The torch reference is in
tests/generate/kernels/test_invariant_linear.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import as_rows, device_sms, next_pow2
from .launch import launch

BM, BN, BK = 16, 64, 64       # tl.dot's smallest M tile: a decode step's rows are few
NUM_WARPS, NUM_STAGES = 4, 3
MAX_SPLITS = 32


def _sm_count(device) -> int:
    return device_sms(device, 64)  # Triton's interpreter: any figure (the splits depend on it, never on the rows)


def splits_for(n: int, k: int, sms: int) -> int:
    """Slices of K for a (n, k) weight: about two programs per SM at one row, a power of two, each
    slice at least two steps of the K loop. Depends on the weight's shape and the GPU only."""
    tiles = -(-n // BN)
    want = next_pow2(max(1, -(-2 * sms // tiles)))
    most = max(1, k // (2 * BK))
    return max(1, min(want, MAX_SPLITS, next_pow2(most + 1) // 2))


# the row count is not specialised on (Triton compiles a variant for a count of 1 or a multiple of
# 16): one compiled kernel serves every row count, the same code whatever rows run beside a row
@triton.jit(do_not_specialize=["M"])
def _partial_kernel(X, W, P, B, M, N, K, k_per_split, stride_xm, stride_wn, stride_ps, stride_pm,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr,
                    WHOLE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """One (BM × BN) tile of one K slice, summed over the slice's BK steps in order. ``WHOLE`` (one
    slice: a weight whose N tiles alone fill the GPU, the LM head's) writes the output itself, the
    bias added and rounded once, as ``_sum_kernel`` does with one slice."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    s = tl.program_id(2)
    acc = tl.zeros((BM, BN), tl.float32)
    start = s * k_per_split
    for k0 in range(start, start + k_per_split, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(W + rn[:, None] * stride_wn + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        if IEEE:  # fp32 weights: no TF32 rounding, as torch's fp32 products
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    if WHOLE:
        if HAS_BIAS:
            acc += tl.load(B + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(P + rm[:, None] * stride_pm + rn[None, :], acc.to(P.dtype.element_ty), mask=ok)
    else:
        tl.store(P + s * stride_ps + rm[:, None] * stride_pm + rn[None, :], acc, mask=ok)


@triton.jit(do_not_specialize=["M"])
def _sum_kernel(P, B, OUT, M, N, splits, stride_ps, stride_pm, stride_om, HAS_BIAS: tl.constexpr, BN: tl.constexpr):
    """A row's slices summed in order (slice 0 first), the bias added, rounded once."""
    row = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = rn < N
    acc = tl.zeros((BN,), tl.float32)
    for s in range(0, splits):
        acc += tl.load(P + s * stride_ps + row * stride_pm + rn, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_om + rn, acc.to(OUT.dtype.element_ty), mask=ok)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` (..., K) and ``weight`` (N, K) in ``x``'s dtype, each row
    computed as it would be alone (see the module docstring)."""
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1] or (bias is not None and tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"invariant_linear expects x (..., K), weight (N, K) and bias (N,) or None, not "
                         f"{tuple(x.shape)}, {tuple(weight.shape)} and {None if bias is None else tuple(bias.shape)}")
    if x.dtype != weight.dtype:
        raise ValueError(f"invariant_linear expects x and weight in one dtype, not {x.dtype} and {weight.dtype}")
    x2 = as_rows(x)
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m, k = x2.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*x.shape[:-1], n)
    splits = splits_for(n, k, _sm_count(x.device))
    k_per_split = -(-k // (splits * BK)) * BK
    whole = splits == 1
    partial = out.view(1, m, n) if whole else torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    b = bias if bias is not None else partial
    tuning = dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES) if x.is_cuda else {}
    launch(_partial_kernel, (triton.cdiv(m, BM), triton.cdiv(n, BN), splits),
           x2, w, partial, b, m, n, k, k_per_split, x2.stride(0), w.stride(0), partial.stride(0), partial.stride(1),
           BM=BM, BN=BN, BK=BK, IEEE=x.dtype == torch.float32, WHOLE=whole, HAS_BIAS=bias is not None, **tuning)
    if not whole:
        launch(_sum_kernel, (m, triton.cdiv(n, 256)), partial, b, out, m, n, splits, partial.stride(0),
               partial.stride(1), out.stride(0), HAS_BIAS=bias is not None, BN=256)
    return out.view(*x.shape[:-1], n)


def linear(x: torch.Tensor, weight: torch.Tensor, bias, lora=None) -> torch.Tensor:
    """``llama_step.linear`` with the product in ``invariant_linear`` and an adapter's products
    (``lora`` = (A, B)) in ``lora_add``'s kernels, which compute each row on its own already."""
    y = invariant_linear(x, weight, bias)
    if lora is None:
        return y
    from .lora_add import lora_add
    return lora_add(y, x, lora[0], lora[1])
