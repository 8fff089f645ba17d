"""Capturing a step into a CUDA graph, shared by the batch-1 and the batched decoder, and the
seconds each part of preparing the fast path took (``Timings``).

A first request waits for the whole preparation, so where that time goes (loading the compile
artifacts, compiling and warming up, the capture itself, the prefill graphs, writing the
artifacts) is kept per decoder: the stats, the event log and the session benchmark say it, and a
slow start can be told from a slow compile without a profiler.
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Callable

#: the parts, in the order a preparation meets them (``Timings.describe`` keeps this order)
PARTS = ("set-up", "compile artifacts from disk", "compile prefill", "compile and warm-up", "warm-up", "capture", "measure",
         "prefill graphs", "compile artifacts to disk")


class Timings(collections.Counter):
    """Seconds per part of the preparation, summed over the decoder's life."""

    @contextlib.contextmanager
    def part(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self[name] += time.perf_counter() - t

    def since(self, before: dict) -> "Timings":
        """What was added after ``before`` (a copy taken earlier)."""
        out = Timings()
        for k, v in self.items():
            d = v - before.get(k, 0.0)
            if d > 0:
                out[k] = d
        return out

    def describe(self, at_least: float = 0.05) -> str:
        """"compile and warm-up 9.1 s, capture 0.6 s"; parts under ``at_least`` seconds are left out."""
        names = [p for p in PARTS if p in self] + sorted(k for k in self if k not in PARTS)
        return ", ".join(f"{k} {self[k]:.1f} s" for k in names if self[k] >= at_least)


def warmups(compiling: bool) -> int:
    """Warm-up runs before a capture: a compiled step's first runs compile, autotune and settle
    inductor's allocations; an eager step (nvkit's kernels or torch's operations) only needs its
    kernels compiled and loaded once, which one run does (the prefill graphs have always taken one)."""
    return 3 if compiling else 1


def capture(device, body: Callable[[], None], rewind: Callable[[], None], *, compiling: bool, warmups: int,
            inductor, pool=None, timings: Timings | None = None, parts: tuple[str, str] | None = None):
    """Run ``body`` ``warmups`` times on a side stream (the first run compiles and autotunes when
    ``compiling``; the others settle the allocator), then capture one run into a CUDA graph.
    ``rewind`` puts the buffers back before each run; ``inductor`` is the context of inductor
    options for the compiled step; ``pool`` shares the memory of graphs that never run at once.
    ``parts``: the ``timings`` names the warm-ups and the capture are counted under."""
    import torch
    timings = timings if timings is not None else Timings()
    warm_part, capture_part = parts or ("compile and warm-up" if compiling else "warm-up", "capture")
    with timings.part(warm_part):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), inductor:
            for _ in range(warmups):
                rewind()
                body()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
    with timings.part(capture_part):
        rewind()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.current_stream(device)
        try:
            with own_blas_workspace(), torch.cuda.graph(graph, pool=pool):
                body()
        except BaseException:
            # torch.cuda.graph leaves its capture stream current when the capture fails to begin
            # or to end, and the generator in capture mode (release_generator): both put back, so
            # what the session runs next (a fallback, the user's next cell) runs as before
            torch.cuda.set_stream(stream)
            release_generator(device)
            raise
        torch.cuda.synchronize(device)
    return graph


@contextlib.contextmanager
def own_blas_workspace():
    """cuBLAS keeps one workspace per (handle, stream), and every ``torch.cuda.graph`` captures on
    the same stream unless told otherwise: a graph captured after another one would bake in the
    other's workspace, which lives in the other graph's memory pool, and destroying any graph
    captured on that stream (torch clears the stream's workspaces then), or a compiled model's
    CUDA graph trees (they clear them all), would leave it pointing at freed memory. Clearing the
    cached workspaces before the capture makes it allocate its own inside its own pool, alive as
    long as the graph is; clearing them after keeps eager work and other captures out of it.
    (torch's CUDA graph trees do the same around their captures.)"""
    import torch
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()


def drop(graphs: dict, pool, which: Callable[[tuple], bool] | None = None):
    """Drop the graphs (key -> replay) whose key ``which`` accepts (None: all) from ``cuda_graphs``,
    which share the memory pool ``pool``; returns the pool handle to keep: None once no graph is
    left, since the allocator frees a pool whose graphs are all gone and a capture into that
    handle again fails inside torch (an internal assert in the caching allocator)."""
    for key in [k for k in graphs if which is None or which(k)]:
        del graphs[key]
    return pool if graphs else None


def release_generator(device) -> None:
    """The device's default random generator out of capture mode after a capture that failed.

    A capture tells the generator it has begun before the allocator and the stream start it; when
    either fails there, nothing tells the generator it has ended, and every random draw on the
    device afterwards (sampling, dropout, transformers' own set-up) fails with "Offset increment
    outside graph capture". A clone of the generator's state (same seed and offset, not capturing)
    put in its place ends that; it changes nothing for a generator that was not stuck."""
    import torch
    index = torch.device(device).index
    gen = torch.cuda.default_generators[torch.cuda.current_device() if index is None else index]
    gen.graphsafe_set_state(gen.clone_state())
