"""The host side of a fast-path request: the pipelined graph replays and what the host checks
between them (EOS, stop strings, Stop), and the progress ticks while a compile runs.

Pipelined: the next replay is queued before the host reads the ids of the one before, so the GPU
is not idle while the host checks EOS and runs the callbacks (streamed text, progress). At most
two replays are in flight; the one queued past an EOS or a Stop is wasted work (the next request
starts over).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import Callable

from .static_cache import Cache


def replays(c: Cache, replay, first, sampling, *, on_tokens=None, stop_event=None, stops=None,
            kept: list | None = None) -> list[int]:
    """The host side of one request after its first token: replay the graph (K tokens each),
    hand each chunk to ``on_tokens``, stop at EOS, a stop string (``stops``), ``stop_event`` or
    ``sampling.max_new_tokens``; returns the new ids. ``kept``: a list that collects each step's
    logits (``FastDecoder.trace``; None, as requests run, copies none)."""
    eos = set(sampling.eos)
    pending: collections.deque = collections.deque()
    planned = 1  # tokens covered by the replays queued so far, if no EOS comes

    def queue_next() -> None:
        nonlocal planned
        if planned >= sampling.max_new_tokens or (stop_event is not None and stop_event.is_set()):
            return
        replay()
        pending.append(_readout(c, (planned - 1) // c.k, kept is not None))
        planned += c.k

    queue_next()  # before the first token's sync: the GPU goes on while the host streams it
    tokens: list[int] = []
    chunk = [int(first.item())]
    while True:
        chunk = chunk[:sampling.max_new_tokens - len(tokens)]
        done = False
        for i, t in enumerate(chunk):
            if t in eos:
                chunk, done = chunk[:i + 1], True
                break
        checked = len(tokens)
        tokens.extend(chunk)
        if stops is not None:
            keep = stops.cut(tokens, checked)
            if keep is not None:
                chunk, done = chunk[:keep - checked], True
                del tokens[keep:]
        if on_tokens and chunk:
            on_tokens(chunk)
        if done or not pending:
            break
        queue_next()
        chunk, logits_k = _collect(pending.popleft())
        if kept is not None:
            kept.extend(logits_k)
    _drain(pending)
    return tokens


def _readout(c: Cache, slot: int, keep_logits: bool) -> tuple:
    """Queue the copy of one replay's ids (and logits) to where the host reads them, ahead of
    the next replay overwriting them; ``_collect`` waits for it. On CUDA the ids go to one of
    two pinned buffers (two replays in flight at most) with an event to wait on."""
    import torch
    logits = [c.logits[i].clone() for i in range(c.k)] if keep_logits else []
    if c.out.device.type != "cuda":
        return c.out.clone(), None, logits
    if c.host is None:
        c.host = [(torch.empty(c.k, dtype=torch.long, pin_memory=True), torch.cuda.Event()) for _ in range(2)]
    host, done = c.host[slot % 2]
    host.copy_(c.out, non_blocking=True)  # on c.out's device's current stream, after the replay
    done.record(torch.cuda.current_stream(c.out.device))  # that stream, not the current device's
    return host, done, logits


def _drain(pending: collections.deque) -> None:
    """Wait for the replays queued past an EOS: nothing of this request runs on the GPU after
    it returns (a cache dropped next must not free a graph that is still replaying)."""
    while pending:
        _collect(pending.popleft())


def _collect(item: tuple) -> tuple[list[int], list]:
    host, done, logits = item
    if done is not None:
        done.synchronize()
    return host.tolist(), logits


@contextlib.contextmanager
def ticking(on_progress: Callable[[float], None] | None):
    """Call ``on_progress(seconds so far)`` now and about once a second until the block ends."""
    if on_progress is None:
        yield
        return
    stop = threading.Event()
    t0 = time.perf_counter()

    def tick():
        while True:
            try:
                on_progress(time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - a display callback must not break the capture
                pass
            if stop.wait(1.0):
                return

    th = threading.Thread(target=tick, name="nvkit-fast-progress", daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(5)
