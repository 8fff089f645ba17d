"""When a runner's step compiles, and which step it keeps: measured, never assumed.

A runner (the batch-1 ``FastDecoder``, the rows ``BatchedDecoder``) captures its uncompiled step
first (seconds) and counts the seconds it decodes on it. The compile (many seconds cold, fewer from
artifacts on disk) waits until that decoding has shown a faster step would pay for it
(``FastOptions.compile_after``), or until asked for (``compile_next``, ``prepare``).

Compiling does not always make the step faster: inductor's fused kernels beat nvkit's uncompiled
step on some shapes and lose on others (on a large layer the uncompiled step's cuBLAS products
stream the weights better than inductor's reductions). So when a compiled graph is captured, the
runner replays it and the uncompiled graph of the same shape in alternation on the same buffers
(``time_replays``) and keeps the faster (``decide``); the other is dropped. A step kept uncompiled
by that measurement stays so for the runner's life (later caches and batch classes capture the
uncompiled step at once), and the stats line says which step runs and the two rates.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass
from typing import Callable

#: replays per variant and round of the measurement, and rounds (alternating variants)
PROBE_REPLAYS = 6
PROBE_ROUNDS = 3


@dataclass(frozen=True)
class Verdict:
    """One measurement: seconds per replay of the uncompiled and the compiled graph."""
    uncompiled: float
    compiled: float

    @property
    def keep_compiled(self) -> bool:
        return self.compiled < self.uncompiled

    def words(self, tokens_per_replay: int) -> str:
        """"measured 314 against 280 tok/s" (the kept step's rate first)."""
        rate = lambda s: tokens_per_replay / s if s > 0 else float("inf")  # noqa: E731
        kept, other = (self.compiled, self.uncompiled) if self.keep_compiled else (self.uncompiled, self.compiled)
        other_name = "uncompiled" if self.keep_compiled else "compiled"
        return f"measured {rate(kept):,.0f} tok/s against {rate(other):,.0f} {other_name}"


def compile_fullgraph(fn: Callable, **options) -> Callable:
    """``torch.compile(fn, fullgraph=True, **options)`` on a copy of ``fn`` with a code object of
    its own.

    Why: Dynamo keeps what it compiled for a function on the function's code object, and under
    ``fullgraph`` a code object that has been compiled ``torch._dynamo.config.recompile_limit``
    times (8) is a hard error. The steps are closures that one factory makes per model and
    adapter state (the weights are in the closure), so they share one code object: each model a
    session loads adds variants to it, and the ninth model's compile failed. A copy per compile
    keeps each runner's variants to itself, and they go when the runner drops the step. A
    fullgraph graph break would put the host back inside the step, hence fullgraph always."""
    import torch
    if isinstance(fn, types.FunctionType):
        copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__, copy.__qualname__ = fn.__kwdefaults__, fn.__qualname__
        copy.__dict__.update(fn.__dict__)
        fn = copy
    return torch.compile(fn, fullgraph=True, **options)


class CompilePolicy:
    """The compile state of one runner: seconds decoded uncompiled, whether a compile was asked
    for, whether a compiled step runs, why a compile failed, and the measurements per step kind
    (``lora_on``: the base step and the adapters' step are measured apart)."""

    def __init__(self, options):
        self.options = options
        #: seconds of requests decoded on graphs of the uncompiled step
        self.uncompiled_seconds = 0.0
        self.compiled = False          # a compiled step was kept and runs
        self.error: str | None = None  # why torch.compile failed (then the uncompiled step stays)
        self.detail: str | None = None  # the whole message (inductor's carry the worker's traceback)
        self.verdicts: dict[bool, Verdict] = {}
        #: False: keep a compiled step without measuring it (the decode benchmark's variants)
        self.measure = True
        self._next = False

    @property
    def enabled(self) -> bool:
        return bool(self.options.compile)

    def declined(self, lora_on: bool) -> bool:
        """The compiled step of this kind was measured slower and is not used."""
        v = self.verdicts.get(lora_on)
        return v is not None and not v.keep_compiled

    def waiting(self, graphs: bool) -> bool:
        """The step runs uncompiled and would compile once due (not compiled yet, not turned off,
        no failed compile, not measured slower)."""
        return bool(self.enabled and graphs and not self.compiled and not self.error and not self.verdicts)

    def due(self, graphs: bool, lora_on: bool) -> bool:
        """Whether the next expensive capture compiles the step: the uncompiled one has decoded
        ``compile_after`` seconds, ``compile_next`` asked for it, or a step was compiled already
        (another cache, the adapters' step) — unless this kind was measured faster uncompiled."""
        if not (self.enabled and graphs) or self.error or self.declined(lora_on):
            return False
        return self._next or self.compiled or self.uncompiled_seconds >= self.options.compile_after

    def compile_next(self) -> None:
        """Compile at the next capture, whatever has been decoded."""
        self._next = True

    def failed(self, summary: str, detail: str) -> None:
        self.error, self.detail = summary, detail

    def decide(self, lora_on: bool, verdict: Verdict | None) -> bool:
        """After a capture that compiled (``verdict``: its measurement, None when not measured):
        whether the compiled step is kept."""
        self._next = False
        if verdict is not None:
            self.verdicts[lora_on] = verdict
            if not verdict.keep_compiled:
                return False
        self.compiled = True
        return True

    def words(self, uncompiled_how: str, regional: bool, tokens_per_replay: int, kind=None) -> str:
        """How the step runs, for the stats line: with ``kind`` (a key of ``verdicts``), the step
        kept for that kind and its measurement; else the base step's measurement where there is one."""
        if kind is None:
            v, compiled = self.verdicts.get(False) or next(iter(self.verdicts.values()), None), self.compiled
        else:
            v = self.verdicts.get(kind)
            compiled = v.keep_compiled if v is not None else self.compiled
        measured = f" ({v.words(tokens_per_replay)})" if v is not None else ""
        if compiled:
            return ("compiled by layer" if regional else "compiled") + measured
        if self.error:
            return f"eager: torch.compile failed ({self.error})"
        if measured:
            return uncompiled_how + measured
        if self.enabled:
            return f"{uncompiled_how} (compiled once it has decoded {self.options.compile_after:g} s)"
        return uncompiled_how


def time_replays(variants: dict[str, Callable[[], None]], reset: Callable[[], None], sync: Callable[[], None],
                 replays: int = PROBE_REPLAYS, rounds: int = PROBE_ROUNDS,
                 clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Seconds per replay of each variant: ``rounds`` rounds, the variants in alternation (a
    clock drift or a neighbour's load hits both), ``replays`` replays each after one untimed;
    the fastest round counts. ``reset`` puts the buffers back before each variant's turn."""
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
        for name, replay in variants.items():
            reset()
            replay()
            sync()
            t = clock()
            for _ in range(replays):
                replay()
            sync()
            best[name] = min(best[name], (clock() - t) / replays)
    reset()
    return best
