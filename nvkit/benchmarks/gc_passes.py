"""The full passes of Python's garbage collector inside a measured call (``full_passes``).

Why: a full pass walks every object the process holds (with torch, transformers and a model
loaded, about half a million) and nothing else runs meanwhile: tens to hundreds of milliseconds,
whenever enough objects have outlived the younger passes. One that lands inside a timed request
looks like a slow request, so the benchmarks that time what a user waits for say when one did.
"""

from __future__ import annotations

import contextlib
import gc
import time


class FullPasses(list):
    """Milliseconds of each full pass seen since it was made or last ``clear``ed."""

    def words(self) -> str:
        """"" with none, else e.g. "a full gc pass inside: 48 ms"."""
        if not self:
            return ""
        return (f"{'a full gc pass' if len(self) == 1 else f'{len(self)} full gc passes'} inside: "
                + ", ".join(f"{ms:.0f}" for ms in self) + " ms")


@contextlib.contextmanager
def full_passes():
    """``with full_passes() as passes:`` — ``passes`` (a ``FullPasses``) fills with the duration of
    each full pass that runs in the block, in any thread."""
    passes = FullPasses()
    started = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif info["generation"] == 2 and started:
            passes.append((time.perf_counter() - started[0]) * 1e3)

    gc.callbacks.append(on_gc)
    try:
        yield passes
    finally:
        gc.callbacks.remove(on_gc)
