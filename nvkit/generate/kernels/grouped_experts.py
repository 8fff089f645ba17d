"""A mixture of experts' products, each (token, expert) pair's row times its own expert's weight
read in place (``grouped_matmul``), for the decode steps over a model's own forward that run
without ``torch.compile`` (``fast.experts``).

Why: transformers' experts that a CUDA graph can hold either copy each pair's expert weights out
before a batched product ("batched_mm": the routed experts' bytes read, written and read again,
in a dozen launches a layer), or run every expert on every row (nvkit's dense experts: every
expert's bytes, and the products of experts a row did not pick). Here the pairs are sorted by
expert into blocks of ``BLOCK_M`` rows (``align``: on the device, with fixed sizes, so a captured
graph replays it for any routing), and one program per (block, slice of outputs) multiplies its
rows by its expert's weight on tensor cores: each expert that any row picked is read once per
step (once per block of its rows), none other, whatever the row count. This is the layout of
vLLM's fused MoE kernel (its ``moe_align_block_size``), without its tuned launch tables.

The torch reference is transformers' own "batched_mm" experts (tests/generate/kernels/
test_grouped_experts.py); the GPU check is in tests/gpu/test_families_gpu.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch

#: rows per block: a block is one expert's, padded to this many (``tl.dot``'s smallest M)
BLOCK_M = 16


_ONE_TOKEN: dict = {}  # (top_k, block, device) -> ids of one token's pairs, a block each


def align(top_k_index: torch.Tensor, experts: int, block: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """The (token, expert) pairs of ``top_k_index`` ((tokens, top_k) expert ids; pair p is token
    p // top_k's p % top_k-th) in blocks of ``block`` rows, each block one expert's: (``ids``: the
    pair in each row of the blocks, ``tokens × top_k`` in a padding row; ``block_expert``: each
    block's expert, -1 for a block past the last). Sizes depend only on the pairs' and the experts'
    counts (every expert may need a padded block), so the same graph holds any routing. One
    token's pairs (the batch-1 step) are all different experts: each is a block of its own, in its
    order, with no sort to launch."""
    flat = top_k_index.reshape(-1).long()
    pairs = flat.numel()
    dev = flat.device
    if top_k_index.dim() == 2 and top_k_index.shape[0] == 1:
        key = (pairs, block, dev)
        if key not in _ONE_TOKEN:  # made at a step's first (eager) run, before its graph is captured
            ids = torch.full((pairs, block), pairs, dtype=torch.long, device=dev)
            ids[:, 0] = torch.arange(pairs, device=dev)
            _ONE_TOKEN[key] = ids.view(-1)
        return _ONE_TOKEN[key], flat
    counts = torch.zeros(experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)                     # the pairs, expert by expert
    by_expert = flat[order]
    rank = torch.arange(pairs, device=dev) - (counts.cumsum(0) - counts)[by_expert]  # place among its expert's
    slots = -(-(pairs + experts * (block - 1)) // block) * block
    ids = torch.full((slots,), pairs, dtype=torch.long, device=dev)
    ids[(ends - padded)[by_expert] + rank] = order
    starts = torch.arange(0, slots, block, device=dev)
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(starts < ends[-1], block_expert, torch.full_like(block_expert, -1))
    return ids, block_expert


@triton.jit
def _grouped_kernel(X, W, OUT, IDS, BLOCK_EXPERT, pairs, n, k, row_div,
                    stride_x, stride_we, stride_wn, stride_wk, stride_o,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    blk = tl.program_id(0)
    expert = tl.load(BLOCK_EXPERT + blk)
    if expert >= 0:  # a block past the last holds no pair
        rows = tl.load(IDS + blk * BLOCK_M + tl.arange(0, BLOCK_M))
        live = rows < pairs
        src = tl.where(live, rows // row_div, 0).to(tl.int64)  # the row of X a pair reads
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n
        w = W + expert.to(tl.int64) * stride_we
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, k, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < k
            a = tl.load(X + src[:, None] * stride_x + ks[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w + ks[:, None] * stride_wk + cols[None, :] * stride_wn, mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            if IEEE:  # float32 weights: full-precision products (tl.dot would round them to TF32)
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
        tl.store(OUT + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], acc.to(OUT.dtype.element_ty),
                 mask=live[:, None] & col_ok[None, :])


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, block_expert: torch.Tensor,
                   row_div: int, transposed: bool = False) -> torch.Tensor:
    """(pairs, out) products: pair p's row of ``x`` (row ``p // row_div``: the token's hidden state
    for the first product, ``row_div`` = top_k; the pair's own row for the second, 1) times its
    expert's weight, ``weight[e]`` of (out, in) (transformers' experts layout; ``transposed``: (in,
    out)). ``ids`` and ``block_expert``: ``align``'s, for the pairs' experts."""
    if x.dim() != 2 or weight.dim() != 3 or x.dtype != weight.dtype:
        raise ValueError(f"grouped_matmul expects x (rows, in) and weight (experts, ...) of one dtype, not "
                         f"{tuple(x.shape)} {x.dtype} and {tuple(weight.shape)} {weight.dtype}")
    k_dim = weight.shape[1] if transposed else weight.shape[2]
    n = weight.shape[2] if transposed else weight.shape[1]
    if x.shape[1] != k_dim or row_div < 1 or ids.numel() % BLOCK_M or ids.numel() != block_expert.numel() * BLOCK_M:
        raise ValueError(f"grouped_matmul: x of width {x.shape[1]} against weights of {k_dim} inputs, row_div "
                         f"{row_div}, {ids.numel()} rows in {block_expert.numel()} blocks of {BLOCK_M}")
    pairs = x.shape[0] * row_div
    x = x.contiguous()
    out = torch.empty((pairs, n), dtype=x.dtype, device=x.device)
    if pairs == 0:
        return out
    stride_wn, stride_wk = (weight.stride(2), weight.stride(1)) if transposed else (weight.stride(1), weight.stride(2))
    block_n = 64
    launch(_grouped_kernel, (block_expert.numel(), triton.cdiv(n, block_n)),
           x, weight, out, ids, block_expert, pairs, n, k_dim, row_div, x.stride(0), weight.stride(0), stride_wn,
           stride_wk, out.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=64, IEEE=x.dtype == torch.float32)
    return out
