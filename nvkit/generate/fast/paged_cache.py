"""The device memory the batched fast path runs in: an ``Arena`` holds one pool's KV pages, the
row buffers its CUDA graphs read and write and the graphs captured on them; batch classes are the
row counts a graph is captured for (a batch runs in the smallest class that holds it, so a handful
of captures serve every batch size). Plain data and tensors: ``batched`` schedules and runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from ...errors import NvkitError
from .cuda_graphs import drop
from .schedule import SCRATCH, pages_for

if TYPE_CHECKING:
    from torch import Tensor

PAGE = 32                     # positions per KV page (one block of the attention kernel's loop)
CLASSES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_ROWS = CLASSES[-1]
PREFILL_TOKENS = 4096         # padded prompt tokens per prefill forward, at least (bounds its activations)
PREFILL_MAX_TOKENS = 16384    # ... and at most
PREFILL_SHARE = 0.1           # of the KV pool's bytes a prefill forward's activations may add
MEMORY_SHARE = 0.85           # of free GPU memory the pool may take
FIRST_POSITIONS = 32768       # KV positions a session's first pool holds at least (the lists to come) ...
FIRST_SHARE = 0.25            # ... within this share of free GPU memory
FIRST_WIDTH = 4096            # positions per row its page tables hold at least (the model's context if shorter)


def prefill_budget(pool_bytes: int, bytes_per_token: int) -> int:
    """Padded prompt tokens per prefill forward for a KV pool of ``pool_bytes``: larger forwards
    are fewer and fill the GPU better, and a request that needs a large pool can spare the
    activations (``PREFILL_SHARE`` of the pool), while a small one keeps the floor."""
    share = int(PREFILL_SHARE * pool_bytes / max(1, bytes_per_token))
    return max(PREFILL_TOKENS, min(PREFILL_MAX_TOKENS, share // 16 * 16))


def prefill_bytes_per_token(hidden: int, nh: int, nkv: int, hd: int, intermediate: int, itemsize: int) -> int:
    """Activation bytes one padded prompt token holds at the peak of a prefill layer: the residual
    and its normed copy, q/k/v and the KV heads repeated for the query heads, the attention
    output, the gate/up product and the SiLU product; plus the fp32 copy a norm makes."""
    return itemsize * (3 * hidden + (nh + 2 * nkv) * hd + 4 * nh * hd + 3 * intermediate) + 4 * hidden


#: the classes a pool's graphs are captured for, each 4 times the one below (and the pool's own
#: rows on top): a step of any row count runs in the smallest that holds it, so it computes at most
#: 4 times its class's rows, and a session captures a handful of graphs instead of one per class.
#: One row has a rung of its own: a one-prompt request's step is a matrix-vector product, which
#: runs faster than the same row inside a product of 4 (the GEMM kernels choose other tiles), and
#: only a one-prompt request steps with one row (a longer list's last row runs in rung 4)
LADDER = (1, 4, 16, 64, 256)
#: the rungs a pool's first list captures at once (``BatchedDecoder._replay_for``): a few tenths of
#: a second each, so no later list waits for one. Rung 256 is captured when a list first needs it:
#: its graph's buffers are the largest (a row's logits and sampling over the whole vocabulary), and
#: a list of more than 64 prompts runs long enough that its capture is a small part of its time
UPFRONT_ROWS = 64


def ladder(rows: int) -> tuple[int, ...]:
    """The classes of ``LADDER`` a pool of ``rows`` rows captures (its own rows the largest)."""
    return tuple(c for c in LADDER if c < rows) + (rows,)


def batch_class(n: int, smallest: int = 1) -> int:
    """The batch-size class that runs ``n`` rows (the smallest class ≥ n, at least ``smallest``)."""
    for c in CLASSES:
        if c >= max(n, smallest):
            return c
    raise ValueError(f"{n} rows is more than the largest class ({MAX_ROWS})")


class RowsKey(NamedTuple):
    """What a rows graph is captured for: the batch class, the sampling mode (``Sampling.key``),
    whether the adapters run."""
    batch: int
    sampling: tuple
    lora: bool


@dataclass(eq=False)
class Arena:
    """The device memory of one pool: KV pages, the row buffers the graphs read and write, the
    rotary tables, and the graphs captured on them (dropped with it)."""
    pages: int
    rows: int
    width: int                 # page-table entries per row
    keys: list[Tensor]             # per layer: (pages × PAGE, kv heads, head_dim)
    values: list[Tensor]
    cos: Tensor                   # rotary tables (FusedWeights.rotary)
    sin: Tensor
    tok: Tensor                   # (rows,) int64: each row's next input id
    pos: Tensor                   # (rows,) int64: the position that id takes
    table: Tensor                 # (rows, width) int32 page ids
    seed: Tensor                  # (rows,) int64
    min_pos: Tensor               # (rows,) int64: the first position an EOS may take
    temperature: Tensor           # (rows,) float32
    top_p: Tensor
    penalty: Tensor
    eos_mask: Tensor              # (1, vocab) bool
    out: Tensor                   # (rows, K + 1) int64: a replay's ids (column 0: the id it started from)
    seen: Tensor | None = None           # (rows, vocab) bool, when the repetition penalty runs
    rope_long: bool = False       # LongRoPE: the tables hold the long factors' (FusedWeights.rotary_for)
    host: list = field(default_factory=list)  # two (pinned ids, CUDA event) pairs for the readouts
    turn: int = 0
    graphs: dict = field(default_factory=dict)  # RowsKey -> replay
    pool: Any = None           # the graphs' shared memory pool (a graph pool handle) (they never run at once)

    @property
    def cap(self) -> int:
        """The last position a row may take: a parked row stays there (clamped), in the scratch page."""
        return self.width * PAGE - 1

    def row_buffers(self) -> list:
        """The buffers that hold a row's state (moved together when rows are packed)."""
        return [b for b in (self.tok, self.pos, self.table, self.seed, self.min_pos, self.seen) if b is not None]

    def park(self, rows) -> None:
        """Rows that hold no sequence: page table at the scratch page, position 0."""
        self.table.index_fill_(0, rows, SCRATCH)
        self.pos.index_fill_(0, rows, 0)

    def save_and_park_all(self) -> list:
        """The row state (to put back after a capture), every row parked meanwhile."""
        saved = [b.clone() for b in self.row_buffers()]
        self.table.fill_(SCRATCH)
        self.pos.zero_()
        return saved

    def drop_graphs(self, which: Callable[[tuple], bool] | None = None) -> None:
        """Drop the graphs whose key ``which`` accepts (None: all), and the pool handle with the
        last of them (``cuda_graphs.drop``)."""
        self.pool = drop(self.graphs, self.pool, which)

    def restore(self, saved: list) -> None:
        for b, s in zip(self.row_buffers(), saved):
            b.copy_(s)


def plan(prompt_lens: list[int], max_new: int, max_rows: int, page_bytes: int,
         free_bytes: int | None = None) -> tuple[int, int]:
    """(rows, pool pages incl. the scratch page) for prompts of these lengths: a row for every
    prompt up to ``max_rows``, and pages for the rows' sequences at once (the longest ones when
    there are more prompts than rows); fewer rows when the pool would not fit in ``MEMORY_SHARE``
    of ``free_bytes`` (None: no limit)."""
    needs = sorted((pages_for(n + max_new, PAGE) for n in prompt_lens), reverse=True)
    rows = min(len(needs), max_rows)
    while True:
        pages = sum(needs[:rows]) + 1
        if free_bytes is None or pages * page_bytes <= MEMORY_SHARE * free_bytes:
            return rows, pages
        if rows == 1:
            raise NvkitError(f"The KV cache of the longest prompt ({needs[0] * PAGE} positions, "
                             f"{pages * page_bytes / 2**30:.2f} GiB) does not fit in the GPU's free memory "
                             f"({free_bytes / 2**30:.2f} GiB): ask for fewer tokens, or free memory.")
        rows = max(1, rows * 3 // 4)


def pool_for(old: Arena | None, rows: int, pages: int, width: int, penalty: bool, page_bytes: int,
             free_bytes: int | None, max_rows: int, first_width: int) -> tuple[int, int, int, bool] | None:
    """The pool a request runs in, from what it needs (``rows`` rows, ``pages`` pages, page tables
    ``width`` wide, the penalty's mask or not): None where the session's pool ``old`` holds it
    (a pool is never shrunk: a smaller list runs on the graphs captured already); else (pages,
    rows, width, penalty) of a new one that holds ``old``'s and the request and has room for the
    lists to come, so that a new pool and its graphs are rarely needed. The first pool holds
    ``FIRST_POSITIONS`` within ``FIRST_SHARE`` of ``free_bytes`` (None: no limit) and tables
    ``first_width`` positions wide; a growing one twice the old pages within ``MEMORY_SHARE``;
    either has rows for ``max_rows`` prompts, whose buffers are small."""
    cls = batch_class(rows)
    if (old is not None and old.pages >= pages and old.rows >= cls and old.width >= width
            and (old.seen is not None or not penalty)):
        return None
    spare = 2 * old.pages if old is not None else FIRST_POSITIONS // PAGE
    if free_bytes is not None:
        spare = min(spare, int((MEMORY_SHARE if old is not None else FIRST_SHARE) * free_bytes) // page_bytes)
    width = max(width, old.width if old is not None else pages_for(first_width, PAGE))
    return max(pages, spare), max(cls, max_rows), width, penalty or (old is not None and old.seen is not None)


def new_arena(fw, pages: int, rows: int, width: int, k: int, vocab: int, penalty: bool, device) -> Arena:
    """A pool of ``pages`` KV pages for the fused weights ``fw`` and the buffers of ``rows`` rows
    (``width`` page-table entries each; the penalty's seen-ids mask when ``penalty``)."""
    import torch
    i64 = dict(dtype=torch.long, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    with torch.inference_mode(False):
        keys = [torch.zeros((pages * PAGE, fw.nkv, fw.hd), dtype=fw.dtype, device=device) for _ in fw.layers]
        values = [torch.zeros((pages * PAGE, fw.nkv, fw.hd), dtype=fw.dtype, device=device) for _ in fw.layers]
        cos, sin = fw.rotary(width * PAGE)
    a = Arena(pages=pages, rows=rows, width=width, keys=keys, values=values, cos=cos, sin=sin,
              tok=torch.zeros((rows,), **i64), pos=torch.zeros((rows,), **i64),
              table=torch.zeros((rows, width), dtype=torch.int32, device=device),
              seed=torch.zeros((rows,), **i64), min_pos=torch.zeros((rows,), **i64),
              temperature=torch.ones((rows,), **f32), top_p=torch.ones((rows,), **f32),
              penalty=torch.ones((rows,), **f32),
              eos_mask=torch.zeros((1, vocab), dtype=torch.bool, device=device),
              out=torch.zeros((rows, k + 1), **i64),
              seen=torch.zeros((rows, vocab), dtype=torch.bool, device=device) if penalty else None)
    if device.type == "cuda":
        a.host = [(torch.empty((rows, k + 1), dtype=torch.long, pin_memory=True), torch.cuda.Event())
                  for _ in range(2)]
    return a
