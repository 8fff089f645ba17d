"""One token's projection with what surrounds it in a decoder layer, in one Triton kernel: the
matrix-vector product of a batch-1 decode step (``gemv``), optionally with the RMSNorm before it,
the residual sum after it, or the gated activation of a stacked gate/up weight.

Why: at batch 1 a decoder layer reads its weights once and does little else, so its time is the
weights' bytes over the bandwidth plus each kernel's launch and ramp, in which few bytes stream.
The uncompiled step runs a Llama-layout layer as nine kernels (the sum and norm, the q/k/v product,
the attention's two, the o-product, the sum and norm, the gate/up product, the activation, the
down product); with these forms it is six: the q/k/v product with the norm in front (``norm``), the
attention, the o-product with the residual sum behind it (``residual``), the gate/up product with
the norm in front and the activation behind (``norm`` and ``glu``), the down product with the sum
(``residual``).

How: each program computes ``BLOCK_N`` outputs over the whole input, in steps of ``BLOCK_K``. A
norm in front costs each program a first pass over the input row (a few kilobytes, from cache) for
its mean square; every product then reads the row normed and rounded as ``llama_step.rms_norm``
rounds it, so the result is the eager operations' up to the order of the sums. The rows a program
computes are whole (no split of the input), so the sum and the activation are the program's own
epilogue; the launch (``gemv_launch``) picks rows per program for several programs per SM.

Rounding as the eager step rounds: the product (and its bias) in float32, rounded to the weight's
dtype; the activation (SiLU) in float32 of the rounded gate, rounded, times the rounded up,
rounded; a branch multiplier (Granite's) on the rounded product, rounded; the residual sum,
rounded. With ``pdl`` each kernel loads its first weights before it waits for the kernel before
it (Programmatic Dependent Launch), so in a chain of them the weights of one stream while the one
before it ends. The torch reference is in tests/generate/kernels/test_gemv.py;
``python -m nvkit.benchmarks.gemv`` times the forms against torch's operations and cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import device_sms, gdc_launch_dependents, gdc_wait, launch_why, next_pow2, pdl_why
from .launch import launch

#: the most weight elements one program holds per step of its loop (BLOCK_N × BLOCK_K)
TILE = 16384
#: the automatic launch (``gemv_launch``): at most this many inputs per step, rows per program for
#: about ``PROGRAMS_PER_SM`` programs per SM, 8 warps only for tiles of more than ``WIDE_TILE``
#: weights (4 below). Fitted to ``python -m nvkit.benchmarks.gemv --every`` (its ``fit``; the
#: figures in docs/benchmarks.md): many small programs streaming a few kilobytes per step each
#: kept more bytes in flight than one wide program per SM. ``LONG_K_STEP``: the step's cap for
#: inputs of ``LONG_K`` or more (an o or down projection of a wide model), fitted apart because
#: there the loop has more steps than the pipeline has stages.
K_STEP, PROGRAMS_PER_SM, WIDE_TILE, LONG_K, LONG_K_STEP = 1024, 8, 1 << 30, 4096, 1024


def sm_count(device) -> int:
    """The SM count ``gemv_launch`` sizes the automatic launch for on ``device``."""
    return device_sms(device, 1)  # Triton's interpreter runs programs one by one: the fewest, the largest tiles


def gemv_launch(n: int, k: int, sms: int, cap: int = K_STEP, per_sm: int = PROGRAMS_PER_SM,
                wide: int = WIDE_TILE, long_cap: int = LONG_K_STEP) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) for ``n`` outputs over ``k`` inputs on ``sms`` SMs: the input in
    steps of at most ``cap`` (``long_cap`` where k is ``LONG_K`` or more; powers of two, at least
    16), rows per program a power of two (at most 32) for about ``per_sm`` programs per SM, within
    ``TILE``; 8 warps for a tile of more than ``wide`` weights, else 4. The defaults are the fitted
    rule; the others are what ``nvkit.benchmarks.gemv.fit`` tries."""
    block_k = min(max(16, next_pow2(k)), long_cap if k >= LONG_K else cap)
    block_n = min(32, 1 << (max(1, n // max(1, per_sm * sms)).bit_length() - 1))
    while block_n > 1 and block_n * block_k > TILE:
        block_n //= 2
    return block_n, block_k, 4 if block_n * block_k <= wide else 8


@triton.jit
def _tiles(W, rows, c, live, K, N, stride_w, GLU: tl.constexpr):
    """The weight's tile of these rows at inputs ``c`` (and with ``GLU`` the up rows', N further
    down the stacked weight); inputs at or past K load nothing."""
    m = live[:, None] & (c < K)[None, :]
    w = tl.load(W + rows[:, None] * stride_w + c[None, :], mask=m, other=0.0)
    if GLU:
        wu = tl.load(W + (rows + N)[:, None] * stride_w + c[None, :], mask=m, other=0.0)
    else:
        wu = w
    return w, wu


@triton.jit
def _lora_sum(y, T, LB, rows, live, rank, stride_lb, dt, RANK_P2: tl.constexpr):
    """``y`` (the product's rows, rounded) plus the adapter's second product at those rows: ``T``
    (x A.T, ``rank`` values) against ``LB``'s rows (B, scaling folded in), summed in float32 and
    rounded to the adapter's dtype, the sum rounded to ``dt``, as ``llama_step.linear`` adds it."""
    j = tl.arange(0, RANK_P2)
    t = tl.load(T + j, mask=j < rank, other=0.0).to(tl.float32)
    b = tl.load(LB + rows[:, None] * stride_lb + j[None, :], mask=live[:, None] & (j < rank)[None, :], other=0.0)
    lo = tl.sum(b.to(tl.float32) * t[None, :], axis=1).to(LB.dtype.element_ty).to(tl.float32)
    return (y + lo).to(dt).to(tl.float32)


@triton.jit
def _gemv_kernel(X, W, NW, B, R, OUT, T, LB, N, K, rank, eps, scale, stride_w, stride_lb,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, WEIGHT_FIRST: tl.constexpr,
                 HAS_BIAS: tl.constexpr, GLU: tl.constexpr, HAS_SCALE: tl.constexpr, RESIDUAL: tl.constexpr,
                 LORA: tl.constexpr, RANK_P2: tl.constexpr, PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = rows < N
    cols = tl.arange(0, BLOCK_K)
    dt = W.dtype.element_ty
    xdt = X.dtype.element_ty  # the weight's, or a bf16/fp16 stream read by an adapter's float32 A
    # each step's weights are loaded one step ahead, the first before anything the kernel before
    # wrote is read: with PDL that load overlaps that kernel's tail
    w, wu = _tiles(W, rows, cols, live, K, N, stride_w, GLU)
    if PDL:
        gdc_wait()  # the input and the residual are the kernels before's outputs
        gdc_launch_dependents()
    if NORM:  # the input row's mean square, before any product reads it normed
        ss = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = tl.load(X + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            ss += h * h
        rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    acc_up = tl.zeros((BLOCK_N,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        c = k0 + cols
        ok = c < K
        x = tl.load(X + c, mask=ok, other=0.0).to(tl.float32)
        if NORM:  # llama_step.rms_norm's roundings, in the stream's dtype
            y = x * rstd
            nw = tl.load(NW + c, mask=ok, other=0.0).to(tl.float32)
            if WEIGHT_FIRST:
                x = (nw * y).to(xdt).to(tl.float32)
            else:
                x = (nw * y.to(xdt).to(tl.float32)).to(xdt).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if GLU:
            acc_up += tl.sum(wu.to(tl.float32) * x[None, :], axis=1)
        w, wu = _tiles(W, rows, c + BLOCK_K, live, K, N, stride_w, GLU)  # the next step's (none past K)
    if HAS_BIAS:
        acc += tl.load(B + rows, mask=live, other=0.0).to(tl.float32)
        if GLU:
            acc_up += tl.load(B + N + rows, mask=live, other=0.0).to(tl.float32)
    out = acc.to(dt).to(tl.float32)
    if LORA:
        out = _lora_sum(out, T, LB, rows, live, rank, stride_lb, dt, RANK_P2)
    if GLU:  # F.silu(gate) * up, each rounded as the eager operations round
        up = acc_up.to(dt).to(tl.float32)
        if LORA:
            up = _lora_sum(up, T, LB, rows + N, live, rank, stride_lb, dt, RANK_P2)
        silu = (out / (1.0 + tl.exp(-out))).to(dt).to(tl.float32)
        out = (silu * up).to(dt).to(tl.float32)
    if HAS_SCALE:
        out = (out * scale).to(dt).to(tl.float32)
    if RESIDUAL:
        out = out + tl.load(R + rows, mask=live, other=0.0).to(tl.float32)
    tl.store(OUT + rows, out.to(OUT.dtype.element_ty), mask=live)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         norm: torch.Tensor | None = None, eps: float = 1e-6, weight_first: bool = False,
         glu: bool = False, scale: float | None = None, residual: torch.Tensor | None = None,
         lora: tuple | None = None, block_n: int | None = None, block_k: int | None = None,
         num_warps: int | None = None, num_stages: int | None = None, pdl: bool = False) -> torch.Tensor:
    """``x @ weight.T + bias`` for one row ``x`` ((K,) or (1, K)), as (1, N), with what may come
    around it in a decoder layer (see the module docstring):

    - ``norm``: ``x`` is the residual stream, normed first with this weight and ``eps``
      (``llama_step.rms_norm``; ``weight_first``: the Gemma/OLMo 2 rounding);
    - ``glu``: ``weight`` (and ``bias``) are a gate and an up projection stacked (2N, K); the
      result is SiLU(gate) × up, (1, N);
    - ``scale``: the product times this branch multiplier (Granite's ``residual_multiplier``);
    - ``residual``: the result added to this (1, N) row (the residual sum after a branch);
    - ``lora``: (t, B), an unmerged adapter's products added to the product before the rest, as
      ``llama_step.linear`` adds them: ``t`` = x A.T ((rank,) or (1, rank), from ``gemv(x, A)``
      with the same norm: ``x`` may be in the stream's bf16 or fp16 where A is float32), ``B``
      (the weight's rows, rank) with the scaling folded in; with ``glu`` the gate's and the up's
      rows of B stacked as the weight's are.

    ``block_n``, ``block_k``, ``num_warps``, ``num_stages``: the launch (None: ``gemv_launch``'s,
    the stages Triton's own), which ``nvkit.benchmarks.gemv`` varies. ``pdl``: launched with Programmatic
    Dependent Launch (a CUDA GPU of compute capability 9 or more): the kernel starts while the one
    before it ends, loads its first weights, then waits for that kernel's outputs, and lets the
    kernel after it start in turn. The weight's dtype is the result's."""
    why = _why(x, weight, bias, norm, glu, residual) or _lora_why(lora, weight)
    why = why or launch_why(num_stages, False, block_n=block_n, block_k=block_k, num_warps=num_warps)
    why = why or pdl_why(weight.device, pdl)
    if why:
        raise ValueError(f"nvkit gemv: {why}")
    k = weight.shape[1]
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    auto_n, auto_k, auto_warps = gemv_launch(n, k, sm_count(weight.device))
    block_n, block_k, num_warps = block_n or auto_n, block_k or auto_k, num_warps or auto_warps
    x = x.reshape(-1).contiguous()
    out = torch.empty((1, n), dtype=weight.dtype, device=weight.device)
    tuning = {name: v for name, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    if pdl:
        tuning["launch_pdl"] = True
    t, lb = (lora[0].reshape(-1), lora[1]) if lora is not None else (x, weight)  # unread without an adapter
    rank = lb.shape[1] if lora is not None else 1
    launch(_gemv_kernel, (triton.cdiv(n, block_n),),
           x, weight, norm if norm is not None else x, bias if bias is not None else x,
           residual.reshape(-1) if residual is not None else x, out, t, lb, n, k, rank, float(eps),
           float(scale or 1.0), weight.stride(0), lb.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
           NORM=norm is not None, WEIGHT_FIRST=bool(weight_first), HAS_BIAS=bias is not None, GLU=bool(glu),
           HAS_SCALE=scale is not None, RESIDUAL=residual is not None, LORA=lora is not None,
           RANK_P2=max(16, next_pow2(rank)), PDL=bool(pdl), **tuning)
    return out


def _why(x, weight, bias, norm, glu, residual) -> str | None:
    """Why these tensors do not fit the kernel (None when they do)."""
    if weight.dim() != 2 or weight.stride(1) != 1:
        return f"expects a 2-d weight with contiguous rows, not {tuple(weight.shape)}"
    rows, k = weight.shape
    if x.numel() != k or (x.dim() == 2 and x.shape[0] != 1) or x.dim() > 2:
        return f"expects one row of {k} values, not {tuple(x.shape)}"
    if glu and rows % 2:
        return f"glu=True expects the gate and up rows stacked (an even count), not {rows}"
    n = rows // 2 if glu else rows
    if bias is not None and bias.shape != (rows,):
        return f"expects a bias of ({rows},), not {tuple(bias.shape)}"
    if norm is not None and norm.shape != (k,):
        return f"expects a norm weight of ({k},), not {tuple(norm.shape)}"
    if residual is not None and residual.numel() != n:
        return f"expects a residual of {n} values, not {tuple(residual.shape)}"
    devices = {t.device for t in (x, weight, bias, norm, residual) if t is not None}
    if len(devices) > 1:
        return f"expects every tensor on one device, not {sorted(map(str, devices))}"
    # an adapter's float32 A reads the bf16/fp16 stream (its norm rounded as the stream's)
    stream = x.dtype == weight.dtype or (weight.dtype == torch.float32 and x.dtype in (torch.bfloat16, torch.float16))
    if not stream or (residual is not None and residual.dtype != weight.dtype):
        return (f"expects x in the weight's dtype ({weight.dtype}; bf16 or fp16 where the weight is float32) "
                f"and the residual in the weight's, not {x.dtype}"
                + (f" and {residual.dtype}" if residual is not None else ""))
    return None


def _lora_why(lora, weight) -> str | None:
    """Why ``lora`` = (t, B) does not fit ``weight`` (None when it does, or is None)."""
    if lora is None:
        return None
    if not isinstance(lora, (tuple, list)) or len(lora) != 2 or not all(isinstance(p, torch.Tensor) for p in lora):
        return "lora must be (t, B): x A.T and the adapter's B"
    t, b = lora
    if b.dim() != 2 or b.shape[0] != weight.shape[0] or b.stride(1) != 1:
        return f"expects the adapter's B as ({weight.shape[0]}, rank) with contiguous rows, not {tuple(b.shape)}"
    if t.numel() != b.shape[1] or (t.dim() == 2 and t.shape[0] != 1) or t.dim() > 2:
        return f"expects t = x A.T of {b.shape[1]} values (B's rank), not {tuple(t.shape)}"
    if not t.is_contiguous() or {t.device, b.device} != {weight.device}:
        return "expects t contiguous and t and B on the weight's device"
    return None
