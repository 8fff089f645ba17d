"""The host side of the batched fast path: which sequence runs in which row, which KV pages it
holds, when a finished one's row takes the next waiting prompt, and what each replay's ids mean.
Plain Python, no torch: ``BatchedDecoder`` does the device work this plans.

Rows: the batched graphs run rows 0..B-1 of the row buffers (B a batch-size class). A row holds
one sequence, or is parked (free: its page table points at the scratch page only, so what the
graph computes for it lands nowhere that matters).

Pages: a sequence holds ceil((prompt + max_new_tokens) / page) pages of the pool from admission to
release, enough for every position it writes while it runs. Page 0 is the scratch page: the
table entries past a sequence's own pages and a parked row's whole table point there.

Refill without waiting for the GPU: each replay computes K steps of every row, and the host knows
when it queues a replay how many tokens each sequence will have once the queued replays are done
(``planned``). A sequence whose planned count reaches its ``max_new_tokens`` is released at once —
its row and pages go to the next waiting prompt before its last tokens are even read — and one
that ends earlier (EOS, a stop string) is released when its ids are read. The GPU runs the queued
work in order, so the new prompt's prefill writes its pages only after the replays still using
them. A snapshot taken when a replay is queued says which sequence each row held then, so the
ids it returns go to the right sequences whatever happened to the rows since.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

SCRATCH = 0  # the page every unused table entry points at


def pages_for(positions: int, page: int) -> int:
    return -(-positions // page)


@dataclass(eq=False)
class Sequence:
    """One prompt of a batched request and what it has produced so far."""
    index: int                 # its place in the caller's list
    prompt: list[int]
    max_new: int
    seed: int = 0
    stops: Any = None          # sampling.StopStrings, when the request has stop strings
    tokens: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    row: int | None = None
    planned: int = 0           # tokens it will have once every queued replay is done (no EOS)
    finished: bool = False     # complete: EOS, a stop string or max_new tokens
    released: bool = False     # its row and pages are given back

    @property
    def positions(self) -> int:
        """Cache positions it may write: the prompt and every new token."""
        return len(self.prompt) + self.max_new


class PagePool:
    """The free pages of the KV pool (ids 1..pages-1; page 0 is the scratch page)."""

    def __init__(self, pages: int):
        if pages < 2:
            raise ValueError("a pool needs the scratch page and at least one more")
        self.pages = pages
        self._free = list(range(pages - 1, 0, -1))  # popped from the end: low ids first

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        taken = self._free[-n:][::-1] if n else []
        del self._free[len(self._free) - n:]
        return taken

    def give(self, ids: list[int]) -> None:
        self._free.extend(reversed(ids))  # taken back in the order they were held


@dataclass
class Snapshot:
    """What one queued replay covers: (row, sequence, fresh) for each row that held a sequence;
    a fresh row was prefilled just before, so the replay's first id row holds its first token."""
    rows: list[tuple[int, Sequence, bool]]
    batch: int


class Scheduler:
    """Rows, pages and the waiting queue of one batched request (see the module docstring).

    ``k``: decode steps per replay. ``eos``: ids that end a sequence (kept as its last token)."""

    def __init__(self, seqs: list[Sequence], rows: int, pool_pages: int, page: int, k: int, eos=()):
        if rows < 1:
            raise ValueError("rows must be at least 1")
        self.seqs = list(seqs)
        self.waiting = collections.deque(self.seqs)
        self.rows: list[Sequence | None] = [None] * rows
        self.page = page
        self.k = k
        self.eos = frozenset(eos)
        self.pool = PagePool(pool_pages)
        too_big = [s for s in self.seqs if pages_for(s.positions, page) > pool_pages - 1]
        if too_big:
            raise ValueError(f"prompt {too_big[0].index} needs more pages than the pool holds")
        self.to_park: set[int] = set()  # rows freed since the device last parked them

    # --- what the rows hold ----------------------------------------------------------------------
    @property
    def live(self) -> int:
        return sum(1 for s in self.rows if s is not None)

    @property
    def top(self) -> int:
        """One past the highest row that holds a sequence (0: none)."""
        return max((r + 1 for r, s in enumerate(self.rows) if s is not None), default=0)

    @property
    def done(self) -> bool:
        """Every sequence has all its tokens."""
        return all(s.finished for s in self.seqs)

    def release(self) -> list[Sequence]:
        """Give back the rows and pages of sequences that are finished, or will be once the queued
        replays are read (planned ≥ max_new); returns them."""
        out = []
        for r, s in enumerate(self.rows):
            if s is not None and (s.finished or s.planned >= s.max_new):
                self.pool.give(s.pages)
                s.pages, s.row, s.released = [], None, True
                self.rows[r] = None
                self.to_park.add(r)
                out.append(s)
        return out

    def admit(self, limit: int | None = None) -> list[Sequence]:
        """Waiting sequences into free rows (lowest first), in the caller's order, while their pages
        fit; at most ``limit`` rows are used (None: all of them). Returns the admitted ones."""
        out = []
        rows = len(self.rows) if limit is None else min(limit, len(self.rows))
        for r in range(rows):
            if not self.waiting:
                break
            if self.rows[r] is not None:
                continue
            s = self.waiting[0]
            pages = self.pool.take(pages_for(s.positions, self.page))
            if pages is None:
                break  # the next one waits for pages; order is kept
            self.waiting.popleft()
            s.pages, s.row = pages, r
            self.rows[r] = s
            self.to_park.discard(r)
            out.append(s)
        return out

    def compact(self, batch: int) -> list[tuple[int, int]]:
        """Move sequences in rows ≥ ``batch`` into free rows below it; returns (from, to) pairs
        for the device to copy the rows' buffers. Needs ``live`` ≤ ``batch``."""
        free = [r for r in range(batch) if self.rows[r] is None]
        moves = []
        for r in range(batch, len(self.rows)):
            s = self.rows[r]
            if s is None:
                continue
            to = free.pop(0)
            self.rows[to], self.rows[r] = s, None
            s.row = to
            self.to_park.discard(to)
            self.to_park.add(r)
            moves.append((r, to))
        return moves

    def plan(self, batch: int, fresh: set[int]) -> Snapshot:
        """A replay of rows 0..batch-1 is queued: count the tokens it will give each sequence
        (K, and the first token too for a row prefilled just before) and remember who is where."""
        rows = []
        for r in range(batch):
            s = self.rows[r]
            if s is None:
                continue
            new = r in fresh
            s.planned += self.k + (1 if new else 0)
            rows.append((r, s, new))
        return Snapshot(rows, batch)

    def take(self, snap: Snapshot, ids: list[list[int]]) -> list[Sequence]:
        """The ids of a replay read back (``ids[r]``: row r's ids, the first being the id the
        replay started from): add them to their sequences, stop each at EOS, a stop string or
        max_new; returns the sequences that finished now."""
        finished = []
        for r, s, fresh in snap.rows:
            if s.finished:
                continue
            chunk = ids[r][0 if fresh else 1:]
            chunk = chunk[:s.max_new - len(s.tokens)]
            for i, t in enumerate(chunk):
                if t in self.eos:
                    chunk = chunk[:i + 1]
                    s.finished = True
                    break
            checked = len(s.tokens)
            s.tokens.extend(chunk)
            if s.stops is not None:
                keep = s.stops.cut(s.tokens, checked)
                if keep is not None:
                    del s.tokens[keep:]
                    s.finished = True
            if len(s.tokens) >= s.max_new:
                s.finished = True
            if s.finished:
                finished.append(s)
        return finished
