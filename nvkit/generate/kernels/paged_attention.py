"""Attention of one new token per row for many rows (sequences) at once over a paged KV cache:
the batched fast path's kernel (``nvkit::paged_decode_attention``), with the q/k norms, RoPE and
the cache write fused in as ``decode_attention.decode_attention_rope`` has them at batch 1.

The batched decode step runs B sequences at once, each at its own position, over one pool of
KV pages: every layer's keys (and values) are one (pages × PAGE, KV heads, head_dim) tensor, and
row b's position p lives in page TABLE[b, p // PAGE] at offset p % PAGE. A page is one block of
the kernel's loop, so following the table costs one scalar load per block. One program per
(row, KV head, slice); a slice is every N-th block of the row, as in ``decode_attention`` (a short
row in a long table still spreads over all the slices). Where the rows alone fill the GPU, one
slice per row: the program then writes the normalised output itself and the merge kernel is
skipped.

The sliding ``window`` and the logit ``softcap`` of Gemma 2/3 are as ``decode_attention`` takes
them (off by default): a windowed slice's loop starts at its first block that reaches the window,
so the blocks below it are never loaded and their page-table entries never read. The window does
not move the blocks between slices (block b stays in slice b mod N), so with
``INVARIANT_SPLITS`` a row's sums still do not depend on the rows beside it.

A ``torch.library.custom_op`` for the reasons ``decode_attention`` gives (torch.compile keeps it
as one opaque node; inductor's compile workers failed on the kernels as a ``triton_op``).
``paged_launch`` is the same with the kernel's launch shape as arguments, which
``python -m nvkit.benchmarks.attention`` times against each other; that benchmark also holds the
plain-torch reference the kernel is checked against (tests/generate/kernels/test_paged_attention.py).
"""

from __future__ import annotations

from typing import Optional  # the op's schema is read from these annotations: Optional, not 'X | None'

import torch
import triton
import triton.language as tl

from .common import (DOT_DTYPES, MAX_SPLITS, MAX_WINDOW, attend_block, device_sms, launch_why, merge_kernel, next_pow2,
                     norm_rope, rope_lanes, rotary_width_fits, window_softcap_why)
from .launch import launch

#: the batch-invariant step's slices per (row, KV head): a row's blocks go to the slices by their
#: index alone, so its partial sums and their merge do not depend on the rows beside it
INVARIANT_SPLITS = MAX_SPLITS


def _sm_count(device) -> int:
    # Triton's interpreter runs the programs one after another: a small GPU's figure keeps them
    # few (two slices per row and KV head at two rows of two KV heads, so the merge still runs)
    # and the result does not depend on it
    return device_sms(device, 4)


# the launch ``paged_launch`` takes on a 16-bit cache when nothing is asked (see its docstring;
# ``python -m nvkit.benchmarks.attention`` compares it with the others)
DOT_LAUNCH = {"pages_per_step": 2, "num_warps": 4, "num_stages": 3}


def default_launch(cache: torch.Tensor) -> dict:
    """The launch ``paged_launch`` takes for this KV pool when none is asked: ``DOT_LAUNCH`` with
    ``dot=True`` for a 16-bit pool on a GPU, else the fp32 products with Triton's own launch (on
    the CPU too: Triton's interpreter gets a bf16 ``tl.dot`` wrong)."""
    if cache.is_cuda and cache.dtype in DOT_DTYPES:
        return {"dot": True, **DOT_LAUNCH}
    return {"dot": False, "pages_per_step": 1, "num_warps": None, "num_stages": None}


def paged_splits(rows: int, nkv: int, blocks: int, sms: int) -> int:
    """Slices per (row, KV head): enough programs for about two per SM, never more slices than
    ``blocks`` (the blocks of the kernel's loop a row can read: the table's, or fewer under a
    window), a power of two up to ``MAX_SPLITS``."""
    want = -(-2 * sms // max(1, rows * nkv))
    return max(1, min(MAX_SPLITS, next_pow2(max(1, min(want, blocks)))))


# The slice count is a run-time value, not specialised on: the row count picks it (``paged_splits``),
# and as a constant every rung of the rows ladder would compile a kernel of its own the first time
# it is captured, where now one compiled kernel serves every rung. The window likewise: one
# compiled kernel serves every window (and none).
@triton.jit(do_not_specialize=["n_splits", "window"])
def _paged_rope_split_kernel(QKV, QW, KW, COS, SIN, K, V, POS, TABLE, M, L, O, OUT, scale, eps, n_splits,
                             window, softcap,
                             stride_qb, stride_tb, stride_kt, stride_kh, stride_vt, stride_vh,
                             NH: tl.constexpr, NKV: tl.constexpr, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                             HD: tl.constexpr, PAGE: tl.constexpr,
                             HAS_NORM: tl.constexpr, PAGES: tl.constexpr, DOT: tl.constexpr,
                             SOFTCAP: tl.constexpr, ROT: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    pos = tl.load(POS + b).to(tl.int32)
    g = tl.arange(0, GROUPS_P2)
    d = tl.arange(0, HD)
    # the tables' row of pos (ROT values a row); ROT < HD: the dims past ROT pass unrotated
    rd, sign, cos, sin = rope_lanes(COS + pos.to(tl.int64) * ROT, SIN + pos.to(tl.int64) * ROT, d, HD, ROT)
    heads = kvh * GROUPS + g
    live = g < GROUPS
    qp = QKV + b.to(tl.int64) * stride_qb + heads[:, None] * HD
    q = norm_rope(tl.load(qp + d[None, :], mask=live[:, None], other=0.0).to(tl.float32),
                   tl.load(qp + rd[None, :], mask=live[:, None], other=0.0).to(tl.float32),
                   QW, d, rd, sign, cos, sin, eps, HAS_NORM, HD)
    row_table = TABLE + b.to(tl.int64) * stride_tb
    # a block (one step of the loop below) is PAGES pages; block b belongs to slice b mod n_splits
    if (pos // (PAGE * PAGES)) % n_splits == split:  # the one program whose slice holds the new position
        t = tl.load(row_table + pos // PAGE).to(tl.int64) * PAGE + pos % PAGE
        kp = QKV + b.to(tl.int64) * stride_qb + (NH + kvh) * HD
        k = norm_rope(tl.load(kp + d).to(tl.float32)[None, :], tl.load(kp + rd).to(tl.float32)[None, :],
                       KW, d, rd, sign, cos, sin, eps, HAS_NORM, HD)
        tl.store(K + t * stride_kt + kvh * stride_kh + d[None, :], k.to(K.dtype.element_ty))
        vp = QKV + b.to(tl.int64) * stride_qb + (NH + NKV + kvh) * HD
        tl.store(V + t * stride_vt + kvh * stride_vh + d, tl.load(vp + d))
    tl.debug_barrier()  # the new key and value are read back below by other threads of this program
    m = tl.full((GROUPS_P2,), float("-inf"), tl.float32)
    s_sum = tl.zeros((GROUPS_P2,), tl.float32)
    acc = tl.zeros((GROUPS_P2, HD), tl.float32)
    cols = tl.arange(0, PAGE * PAGES)
    if DOT:  # the scores and the weighted sum on tensor cores: q in the cache's dtype, rows padded to 16
        qd = q.to(K.dtype.element_ty)
    else:
        qd = q
    lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0)  # the first key the query sees
    # the slice's first block at or past the one holding lo (block b is slice b mod n_splits's
    # whatever the window): the blocks wholly below the window are never loaded, nor their pages
    # looked up
    first = lo // (PAGE * PAGES)
    start = first + (split - first % n_splits + n_splits) % n_splits
    for blk in range(start, pos // (PAGE * PAGES) + 1, n_splits):  # no step when the slice has no block in the window
        at = blk * (PAGE * PAGES) + cols
        ok = (at >= lo) & (at <= pos)
        if PAGES == 1:  # one page: one table entry for the whole block (which reaches the window)
            t = tl.load(row_table + blk).to(tl.int64) * PAGE + cols
        else:  # each position's own page (positions outside the window read no entry: the table
            # may end past pos, and the pages below the window may be gone)
            t = tl.load(row_table + at // PAGE, mask=ok, other=0).to(tl.int64) * PAGE + at % PAGE
        k = tl.load(K + t[:, None] * stride_kt + kvh * stride_kh + d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + t[:, None] * stride_vt + kvh * stride_vh + d[None, :], mask=ok[:, None], other=0.0)
        m, s_sum, acc = attend_block(qd, k, v, ok, m, s_sum, acc, scale, softcap, SOFTCAP, DOT)
    out_rows = b.to(tl.int64) * NH + heads
    if n_splits == 1:  # the whole row in this program (pos among its positions: s_sum > 0): the output itself
        out = acc / s_sum[:, None]
        tl.store(OUT + out_rows[:, None] * HD + d[None, :], out.to(OUT.dtype.element_ty), mask=live[:, None])
    else:
        row = out_rows * n_splits + split
        tl.store(M + row, m, mask=live)
        tl.store(L + row, s_sum, mask=live)
        tl.store(O + row[:, None] * HD + d[None, :], acc, mask=live[:, None])


def check_paged(qkv, k, v, pos, table, cos, sin, page: int) -> str | None:
    """Why these tensors do not fit the paged kernel (None when they do)."""
    if qkv.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        return "expects qkv (rows, heads + 2 x kv_heads, head_dim) and k, v (pages x page, kv_heads, head_dim)"
    rows, width, hd = qkv.shape
    tokens, nkv, khd = k.shape
    nh = width - 2 * nkv
    if khd != hd or nh <= 0 or nh % nkv:
        return f"{width} q/k/v heads of {hd} cannot attend over {nkv} KV heads of {khd}"
    if hd & (hd - 1) or page & (page - 1) or page < 1 or tokens % page:
        return f"head_dim ({hd}) and the page ({page}) must be powers of two, the pool ({tokens}) whole pages"
    if pos.shape != (rows,) or table.dim() != 2 or table.shape[0] != rows:
        return f"expects pos ({rows},) and table ({rows}, blocks), not {tuple(pos.shape)} and {tuple(table.shape)}"
    if cos.dim() != 2 or sin.shape != cos.shape or not rotary_width_fits(cos.shape[1], hd):
        return (f"expects cos and sin tables (positions, r), r even and at most {hd}, "
                f"not {tuple(cos.shape)} and {tuple(sin.shape)}")
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k.stride(1) != hd or v.stride(1) != hd:
        return "each position's heads must be contiguous in the pool"
    return None


@torch.library.custom_op("nvkit::paged_decode_attention", mutates_args=("k", "v"))
def paged_decode_attention(qkv: torch.Tensor, q_weight: Optional[torch.Tensor], k_weight: Optional[torch.Tensor],
                           cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           pos: torch.Tensor, table: torch.Tensor, page: int, scale: float,
                           eps: float, splits: int = 0, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """``decode_attention_rope`` for many rows over a paged pool: per row b, the q/k norms and RoPE
    at position ``pos[b]`` (``cos``/``sin``: (positions, r) tables, r the rotary width: head_dim,
    or fewer, even, for partial rotary embedding as ``decode_attention_rope`` takes it), its new
    key and value written at that position through its page table ``table[b]``, attention over
    its positions 0..pos[b] (with ``window`` > 0, pos[b] - window + 1..pos[b]; scores soft-capped
    when ``softcap`` > 0: see ``decode_attention``). ``qkv`` (rows, query heads + 2 × KV heads,
    head_dim); returns (rows, query heads, head_dim). ``splits``: slices per (row, KV head), 0 for
    ``paged_splits``'. A fixed number (``INVARIANT_SPLITS``) makes a row's sums the same whatever
    the rows and table beside it: the batch-invariant step's attention. The table entries of the
    pages wholly below a row's window are never read: they may hold anything."""
    return paged_launch(qkv, q_weight, k_weight, cos, sin, k, v, pos, table, page, scale, eps,
                        splits=splits or None, window=window, softcap=softcap)


def paged_launch(qkv, q_weight, k_weight, cos, sin, k, v, pos, table, page: int, scale: float, eps: float, *,
                 splits: int | None = None, pages_per_step: int | None = None, num_warps: int | None = None,
                 dot: bool | None = None, num_stages: int | None = None, window: int = 0, softcap: float = 0.0):
    """What ``paged_decode_attention`` runs, with the kernel's launch shape as arguments (the op
    takes the defaults; ``window`` and ``softcap`` are the op's): ``splits`` slices per (row, KV
    head) (None: ``paged_splits``, over the blocks the window can meet), ``pages_per_step`` pages
    per step of the kernel's loop, ``num_warps`` and ``num_stages`` (None: Triton's defaults);
    ``dot=True`` computes the scores and the weighted sum with ``tl.dot``
    (tensor cores; the group's query heads padded to 16 rows, q and the weights rounded to the
    cache's dtype, as a matmul in that dtype does) instead of fp32 products and sums.
    ``nvkit.benchmarks.attention`` times the shapes against each other.

    The defaults (every argument None) are ``DOT_LAUNCH`` for a bf16/fp16 cache on a GPU: the fp32 products
    and sums keep the kernel's registers busy with conversions while the tensor cores idle, so on
    a 16-bit cache tensor cores with two pages per loop step and a three-stage pipeline read the
    cache several times faster. An fp32 cache keeps the fp32 products, since ``tl.dot`` on fp32
    inputs would round them to TF32."""
    why = check_paged(qkv, k, v, pos, table, cos, sin, page)
    if not why and (q_weight is None) != (k_weight is None):
        why = "takes both norm weights or neither"
    why = why or window_softcap_why(window, softcap)
    if why:
        raise ValueError(f"nvkit::paged_decode_attention {why}")
    # what is not asked comes from the default launch (of the kind asked, when dot is)
    auto = default_launch(k) if dot is None else {"dot": dot, "pages_per_step": 1, "num_warps": None, "num_stages": None}
    dot = auto["dot"]
    pages_per_step = auto["pages_per_step"] if pages_per_step is None else pages_per_step
    num_warps = auto["num_warps"] if num_warps is None else num_warps
    num_stages = auto["num_stages"] if num_stages is None else num_stages
    why = launch_why(num_stages, dot, splits=splits, pages_per_step=pages_per_step, num_warps=num_warps)
    if why:
        raise ValueError(f"nvkit::paged_decode_attention {why}")
    rows, width, hd = qkv.shape
    nkv = k.shape[1]
    nh = width - 2 * nkv
    qkv = qkv.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty((rows, nh, hd), dtype=qkv.dtype, device=qkv.device)
    if rows == 0:
        return out
    blocks = -(-table.shape[1] // pages_per_step)
    if window:  # a window of w positions meets at most ceil(w / block) + 1 blocks: more slices would idle
        blocks = min(blocks, -(-window // (page * pages_per_step)) + 1)
    n_splits = paged_splits(rows, nkv, blocks, _sm_count(qkv.device)) if splits is None else splits
    f32 = dict(dtype=torch.float32, device=qkv.device)
    # float32 slices whatever the count (one slice leaves them unused: the kernel writes the output
    # itself), so every count calls the one compiled kernel with the same argument types
    m, s_sum = torch.empty((rows * nh, n_splits), **f32), torch.empty((rows * nh, n_splits), **f32)
    o = torch.empty((rows * nh, n_splits, hd), **f32)
    has_norm = q_weight is not None
    groups = nh // nkv
    tuning = {name: n for name, n in (("num_warps", num_warps), ("num_stages", num_stages)) if n is not None}
    rows_p2 = next_pow2(groups)
    if dot:
        rows_p2 = max(16, rows_p2)  # tl.dot's smallest M
    launch(_paged_rope_split_kernel, (rows, nkv, n_splits),
           qkv, q_weight if has_norm else cos, k_weight if has_norm else cos, cos, sin, k, v, pos, table,
           m, s_sum, o, out, scale, eps, n_splits, min(window, MAX_WINDOW), float(softcap),
           qkv.stride(0), table.stride(0), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
           NH=nh, NKV=nkv, GROUPS=groups, GROUPS_P2=rows_p2, HD=hd, PAGE=page,
           HAS_NORM=has_norm, PAGES=pages_per_step, DOT=dot, SOFTCAP=softcap > 0, ROT=cos.shape[1], **tuning)
    if n_splits > 1:
        launch(merge_kernel, (rows * nh,), m, s_sum, o, out, n_splits, MAX_N=max(MAX_SPLITS, n_splits), HD=hd)
    return out


@paged_decode_attention.register_fake
def _(qkv, q_weight, k_weight, cos, sin, k, v, pos, table, page, scale, eps, splits=0, window=0, softcap=0.0):
    return qkv.new_empty((qkv.shape[0], qkv.shape[1] - 2 * k.shape[1], qkv.shape[2]))
