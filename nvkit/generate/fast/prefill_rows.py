"""The batched path's prompt prefill, its layer compiled once for every layer and group shape
(``RowsPrefill``).

Why: the eager prefill of a group of prompts issues about fifty kernels per layer, most of them
small elementwise ones (the fp32 RMSNorms, RoPE, the KV-head repeat), and on a GPU the host spends
longer issuing them than the GPU spends running them: a 64-prompt request waits for its first
token mostly on Python. inductor fuses each layer's elementwise work into a few kernels, so the
host work shrinks with the kernel count and the GPU reads each activation once. What is compiled
is one decoder layer (``llama_rows_step.prefill_rows_layer``), called for every layer with that layer's
tensors: the compile is about one layer's worth, not the whole unrolled model's. The rows, the
padded length and the pool are dynamic dimensions, so one compile serves every group; a group of
one prompt runs with a second, empty row (its keys go to the scratch page) because torch
specialises a size of 1 and would compile again.

When the compile runs: the first call of a list compiles the rows' decode step already, and the
prefill's compile would about double that wait, to save a few tenths of a second of host work
per call. So the prefill runs eagerly until it has spent ``compile_after`` seconds of host time
that way in this decoder (``FastOptions.prefill_after``: about what the compile costs, so the eager
calls never cost more than compiling at once would have), and compiles at its next call. Artifacts
of an earlier compile on disk are read then; they shorten the compile by a part only, so they do not
bring it forward. ``compile_after=0`` compiles at the first call.

Compiling is kept only where it measures faster (``compile_policy``'s rule): on the GPU the call
that compiles then runs the eager and the compiled prefill in alternation on its own prompts
(``MEASURE_CALLS`` each, timed to their end), and the slower is dropped for the decoder's life
(``declined`` says so). The measurement is paid once, inside the call that already waits for the
compile, so no later request runs a slower prefill to be timed. Running the prefill again on the
same prompts is harmless: it writes the same positions' keys again, and the kept kind runs last,
so the keys and the first tokens come from the prefill that stays.

A compile that fails gives way to the eager prefill for the rest of the decoder's life (the
reason stays in ``error``); the compile artifacts go to disk under a key of their own.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

from ... import events
from ...checks import number
from ...errors import error_summary
from .compile_policy import compile_fullgraph
from .replay import ticking

#: calls of each kind (compiled, eager) timed before the prefill keeps the faster
MEASURE_CALLS = 2


class RowsPrefill:
    """``prefill(ids, last, where, cos, sin, keys, values)`` as ``llama_rows_step.prefill_rows_step``
    returns it (``eager``), its layer compiled when ``compile`` (else the eager prefill itself).

    ``page`` and ``scratch`` (a page id whose contents are never read) place the keys of the empty
    row a one-prompt group gets. ``inductor``: a context-manager factory for the compile's inductor
    settings; ``restore``: loads earlier compile artifacts from disk (asked once, when the compile
    runs); ``store``: writes them after the compile; ``timings``: where
    the compile's seconds are counted ("compile prefill"). ``compile_after``: seconds of eager
    prefill before the compile (see the module docstring); ``clock``: where those seconds come from."""

    def __init__(self, eager: Callable, *, compile: bool, page: int, scratch: int,
                 inductor: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 restore: Callable[[], object] | None = None, store: Callable[[], object] | None = None,
                 timings=None, compile_after: float = 0.0, clock: Callable[[], float] = time.perf_counter):
        self.eager = eager
        self.page, self.scratch = page, scratch
        self.error: str | None = None
        self.compile_after = number("compile_after", compile_after, 0)
        self.eager_seconds = 0.0  # host time spent in the eager prefill while the compile waited
        self._inductor, self._restore, self._store, self._timings = inductor, restore, store, timings
        self._clock = clock
        self._fn = None
        self._first = True
        #: why the eager prefill was kept although compiled (measured slower), None otherwise
        self.declined: str | None = None
        #: measure compiled against eager after the compile: None on CUDA only (where the host
        #: time the compile saves is what a user waits for), True/False always/never
        self.measure: bool | None = None
        if compile:
            # the compiled layer is made when the compile is due: torch.compile imports the
            # compiler (about a second in a fresh process), which the eager calls before it never need
            self._fn = self._compile_and_call

    def _compile_and_call(self, ids, last, where, cos, sin, keys, values):
        self._fn = self.eager.with_layer(compile_fullgraph(self.eager.traced_layer))
        return self._fn(ids, last, where, cos, sin, keys, values)

    @property
    def compiled(self) -> bool:
        """The compiled prefill runs (its compile is done and did not fail or measure slower)."""
        return self._fn is not None and self.error is None and not self._first

    @property
    def waiting(self) -> bool:
        """The compile is wanted but has not run yet: the eager prefill runs meanwhile."""
        return self._fn is not None and self.error is None and self._first

    def compile_next(self) -> None:
        """Compile at the next call, whatever the eager prefill has spent (a warm-up on purpose)."""
        self.compile_after = 0.0

    def __call__(self, ids, last, where, cos, sin, keys, values, on_progress=None):
        if self._fn is None or self.error is not None:
            return self.eager(ids, last, where, cos, sin, keys, values)
        if self._first and self.eager_seconds < self.compile_after:
            t = self._clock()
            out = self.eager(ids, last, where, cos, sin, keys, values)
            self.eager_seconds += self._clock() - t
            return out
        rows = ids.shape[0]
        if rows == 1:
            ids, last, where = self._with_empty_row(ids, last, where)
        try:
            if self._first:
                events.record("compile", "fast batch: compiling the prompt prefill (once per session)")
                timed = self._timings.part("compile prefill") if self._timings is not None else contextlib.nullcontext()
                if self._restore is not None:
                    self._restore()
                with ticking(on_progress), timed, self._inductor():
                    out = self._fn(ids, last, where, cos, sin, keys, values)
                self._first = False
                if self._store is not None:
                    self._store()
                if self.measure or (self.measure is None and ids.device.type == "cuda"):
                    return self._measured(ids[:rows], last[:rows], where[:rows], cos, sin, keys, values)
            else:
                out = self._fn(ids, last, where, cos, sin, keys, values)
        except Exception as e:  # noqa: BLE001 - the eager prefill computes the same; say why and go on
            self.error = error_summary(e)
            events.record("compile", f"fast batch: the compiled prefill failed ({self.error}); prefilling eagerly")
            ids, last, where = ids[:rows], last[:rows], where[:rows]
            return self.eager(ids, last, where, cos, sin, keys, values)
        return out[:rows]

    def _measured(self, ids, last, where, cos, sin, keys, values):
        """Right after the compile: the eager and the compiled prefill of these prompts in
        alternation, each call timed to its end on the device; the slower is dropped. The kept
        kind runs last, so its keys are the ones in the cache; returns its first tokens."""
        import torch
        sync = (lambda: torch.cuda.synchronize(ids.device)) if ids.device.type == "cuda" else (lambda: None)
        calls = {"eager": lambda: self.eager(ids, last, where, cos, sin, keys, values),
                 "compiled": lambda: self._compiled_call(self._fn, ids, last, where, cos, sin, keys, values)}
        best = {k: float("inf") for k in calls}
        part = self._timings.part("measure") if self._timings is not None else contextlib.nullcontext()
        with part:
            for _ in range(MEASURE_CALLS):
                for kind, call in calls.items():
                    sync()
                    start = self._clock()
                    out = call()
                    sync()
                    best[kind] = min(best[kind], self._clock() - start)
                    if self.error is not None:  # the compiled call failed: the eager prefill stays
                        return self.eager(ids, last, where, cos, sin, keys, values)
            if best["compiled"] <= best["eager"]:
                return out  # the compiled call ran last
            per = {k: v / max(1, int(ids.numel())) * 1e6 for k, v in best.items()}  # ms per 1,000 tokens
            self.declined = f"measured {per['eager']:.2f} ms per 1,000 prompt tokens against {per['compiled']:.2f} compiled"
            events.record("compile", f"fast batch: the compiled prefill is slower here ({self.declined}); "
                                     "prefilling eagerly")
            self._fn = None
            return calls["eager"]()

    def _compiled_call(self, fn, ids, last, where, cos, sin, keys, values):
        rows = ids.shape[0]
        if rows == 1:
            ids, last, where = self._with_empty_row(ids, last, where)
        try:
            return fn(ids, last, where, cos, sin, keys, values)[:rows]
        except Exception as e:  # noqa: BLE001 - the eager prefill computes the same; say why and go on
            self.error = error_summary(e)
            events.record("compile", f"fast batch: the compiled prefill failed ({self.error}); prefilling eagerly")
            return self.eager(ids[:rows], last[:rows], where[:rows], cos, sin, keys, values)

    def _with_empty_row(self, ids, last, where):
        import torch
        length = ids.shape[1]
        pad = self.scratch * self.page + torch.arange(length, device=where.device) % self.page
        return (torch.cat([ids, torch.zeros_like(ids)]), torch.cat([last, torch.zeros_like(last)]),
                torch.cat([where, pad.to(where.dtype).unsqueeze(0)]))


def describe(prefills: list[RowsPrefill], after: float) -> str | None:
    """How the rows prefills ran, in a few words for the stats line (None: nothing to say yet);
    ``after``: the seconds of eager prefill before its compile (``FastOptions.prefill_after``)."""
    if any(p.error for p in prefills):
        return f"eager prefill: its compile failed ({next(p.error for p in prefills if p.error)})"
    if any(p.compiled for p in prefills):
        return "compiled prefill"
    if any(p.declined for p in prefills):
        return f"eager prefill ({next(p.declined for p in prefills if p.declined)})"
    if any(p.waiting for p in prefills):
        return f"eager prefill (compiled once it has run {after:g} s)"
    return None
