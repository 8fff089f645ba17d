"""The host side of a rows request (``rows.BatchedDecoder``): the request's values into
the rows' buffers, newly admitted prompts prefilled into their pages, and the loop that refills
rows, queues replays (two at most in flight) and reads their ids back.

Pipelined like the batch-1 path's (``replay``): the next replay is queued before the ids of the one
before are read, so the GPU is not idle while the host schedules."""

from __future__ import annotations

import collections
from typing import Callable

from .paged_cache import PAGE, Arena, batch_class
from .llama_rows_step import paged_positions
from .sampling import RowParams, Sampling, choose_rows
from .schedule import SCRATCH, Scheduler, Sequence


def _to(device, data, dtype):
    """A host list as a tensor on ``device``, copied without waiting for the GPU's queue."""
    import torch
    t = torch.tensor(data, dtype=dtype)
    return t.to(device, non_blocking=True) if device.type == "cuda" else t


def set_request(a: Arena, sampling: Sampling, vocab: int) -> None:
    """The request's values every row shares (one list call has one set of generation arguments)."""
    a.temperature.fill_(max(sampling.temperature, 1e-5))
    a.top_p.fill_(sampling.top_p)
    a.penalty.fill_(sampling.repetition_penalty)
    a.eos_mask.zero_()
    eos = [e for e in sampling.eos if 0 <= e < vocab]
    if eos:
        a.eos_mask[0, eos] = True
    a.table.fill_(SCRATCH)
    a.pos.zero_()

def prefill(a: Arena, seqs: list[Sequence], sampling: Sampling, prefill_fn: Callable, budget: int, on_progress=None) -> None:
    """The prompts of newly admitted sequences into their pages, their first tokens picked, and
    their rows set up to decode. Prompts go in groups of similar length (sorted), each padded
    to its longest, at most ``budget`` padded tokens per forward (``prefill_fn``: the rows
    prefill, ``RowsPrefill``)."""
    import torch
    dev = a.tok.device
    rows = _to(dev, [s.row for s in seqs], torch.long)
    a.table.index_copy_(0, rows, _to(dev, [s.pages + [SCRATCH] * (a.width - len(s.pages)) for s in seqs],
                                      torch.int32))
    a.seed.index_copy_(0, rows, _to(dev, [s.seed for s in seqs], torch.long))
    a.min_pos.index_copy_(0, rows, _to(dev, [sampling.eos_allowed_from(len(s.prompt)) for s in seqs], torch.long))
    if a.seen is not None:
        a.seen.index_fill_(0, rows, False)
        if sampling.repetition_penalty != 1.0:
            r = [s.row for s in seqs for _ in s.prompt]
            t = [i for s in seqs for i in s.prompt]
            a.seen[_to(dev, r, torch.long), _to(dev, t, torch.long)] = True
    key = sampling.key
    for group in _groups(sorted(seqs, key=lambda s: len(s.prompt)), budget):
        length = _round_up(max(len(s.prompt) for s in group), 16)
        ids = _to(dev, [s.prompt + [0] * (length - len(s.prompt)) for s in group], torch.long)
        last = _to(dev, [len(s.prompt) - 1 for s in group], torch.long)
        grows = _to(dev, [s.row for s in group], torch.long)
        # Each row's positions 0..length-1 through its page table: a shorter prompt's padding
        # lands in its own later positions (rewritten by the decode steps before they are read)
        # or, past its pages, in the scratch page.
        where = paged_positions(a.table.index_select(0, grows), PAGE, length)
        logits = prefill_fn(ids, last, where, a.cos, a.sin, a.keys, a.values, on_progress=on_progress)
        counter = _to(dev, [len(s.prompt) for s in group], torch.long)
        p = RowParams(temperature=a.temperature.index_select(0, grows), top_p=a.top_p.index_select(0, grows),
                      penalty=a.penalty.index_select(0, grows), seed=a.seed.index_select(0, grows),
                      counter=counter, min_pos=a.min_pos.index_select(0, grows), eos_mask=a.eos_mask,
                      seen=a.seen.index_select(0, grows) if a.seen is not None else None)
        first = choose_rows(logits, key, p)
        if a.seen is not None:
            a.seen.index_copy_(0, grows, p.seen)
        a.tok.index_copy_(0, grows, first)
        a.pos.index_copy_(0, grows, counter)  # the first new token is fed at the position after the prompt

def readout(a: Arena, batch: int):
    """Queue the copy of a replay's ids to where the host reads them (see ``replay._readout``)."""
    if a.out.device.type != "cuda":
        return a.out[:batch].clone(), None, batch
    import torch
    host, done = a.host[a.turn % 2]
    a.turn += 1
    host[:batch].copy_(a.out[:batch], non_blocking=True)
    done.record(torch.cuda.current_stream(a.out.device))
    return host, done, batch

def collect(item) -> list[list[int]]:
    host, done, batch = item
    if done is not None:
        done.synchronize()
    return host[:batch].tolist()


def run(a: Arena, sched: Scheduler, graph_for: Callable, prefill_new: Callable, stop_event,
        on_tokens, batches: collections.Counter) -> None:
    """The host loop: refill, queue a replay (two at most in flight), read the oldest back.
    ``graph_for(batch)``: (the class that runs a batch of class ``batch``, its replay);
    ``prefill_new(seqs)``: prefill newly admitted sequences; ``batches`` counts the replays per
    class."""
    import torch
    # the class a step needs (``graph_for`` runs it in the smallest ladder rung that holds it): a
    # request of one prompt may need class 1, a larger one's last row class 2 (a size of 1 is
    # specialised by torch.compile, so a pool whose ladder has it keeps it for one-prompt requests)
    smallest = 1 if len(sched.seqs) == 1 else 2
    pending: collections.deque = collections.deque()
    stopped = False
    done = produced = 0
    dev = a.tok.device
    while True:
        while not stopped and len(pending) < 2:
            sched.release()
            if not sched.waiting:
                target = batch_class(sched.live, smallest)
                if sched.top > target:
                    moves = sched.compact(target)
                    src = _to(dev, [m[0] for m in moves], torch.long)
                    dst = _to(dev, [m[1] for m in moves], torch.long)
                    for b in a.row_buffers():
                        b.index_copy_(0, dst, b.index_select(0, src))
            new = sched.admit()
            if new:
                prefill_new(new)
            parked = [r for r in sched.to_park if r < a.rows]
            sched.to_park.clear()
            if parked:
                a.park(_to(dev, parked, torch.long))
            if sched.live == 0:
                break
            batch, replay = graph_for(batch_class(sched.top, smallest))
            snap = sched.plan(batch, {s.row for s in new})
            replay()
            batches[batch] += 1
            pending.append((snap, readout(a, batch)))
            if stop_event is not None and stop_event.is_set():
                stopped = True
        if not pending:
            break
        snap, item = pending.popleft()
        finished = sched.take(snap, collect(item))
        done += len(finished)
        produced = sum(len(s.tokens) for s in sched.seqs)
        if on_tokens is not None:
            on_tokens(done, produced)
        if stop_event is not None and stop_event.is_set():
            stopped = True


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _groups(seqs: list[Sequence], budget: int) -> list[list[Sequence]]:
    """Consecutive runs of (length-sorted) sequences whose padded size stays within ``budget``
    tokens (a single longer prompt makes a group of its own)."""
    out: list[list[Sequence]] = []
    cur: list[Sequence] = []
    for s in seqs:
        length = _round_up(len(s.prompt), 16)
        if cur and (len(cur) + 1) * length > budget:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out
