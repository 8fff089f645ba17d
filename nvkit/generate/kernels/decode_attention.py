"""Attention of one new token over a static KV cache, split over the cache length (flash-decoding).

Why a kernel of our own: at batch 1 the matmul form of decode attention costs three kernels per
layer (q·Kᵀ, softmax, p·V), each a few microseconds of latency for a few kilobytes of work, and it
reads the whole cache whatever the position. Here the first kernel gives each (KV head, slice of
the cache) pair its own program — the query heads of the group, a running max, sum and weighted
sum over the slice, skipping positions past the current one — and the second merges the slices
per query head. Grouped-query attention reads each KV head once for all its query heads.

A slice is every N-th block of ``BLOCK_L`` positions (block b belongs to slice b mod N), not a
contiguous stretch: a short sequence in a long cache then still spreads over all the slices,
so the cache can be sized for the longest request without slowing the short ones.

Gemma 2 and 3's attention, as transformers computes it, is here too, both off by default: a
sliding ``window`` (the query at ``pos`` sees keys pos - window < j <= pos; 0: every j <= pos)
and logit soft-capping (each score s = (q · k) · scale becomes softcap · tanh(s / softcap) before
the mask and the fp32 softmax; 0: none). A windowed slice starts its loop at its first block that
reaches the window, so the blocks below it cost nothing: a sliding layer reads its window, not
the cache. The window is a run-time argument (one compiled kernel serves every window); the
soft-capping a compile-time switch, so the layers without it pay no tanh.

The fused variant's RoPE may be partial, as Phi-3 and Phi-4-mini have it (transformers'
``partial_rotary_factor``): cos/sin tables of r < head_dim values rotate each head's first r dims
and pass the rest; r is a compile-time constant, so a model's one width compiles one variant and
the full-width kernel keeps its unmasked loads.

``decode_attention`` is a ``torch.library.custom_op``: ``torch.compile`` (fullgraph) keeps it as one
opaque node and calls it at run time, Triton compiles the kernels in this process on the first
(warm-up) call, and CUDA-graph capture records their launches. Why not ``triton_op``, which hands
the kernels to inductor: on a Hopper GPU with torch 2.11 inductor's compile workers failed on them
("SubprocException"), while the same kernels compiled and decoded the right tokens when launched
directly. Used by ``nvkit.fast`` with ``attention="triton-split"`` (``decode_attention``) and
``attention="triton-fused"`` (``decode_attention_rope``); ``decode_launch`` is the latter with the
kernel's launch shape as arguments (slices, positions per loop step, ``tl.dot`` on tensor cores,
warps, stages), which ``python -m nvkit.benchmarks.attention --batch1`` times against each other
at long and short caches. The batched path's kernel over a paged cache is ``paged_attention``.
The references in plain torch: ``attend_reference`` (in ``nvkit.benchmarks.attention``, which
checks the paged kernel against it too) and, built on it, ``attend_rope_reference`` in
tests/generate/kernels/test_decode_attention.py.
"""

from __future__ import annotations

from typing import Optional  # the op's schema is read from these annotations: Optional, not 'X | None'

import torch
import triton
import triton.language as tl

from .common import (DOT_DTYPES, MAX_SPLITS, MAX_WINDOW, attend_block, combine_kernel, gdc_launch_dependents, gdc_wait,
                     launch_why, next_pow2, norm_rope, pdl_why, rope_lanes, rotary_width_fits, window_softcap_why)
from .launch import launch

BLOCK_L = 32  # cache positions per step inside a slice


@triton.jit
def _attend_slice(q, K, V, M, L, O, kvh, split, pos, window, softcap, heads, live, d, scale,
                  stride_kh, stride_kl, stride_vh, stride_vl,
                  GROUPS_P2: tl.constexpr, HD: tl.constexpr, N_SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                  SOFTCAP: tl.constexpr, DOT: tl.constexpr):
    """One (KV head, slice) program's part: running max, sum and weighted sum of the group's query
    heads ``q`` (GROUPS_P2, HD; fp32) over the slice's cache positions in the window up to ``pos``
    (its blocks are blocks split, split + N_SPLITS, ...); ``DOT``: the products on tensor cores
    (``common.attend_block``; GROUPS_P2 at least 16)."""
    m = tl.full((GROUPS_P2,), float("-inf"), tl.float32)
    s_sum = tl.zeros((GROUPS_P2,), tl.float32)
    acc = tl.zeros((GROUPS_P2, HD), tl.float32)
    if DOT:
        q = q.to(K.dtype.element_ty)
    hi = pos + 1
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)  # the first key the query sees
    # the slice's first block at or past the one holding lo: the blocks wholly below the window
    # are never loaded (lo // BLOCK is not negative, so % gives the slice's offset from it)
    first = lo // BLOCK
    start = first + (split - first % N_SPLITS + N_SPLITS) % N_SPLITS
    for off in range(start * BLOCK, hi, N_SPLITS * BLOCK):  # no step when the slice has no block in the window
        cols = off + tl.arange(0, BLOCK)
        ok = (cols >= lo) & (cols < hi)
        k = tl.load(K + kvh * stride_kh + cols[:, None] * stride_kl + d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + kvh * stride_vh + cols[:, None] * stride_vl + d[None, :], mask=ok[:, None], other=0.0)
        m, s_sum, acc = attend_block(q, k, v, ok, m, s_sum, acc, scale, softcap, SOFTCAP, DOT)
    row = heads * N_SPLITS + split
    tl.store(M + row, m, mask=live)
    tl.store(L + row, s_sum, mask=live)
    tl.store(O + row[:, None] * HD + d[None, :], acc, mask=live[:, None])


# the window is not specialised on (Triton would compile a variant of its own for a window of 1
# or a multiple of 16): one compiled kernel serves every window, and no window
@triton.jit(do_not_specialize=["window"])
def _split_kernel(Q, K, V, POS, M, L, O, scale, window, softcap,
                  stride_kh, stride_kl, stride_vh, stride_vl,
                  GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr, HD: tl.constexpr, N_SPLITS: tl.constexpr,
                  BLOCK: tl.constexpr, SOFTCAP: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()  # the query and the cache are the kernels before's outputs
        gdc_launch_dependents()
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    pos = tl.load(POS)  # keys 0..pos (inclusive) are valid; the rest of the cache is not written yet
    g = tl.arange(0, GROUPS_P2)
    d = tl.arange(0, HD)
    heads = kvh * GROUPS + g
    live = g < GROUPS
    q = tl.load(Q + heads[:, None] * HD + d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    _attend_slice(q, K, V, M, L, O, kvh, split, pos, window, softcap, heads, live, d, scale,
                  stride_kh, stride_kl, stride_vh, stride_vl, GROUPS_P2, HD, N_SPLITS, BLOCK, SOFTCAP, DOT)



@triton.jit(do_not_specialize=["window"])
def _rope_split_kernel(QKV, QW, KW, COS, SIN, K, V, POS, M, L, O, scale, window, softcap, eps,
                       stride_kh, stride_kl, stride_vh, stride_vl,
                       NH: tl.constexpr, NKV: tl.constexpr, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                       HD: tl.constexpr, N_SPLITS: tl.constexpr, BLOCK: tl.constexpr, HAS_NORM: tl.constexpr,
                       SOFTCAP: tl.constexpr, ROT: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr):
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    pos = tl.load(POS)
    g = tl.arange(0, GROUPS_P2)
    d = tl.arange(0, HD)
    rd, sign, cos, sin = rope_lanes(COS, SIN, d, HD, ROT)  # ROT < HD: the dims past ROT pass unrotated
    if PDL:
        # the position and the rotary tables were written two kernels back or earlier, done once
        # the kernel before (which signals only after its own wait) let this one start; the
        # projection it wrote is read, and anything written, only after the wait
        gdc_wait()
        gdc_launch_dependents()
    heads = kvh * GROUPS + g
    live = g < GROUPS
    qp = QKV + heads[:, None] * HD
    q = norm_rope(tl.load(qp + d[None, :], mask=live[:, None], other=0.0).to(tl.float32),
                   tl.load(qp + rd[None, :], mask=live[:, None], other=0.0).to(tl.float32),
                   QW, d, rd, sign, cos, sin, eps, HAS_NORM, HD)
    if (pos // BLOCK) % N_SPLITS == split:  # the one program whose slice holds the new position
        kp = QKV + (NH + kvh) * HD
        k = norm_rope(tl.load(kp + d).to(tl.float32)[None, :], tl.load(kp + rd).to(tl.float32)[None, :],
                       KW, d, rd, sign, cos, sin, eps, HAS_NORM, HD)
        tl.store(K + kvh * stride_kh + pos * stride_kl + d[None, :], k.to(K.dtype.element_ty))
        tl.store(V + kvh * stride_vh + pos * stride_vl + d, tl.load(QKV + (NH + NKV + kvh) * HD + d))
    tl.debug_barrier()  # the new key and value are read back below by other threads of this program
    _attend_slice(q, K, V, M, L, O, kvh, split, pos, window, softcap, heads, live, d, scale,
                  stride_kh, stride_kl, stride_vh, stride_vl, GROUPS_P2, HD, N_SPLITS, BLOCK, SOFTCAP, DOT)



#: ``decode_attention_rope``'s launch by cache size: (the smallest cache it is for, slices per KV
#: head (None: ``splits_for``), blocks of ``BLOCK_L`` positions per loop step, tl.dot, warps,
#: stages), the last row that fits wins. The products on tensor cores (``tl.dot``: q and the
#: weights rounded to the cache's dtype, as a bf16 matmul rounds them), two blocks per step and a
#: three-stage pipeline read a 16-bit cache about three times faster than the fp32 products, at
#: 1 k to 16 k positions alike (``python -m nvkit.benchmarks.attention --batch1``; docs/benchmarks.md); more slices than
#: ``splits_for``'s gained nothing there. Caches under two blocks, fp32 caches and Triton's
#: interpreter keep the fp32 products (``default_launch``), and so does ``decode_attention`` (the
#: split kernel without the norms and RoPE, which that table does not time).
LAUNCHES = ((0, None, 1, False, None, None), (2 * BLOCK_L, None, 2, True, 4, 3))


def default_launch(k) -> dict:
    """``decode_launch``'s keywords for the key cache ``k`` (KV heads, length, head_dim):
    ``LAUNCHES``' row for its length, without ``tl.dot`` where ``common.DOT_DTYPES`` says not."""
    length = k.shape[1]
    rows = [r for r in LAUNCHES if length >= r[0] and (not r[3] or (k.is_cuda and k.dtype in DOT_DTYPES))]
    row = rows[-1]
    return dict(splits=row[1] or splits_for(length), blocks_per_step=row[2], dot=row[3], num_warps=row[4],
                num_stages=row[5])


def splits_for(length: int) -> int:
    """Slices per KV head for a cache of ``length`` positions (a power of two, like the buckets)."""
    return max(1, min(MAX_SPLITS, length // BLOCK_L))


def _launch(split_kernel, lead: tuple, scalars: tuple, k, v, nh: int, hd: int, out, *, splits: int | None = None,
            blocks_per_step: int = 1, dot: bool = False, num_warps: int | None = None, num_stages: int | None = None,
            pdl: bool = False, **constexprs) -> None:
    """Both ops' launches (on the GPU, or in Triton's interpreter under ``TRITON_INTERPRET=1``):
    ``split_kernel`` over (KV heads × slices of the cache), called with ``lead`` (its tensors up to
    the cache position), the per-slice results, ``scalars`` (the scale, window and soft cap first)
    and the cache strides; then the merge of the slices per query head into ``out``. The launch
    shape (``decode_launch``): ``splits`` slices (None: ``splits_for``), ``blocks_per_step`` blocks
    of ``BLOCK_L`` positions per step of the kernel's loop, ``dot``, ``num_warps``, ``num_stages``;
    ``pdl``: both launched with Programmatic Dependent Launch (``common.pdl_why``)."""
    nkv, length, _ = k.shape
    why = launch_why(num_stages, dot, splits=splits, blocks_per_step=blocks_per_step, num_warps=num_warps)
    why = why or pdl_why(out.device, pdl)
    if why:
        raise ValueError(f"nvkit::decode_attention {why}")
    block = min(BLOCK_L * blocks_per_step, length)
    if dot and block < 16:
        raise ValueError(f"nvkit::decode_attention dot=True needs blocks of at least 16 positions (tl.dot's "
                         f"smallest size), and this cache holds {length}")
    n_splits = splits_for(length) if splits is None else splits
    m = torch.empty((nh, n_splits), dtype=torch.float32, device=out.device)      # running max
    s_sum = torch.empty((nh, n_splits), dtype=torch.float32, device=out.device)  # running sum
    o = torch.empty((nh, n_splits, hd), dtype=torch.float32, device=out.device)  # weighted sum
    groups = nh // nkv
    tuning = {name: n for name, n in (("num_warps", num_warps), ("num_stages", num_stages)) if n is not None}
    chained = {"launch_pdl": True} if pdl else {}
    launch(split_kernel, (nkv, n_splits), *lead, m, s_sum, o, *scalars,
           k.stride(0), k.stride(1), v.stride(0), v.stride(1),
           GROUPS=groups, GROUPS_P2=max(16, next_pow2(groups)) if dot else next_pow2(groups), HD=hd,
           N_SPLITS=n_splits, BLOCK=block, DOT=dot, PDL=pdl, **constexprs, **tuning, **chained)
    launch(combine_kernel, (nh,), m, s_sum, o, out, N_SPLITS=n_splits, HD=hd, PDL=pdl, **chained)


def check_shapes(q, k, v) -> str | None:
    """Why these tensors do not fit the kernel (None when they do)."""
    if q.dim() != 2 or k.dim() != 3 or v.shape != k.shape:
        return "expects q (heads, head_dim) and k, v (kv_heads, length, head_dim)"
    nh, hd = q.shape
    nkv, length, khd = k.shape
    if khd != hd or nh % nkv:
        return f"{nh} query heads of {hd} cannot attend over {nkv} KV heads of {khd}"
    if hd & (hd - 1) or length & (length - 1):
        return f"head_dim ({hd}) and cache length ({length}) must be powers of two"
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        return "the cache's last dimension must be contiguous"
    return None


@torch.library.custom_op("nvkit::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                     scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Attention output (heads, head_dim) of one query per head over cache positions 0..pos, or
    with ``window`` > 0 over pos - window + 1..pos; scores soft-capped when ``softcap`` > 0 (see the
    module docstring)."""
    why = check_shapes(q, k, v) or window_softcap_why(window, softcap)
    if why:
        raise ValueError(f"nvkit::decode_attention {why}")
    q = q.contiguous()
    nh, hd = q.shape
    out = torch.empty_like(q)
    _launch(_split_kernel, (q, k, v, pos), (scale, min(window, MAX_WINDOW), float(softcap)), k, v, nh, hd, out,
            SOFTCAP=softcap > 0)
    return out


@decode_attention.register_fake
def _(q, k, v, pos, scale, window=0, softcap=0.0):
    # what torch.compile traces with: the output's shape and dtype, nothing run
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def decode_attention_rope(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale: float, eps: float, window: int = 0,
                          softcap: float = 0.0, pdl: bool = False):
    """The whole attention of one decode step after the q/k/v projection, in two kernels: per-head
    RMS norm of q and k over the whole head (Qwen3's q_norm/k_norm; skipped when the weights are
    None), rotary embedding (``cos``/``sin`` of the current position, (r,)), the new key and value
    written into the caches ``k``/``v`` at ``pos``, and attention over positions 0..pos
    (``window`` and ``softcap`` as ``decode_attention`` takes them).

    ``r`` is the rotary width: head_dim for full RoPE, fewer (even, from 2) for partial rotary
    embedding as transformers' Phi-3 applies it (``partial_rotary_factor``; Phi-4-mini rotates 96
    of 128): the first r dims of each head rotate among themselves (rotate-half over r), the rest
    pass as the norm left them, into the attention and the key cache alike. Each width compiles
    its own kernel variant.

    ``qkv`` is the projection's output as (query heads + 2 × KV heads, head_dim): queries, then
    keys, then values. Returns (query heads, head_dim). Why: the matmul path spends separate
    kernels on the norms and RoPE, the two cache writes and the attention itself.

    ``pdl=True`` launches both kernels with Programmatic Dependent Launch (a Hopper GPU on and a
    Triton with grid dependency control: ``common.pdl_why``), for a step whose kernels are all so
    launched (``fast.gemv_step``): each starts while the one before ends and waits for its outputs
    before reading them.

    The op (``nvkit::decode_attention_rope``) has no defaults and gets every argument by position:
    torch 2.11 finds the tensors an op mutates by their place among the arguments it is handed,
    and the dispatcher drops trailing arguments equal to their defaults before that, so a mutated
    argument with a default would be looked for past their end. The defaults are this wrapper's."""
    return _decode_attention_rope_op(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale, eps, window, softcap, pdl)


@torch.library.custom_op("nvkit::decode_attention_rope", mutates_args=("k", "v"))
def _decode_attention_rope_op(qkv: torch.Tensor, q_weight: Optional[torch.Tensor], k_weight: Optional[torch.Tensor],
                              cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                              scale: float, eps: float, window: int, softcap: float, pdl: bool) -> torch.Tensor:
    return decode_launch(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale, eps, window=window, softcap=softcap,
                         pdl=pdl)


def decode_launch(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale: float, eps: float, *, window: int = 0,
                  softcap: float = 0.0, splits: int | None = None, blocks_per_step: int | None = None,
                  dot: bool | None = None, num_warps: int | None = None, num_stages: int | None = None,
                  pdl: bool = False):
    """What ``decode_attention_rope`` runs, with the kernel's launch shape as arguments, each None
    the op's own for this cache (``default_launch``): ``splits`` slices per KV head (a power of
    two), ``blocks_per_step`` blocks of ``BLOCK_L`` positions per step of the kernel's loop,
    ``dot=True`` the scores and the weighted sum on tensor cores (``common.attend_block``),
    ``num_warps`` and ``num_stages`` (where the op's are None too: Triton's). ``python -m
    nvkit.benchmarks.attention --batch1`` times the shapes against each other; ``pdl`` as
    ``decode_attention_rope`` takes it."""
    nkv = k.shape[0]
    nh, hd = qkv.shape[0] - 2 * nkv, qkv.shape[-1]
    why = (check_shapes(qkv[:nh], k, v) if qkv.dim() == 2 and nh > 0
           else "expects qkv (heads + 2 x kv_heads, head_dim)")
    if not why and (cos.dim() != 1 or sin.shape != cos.shape or not rotary_width_fits(cos.shape[0], hd)):
        why = (f"expects cos and sin of shape (r,), r even and at most {hd}, "
               f"not {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not why and (q_weight is None) != (k_weight is None):
        why = "takes both norm weights or neither"
    why = why or window_softcap_why(window, softcap)
    if why:
        raise ValueError(f"nvkit::decode_attention_rope {why}")
    asked = dict(splits=splits, blocks_per_step=blocks_per_step, dot=dot, num_warps=num_warps, num_stages=num_stages)
    launch = {name: own if asked[name] is None else asked[name] for name, own in default_launch(k).items()}
    qkv = qkv.contiguous()
    out = torch.empty((nh, hd), dtype=qkv.dtype, device=qkv.device)
    has_norm = q_weight is not None
    # without norms the kernel never reads the weights; any tensor fills their place
    lead = (qkv, q_weight if has_norm else cos, k_weight if has_norm else cos, cos.contiguous(), sin.contiguous(),
            k, v, pos)
    _launch(_rope_split_kernel, lead, (scale, min(window, MAX_WINDOW), float(softcap), eps), k, v, nh, hd, out,
            **launch, pdl=pdl, NH=nh, NKV=nkv, HAS_NORM=has_norm, SOFTCAP=softcap > 0, ROT=cos.shape[0])
    return out


@_decode_attention_rope_op.register_fake
def _(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale, eps, window, softcap, pdl):
    return qkv.new_empty((qkv.shape[0] - 2 * k.shape[0], qkv.shape[-1]))
