"""``BatchedDecoder``: many prompts at once on one GPU — nvkit's fused step over B rows, K decode
steps per CUDA-graph replay, a paged KV cache sized to the request, and continuous refill.

Why: a decode step of a small model at batch 64 reads the same weights as at batch 1, so B rows
per step cost little more than one; what limits the rate is how many steps the GPU runs per second
and how many of its rows hold real work. Here:

- **a ladder of graph classes** (``paged_cache.ladder``: 1, 4, 16, 64, 256 rows): class B runs rows
  0..B-1 of the row buffers, each at its own position (read from the device; a row without a
  sequence parked on a scratch page), a step the smallest class that holds its rows; the first
  list captures the rungs up to 64 (``_replay_for``); one compile serves every class.
- **a paged KV cache sized to the request**: a sequence holds pages for its prompt and its new
  tokens from admission to release (``schedule``), and the pool holds what the rows running at
  once need (all of them when every prompt has a row), not rows × the longest request.
- **continuous refill**: between replays the host gives a finished sequence's row and pages to the
  next waiting prompt — even before its last ids are read, when its length alone says it is done —
  prefills the new prompts together (grouped by length, each group padded to its longest; the
  prefill compiled once for every group shape, ``prefill_rows``) and writes them into their rows;
  when the queue is empty the rows are packed into a smaller class.
- **sampling per request inside the graph** (``sampling.choose_rows``): greedy, or temperature,
  top-k and top-p with a draw made from each request's own seed and the position it samples, so a
  request's text depends on its seed and never on which prompts share its batch.

The host loop is pipelined like the batch-1 path's (the next replay queued before the ids of the
one before are read). The weights and adapters are the batch-1 decoder's (``FastDecoder.weights``):
its LoRA buffers, or the copy it merged them into, whose rows step is the base step over the copy
(the base kernels and rate, and a prompt's tokens those it gets alone, from the same weights).
``graphs=False`` runs the same code without capture or compile, for checking on a CPU.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from ... import events
from ...errors import NvkitError
from ...memory.estimate import kv_bytes_per_token
from . import cuda_graphs as graphs_mod, lora as lora_mod, prefill_rows, rows_replay
from .compile_policy import compile_fullgraph
from .paged_cache import (CLASSES, FIRST_WIDTH, MAX_ROWS, PAGE, UPFRONT_ROWS, Arena, RowsKey, ladder, new_arena, plan,
                          pool_for, prefill_budget, prefill_bytes_per_token)
from .single import FastDecoder
from .llama_step import decode_head
from .llama_rows_step import decode_rows_step, mark_dynamic, model_decode_rows_layer, prefill_rows_step
from .replay import ticking
from .runner import GraphRunner, KeptReplay
from .sampling import RowParams, Sampling, StopStrings, choose_rows
from .schedule import SCRATCH, Scheduler, Sequence, pages_for


class BatchedDecoder(GraphRunner):
    """Decoding of many prompts at once on one GPU (see the module docstring).

    ``single``: the session's batch-1 ``FastDecoder``, whose options, fused weights and adapter
    buffers this one shares. ``graphs=False`` (default: as ``single``) runs without CUDA graphs
    or compile, for checking on a CPU. ``max_rows``: rows at once (a class of ``CLASSES``).
    ``prefill_tokens``: padded prompt tokens per prefill forward (None: ``paged_cache.prefill_budget``
    of the request's pool)."""

    label = "fast batch"

    def __init__(self, single: FastDecoder, *, graphs: bool | None = None, max_rows: int = MAX_ROWS,
                 prefill_tokens: int | None = None):
        self._fits(single)
        if max_rows not in CLASSES:
            raise NvkitError(f"max_rows must be one of {CLASSES}, not {max_rows!r}.")
        if prefill_tokens is not None and (type(prefill_tokens) is not int or prefill_tokens < 16):
            raise NvkitError(f"prefill_tokens must be a whole number ≥ 16, or None, not {prefill_tokens!r}.")
        super().__init__(single.model, single.options, single.variant, single.graphs if graphs is None else graphs,
                         single.device, kernels=single.kernels)
        self.single = single
        self.max_rows = max_rows
        self.prefill_tokens = prefill_tokens
        self.attention, self.attention_why = self._choose_attention(self.options.attention)
        self._fw = None
        #: the adapters of the request running now (``lora.AdapterWeights``; None: no adapter on)
        self._lora = None
        self._lora_built = None    # the adapters the LoRA steps were built on
        self._arena: Arena | None = None
        self._steps: dict = {}       # LoRA on? -> the eager rows step
        self._compiled: dict = {}    # LoRA on? -> its torch.compile wrapper
        self._prefills: dict = {}    # LoRA on? -> its RowsPrefill
        self._prefill_now = False    # compile_prefill_next() was called
        self._warm: set = set()      # LoRA on? values whose step was compiled (or captured eagerly) once
        #: LoRA on? values whose compiled step was captured once (its compile is paid for)
        self._compiled_once: set = set()
        #: (LoRA on?, batch class) -> whether the compiled step is kept there: measured per class,
        #: since the compiled step can lose on a row or two and win on a full list
        self._kept: dict = {}
        self.last_batches: collections.Counter = collections.Counter()  # batch class -> replays, last request

    def _fits(self, single: FastDecoder) -> None:
        if not single.fused:
            raise NvkitError("The batched fast path runs nvkit's fused decode step, which "
                             f"{'is turned off (fused=False)' if single.fused_why is None else 'does not fit this model: ' + single.fused_why}.")

    def _choose_attention(self, asked: str) -> tuple[str, str | None]:
        """("paged" | "matmul", why "auto" did not take the kernel). The paged kernel applies the
        q/k norms itself, so it needs per-head RMS norms (or none) and a power-of-two head size."""
        if asked == "matmul":
            return "matmul", None
        why = self.paged_why(asked)
        if why is None:
            return "paged", None
        if asked != "auto":
            raise NvkitError(f"The batched path's paged Triton attention cannot run: {why}.")
        return "matmul", why

    def describe(self) -> str:
        """How this decoder runs, in a few words for the stats line."""
        parts = [f"fused step over rows, {self._class_how()}", f"{self.attention} attention"]
        parts += filter(None, [prefill_rows.describe(list(self._prefills.values()), self.options.prefill_after)])
        if self._lora is not None:
            parts.append(self._lora.words)
        if self.last_batches:
            parts.append("batch " + "/".join(str(b) for b in sorted(self.last_batches, reverse=True)))
        parts.append(f"{self.k} steps per replay")
        return ", ".join(parts)

    def _class_how(self) -> str:
        """How the last request's largest batch class ran: the step kept there and its measurement."""
        cls = ((self._lora is not None), max(self.last_batches)) if self.last_batches else None
        if cls not in self._kept:
            return self._how(self.variant.regional)
        return self._how(self.variant.regional, kind=cls, tokens_per_replay=self.k * cls[1])

    # --- the model's state -------------------------------------------------------------------------
    def _adopt(self) -> bool:
        """The weights and adapters as the batch-1 decoder has them now; returns whether adapters run."""
        fw, lora = self.single.weights()
        if fw is None:
            raise NvkitError("The batched fast path needs nvkit's fused decode step, which no longer fits this model.")
        if fw is not self._fw:  # first use, or the weights were rebuilt: nothing built on the old ones holds
            self._drop_arena()
            self._forget_steps(None)
            self._fw = fw
        if lora is not None and not lora.same(self._lora_built):  # new buffers (a larger rank) or a new copy
            self._forget_steps(True)
            self._lora_built = lora
        elif lora is None and self._lora_built is not None and not lora_mod.attached(self.model):
            self._forget_steps(True)  # the adapters are gone: steps on their merged copy would keep it
            self._lora_built = None
        self._lora = lora
        return lora is not None

    def _reads(self, lora_on: bool):
        """(the fused weights, the adapter buffers or None) a step with ``lora_on`` reads."""
        return (self._lora.weights, self._lora.slots) if lora_on and self._lora is not None else (self._fw, None)

    def _forget_steps(self, lora_on: bool | None) -> None:
        """Drop the steps (and their graphs) built for ``lora_on`` (None: all of them)."""
        for d in (self._steps, self._compiled, self._prefills):
            for key in [k for k in d if lora_on is None or k == lora_on]:
                del d[key]
        self._warm = {k for k in self._warm if lora_on is not None and k != lora_on}
        self._compiled_once = {k for k in self._compiled_once if lora_on is not None and k != lora_on}
        self._kept = {c: v for c, v in self._kept.items() if lora_on is not None and c[0] != lora_on}
        a = self._arena
        if a is not None:
            a.drop_graphs(lambda g: lora_on is None or g.lora == lora_on)

    def captured(self, mode: tuple) -> bool:
        """The current pool holds a graph of sampling ``mode`` (``Sampling.key``) for the adapters'
        state the batch-1 decoder has now: a list that fits the pool waits for no capture."""
        a = self._arena
        lora_on = lora_mod.active(self.model)
        return a is not None and any(k.sampling == mode and k.lora == lora_on for k in a.graphs)

    def _forget_kernel_steps(self) -> None:
        self._steps.clear()
        self._prefills.clear()  # built with the kernels too

    def _forget_attention_steps(self) -> None:
        self._forget_steps(None)

    # --- memory ----------------------------------------------------------------------------------
    def _page_bytes(self) -> int:
        return kv_bytes_per_token(self.model.config, self._fw.embed.element_size()) * PAGE

    def prefill_tokens_for(self, a: Arena) -> int:
        """Padded prompt tokens per prefill forward in the pool ``a`` (see ``prefill_tokens``)."""
        if self.prefill_tokens is not None:
            return self.prefill_tokens
        fw = self._fw
        per_token = prefill_bytes_per_token(fw.embed.shape[1], fw.nh, fw.nkv, fw.hd, fw.intermediate,
                                            fw.embed.element_size())
        return prefill_budget(a.pages * self._page_bytes(), per_token)

    def plan(self, prompt_lens: list[int], max_new: int, free_bytes: int | None = None) -> tuple[int, int]:
        """(rows, pool pages incl. the scratch page) for prompts of these lengths (``paged_cache.plan``)."""
        return plan(prompt_lens, max_new, self.max_rows, self._page_bytes() if free_bytes is not None else 0,
                    free_bytes)

    def _arena_for(self, seqs: list[Sequence], max_new: int, penalty: bool) -> Arena:
        """The pool and row buffers the request runs in: the session's own whenever it holds the
        request, else a new one that holds the old one's and grows (``paged_cache.pool_for``)."""
        import torch
        a = self._arena
        free = (torch.cuda.mem_get_info(self.device)[0] + (self._arena_bytes(a) if a is not None else 0)
                if self.device.type == "cuda" else None)
        rows, pages = self.plan([len(s.prompt) for s in seqs], max_new, free)
        width = pages_for(max(len(s.prompt) for s in seqs) + max_new + 2 * self.k + 2, PAGE)
        # wide page tables where attention reads each row only up to its position (the paged
        # kernel: "matmul" attends over the whole table width)
        first_width = min(self.max_positions, FIRST_WIDTH) if self.attention == "paged" else 0
        new = pool_for(a, rows, pages, width, penalty, self._page_bytes(), free, self.max_rows, first_width)
        if new is None:
            return a
        pages, cls, width, penalty = new
        if a is not None:
            events.record("compile", f"fast batch: a pool of {pages} pages replaces {a.pages}; its graphs are captured again")
        self._drop_arena()
        self._arena = new_arena(self._fw, pages, cls, width, self.k, self.vocab, penalty, self.device)
        return self._arena

    def _arena_bytes(self, a: Arena) -> int:
        return a.pages * self._page_bytes() + (a.seen.numel() if a.seen is not None else 0)

    def _drop_arena(self) -> None:
        a, self._arena = self._arena, None
        if a is not None:
            a.drop_graphs()  # uncaptured bodies (graphs=False) hold the arena: no cycle left behind

    # --- the steps and their graphs ----------------------------------------------------------------
    def _step(self, lora_on: bool) -> Callable:
        if lora_on not in self._steps:
            fw, slots = self._reads(lora_on)
            self._steps[lora_on] = decode_rows_step(fw, self.attention, PAGE, slots, kernels=self.kernels)
        return self._steps[lora_on]

    def _prefill_fn(self, lora_on: bool) -> Callable:
        if lora_on not in self._prefills:
            self._prefills[lora_on] = prefill_rows.RowsPrefill(
                prefill_rows_step(*self._reads(lora_on), kernels=self.kernels),
                compile=bool(self.options.compile and self.graphs), page=PAGE, scratch=SCRATCH,
                # no coordinate-descent tuning: it pays on the batch-1 step's matrix-vector products,
                # while the prefill's matrix products go to cuBLAS and its fused elementwise kernels
                # are tuned well enough by inductor's heuristics; tuning them would only lengthen the compile
                inductor=lambda: self.inductor_options(True, tune=False),
                restore=lambda: self.restore_artifacts(self._disk_key(lora_on, "prefill")),
                store=lambda: self.store_artifacts(self._disk_key(lora_on, "prefill")),
                timings=self.timings, compile_after=0.0 if self._prefill_now else self.options.prefill_after)
        return self._prefills[lora_on]

    @property
    def prefill_waiting(self) -> bool:
        """The prompt prefill still runs eagerly, its compile not yet due (``FastOptions.prefill_after``)."""
        return any(p.waiting for p in self._prefills.values())

    def compile_prefill_next(self) -> None:
        """From now on the prompt prefill compiles at its next call, however little it has run
        eagerly (``FastOptions.prefill_after``): for a warm-up that should leave everything compiled."""
        self._prefill_now = True
        for p in self._prefills.values():
            p.compile_next()

    def _compiled_step(self, lora_on: bool):
        if lora_on not in self._compiled:
            # the sizes that change from one class or pool to the next are marked dynamic, so one
            # compile serves them all
            fw, slots = self._reads(lora_on)
            if self.variant.regional:  # one layer compiled serves every layer; the step around it is captured per class
                layer = compile_fullgraph(model_decode_rows_layer(fw, self.attention, PAGE))
                self._compiled[lora_on] = decode_rows_step(fw, self.attention, PAGE, slots, layer=layer,
                                                           head=compile_fullgraph(decode_head(fw)))
            else:  # the step of torch operations, for inductor to fuse
                self._compiled[lora_on] = compile_fullgraph(decode_rows_step(fw, self.attention, PAGE, slots))
        return self._compiled[lora_on], True

    def _body(self, a: Arena, key: RowsKey, fn, dynamic: bool):
        import torch
        k, batch = self.k, key.batch
        mark = dynamic and not self.variant.regional  # a step compiled by layer marks each layer's sizes itself

        def body():
            tok, pos, table = a.tok[:batch], a.pos[:batch], a.table[:batch]
            if mark:
                mark_dynamic(tok, pos, table, a.cos, a.sin, a.keys, a.values)
            p = RowParams(temperature=a.temperature[:batch], top_p=a.top_p[:batch], penalty=a.penalty[:batch],
                          seed=a.seed[:batch], counter=None, min_pos=a.min_pos[:batch], eos_mask=a.eos_mask,
                          seen=a.seen[:batch] if a.seen is not None else None)
            out = a.out[:batch]
            out[:, 0].copy_(tok)
            for i in range(k):
                logits = fn(tok, pos, table, a.cos, a.sin, a.keys, a.values)
                p.counter = pos + 1
                nxt = choose_rows(logits, key.sampling, p)
                out[:, i + 1].copy_(nxt)
                tok.copy_(nxt)
                torch.clamp(p.counter, max=a.cap, out=pos)
        return body

    def _capture(self, a: Arena, key: RowsKey, compiling: bool):
        """The class's graph on the compiled step or the uncompiled one (with the fall-backs of
        ``GraphRunner.capture_or_fall_back``); returns (graph, whether it runs the compiled step)."""
        import torch
        if a.pool is None:
            a.pool = torch.cuda.graph_pool_handle()

        def capture(compiling: bool):
            fn, dynamic = self._compiled_step(key.lora) if compiling else (self._step(key.lora), False)
            return graphs_mod.capture(self.device, self._body(a, key, fn, dynamic), a.pos.zero_, compiling=dynamic,
                                      warmups=graphs_mod.warmups(dynamic), inductor=self.inductor_options(dynamic),
                                      pool=a.pool, timings=self.timings)

        def clean():
            a.table.fill_(SCRATCH)  # a failed warm-up may have left rows anywhere
            a.pos.zero_()
        return self.capture_or_fall_back(capture, compiling, clean)

    def _replay_for(self, a: Arena, batch: int, mode: tuple, lora_on: bool, on_progress=None):
        """(class, replay) for a step of class ``batch``: the smallest rung of the pool's ladder that
        holds it. While the step runs uncompiled, a pool's first graph of a sampling mode captures the
        rungs up to ``UPFRONT_ROWS`` at once, so no later list waits; another when first needed."""
        key = RowsKey(next(c for c in ladder(a.rows) if c >= batch), mode, lora_on)
        if (key not in a.graphs and lora_on not in self._compiled_once and not self.compile_due(lora_on)
                and not any(k.sampling == mode and k.lora == lora_on for k in a.graphs)):
            for c in (c for c in ladder(a.rows) if c <= UPFRONT_ROWS):
                self._graph(a, key._replace(batch=c), on_progress)
        return key.batch, self._graph(a, key, on_progress)

    def _graph(self, a: Arena, key: RowsKey, on_progress=None):
        """The graph of ``key``'s batch class. Once the compiled step is due (or paid for), each
        class is measured once, compiled against uncompiled, and keeps the faster."""
        import torch
        lora_on = key.lora
        cls = (lora_on, key.batch)
        kept = self._kept.get(cls)
        paid = lora_on in self._compiled_once
        measure_now = kept is None and (paid or self.compile_due(lora_on))
        if key in a.graphs and not measure_now:
            return a.graphs[key]
        compiling = measure_now or bool(kept)
        expensive = lora_on not in self._warm or (compiling and not paid)
        if not self.graphs:
            a.graphs[key] = self._body(a, key, self._step(lora_on), False)
            self._warm.add(lora_on)
            self.counts["compiles" if expensive else "graphs"] += 1
            return a.graphs[key]
        events.record("compile", f"fast batch: capturing {self.k} steps of {key.batch} rows per graph"
                                 f" ({key.sampling[0]}{', LoRA' if lora_on else ''})"
                                 + (" with torch.compile, once per session" if expensive and compiling else ""))
        t = time.perf_counter()
        before = dict(self.timings)
        disk_key = self._disk_key(lora_on) if expensive and compiling else None
        torch.cuda.synchronize(self.device)  # what is in flight ends before the rows are parked for the capture
        saved = a.save_and_park_all()
        restored = False
        verdict = None
        try:
            with ticking(on_progress if expensive else None):
                restored = self.restore_artifacts(disk_key)
                graph, compiled = self._capture(a, key, compiling)
                if compiled:
                    self._compiled_once.add(lora_on)
                if compiled and measure_now:
                    verdict, graph, compiled = self._measured(a, key, graph)
        finally:
            torch.cuda.synchronize(self.device)
            a.restore(saved)
        if compiling and (compiled or verdict is not None):
            self._kept[cls] = compiled
        if lora_on in self._compiled_once and not paid:
            # the first compiled capture: the other graphs ran the uncompiled step unmeasured (or,
            # another sampling mode of this class, not the step kept here), so each is captured
            # again, and its class measured, when next used
            a.drop_graphs(lambda g: g.lora == lora_on and g != key and self._kept.get((g.lora, g.batch)) is not False)
        self.counts["compiles" if expensive else "graphs"] += 1
        self._warm.add(lora_on)
        if expensive and (compiled or verdict is not None):
            self.store_artifacts(disk_key)
        seconds = time.perf_counter() - t
        self.capture_seconds[tuple(key)] = seconds
        self.record_ready(f"{key.batch} rows", seconds, compiled, restored, verdict, self.k * key.batch, before)
        a.graphs[key] = graph.replay
        return a.graphs[key]

    def _measured(self, a: Arena, key: RowsKey, graph):
        """The compiled ``graph`` against the uncompiled one of the same class, timed with every
        row parked (``GraphRunner.keep_faster``). A graph already at ``key`` is the uncompiled
        step's: a measured class is never measured again."""
        return self.keep_faster(graph, a.graphs.get(key), lambda: self._capture(a, key, False)[0].replay,
                                a.pos.zero_, (key.lora, key.batch), self.k * key.batch, f"at {key.batch} rows")

    def _disk_key(self, lora_on: bool, part: str = "step") -> str | None:
        """The artifacts' key of the rows step or ("prefill") of the prompt prefill: each is
        compiled on a call of its own, so each has its own file."""
        extra = {"regional": True} if self.variant.regional else {}  # the whole-step compile's keys stay as they were
        if part != "step":
            extra["part"] = part
        slots = self._reads(lora_on)[1]
        if lora_on and slots is None:
            extra["lora_merged"] = True  # the base step's code over the adapters' copy, kept apart
        return self.disk_key(slots, batched=True, page=PAGE, **extra)

    # --- the public side ---------------------------------------------------------------------------
    def release(self) -> None:
        """Drop the pool, its graphs and the compiled steps (memory back to the allocator)."""
        with self._lock:
            self._drop_arena()
            self._forget_steps(None)
            self._fw = self._lora = self._lora_built = None

    def generate(self, prompts: list[list[int]], sampling: Sampling, seeds: list[int] | None = None, *,
                 stop_event: threading.Event | None = None, tokenizer=None,
                 on_progress: Callable[[float], None] | None = None,
                 on_tokens: Callable[[int, int], None] | None = None) -> list[list[int] | None]:
        """Decode up to ``sampling.max_new_tokens`` new ids after each prompt (lists of ids).

        Returns, in input order, each prompt's new ids (EOS included when reached), or None for a
        prompt not finished when ``stop_event`` was set. ``seeds``: one per prompt for sampling
        (default 0, 1, 2, …). ``on_tokens(prompts done, ids produced)`` after each replay read;
        ``on_progress(seconds)`` about once a second while a compile runs. ``tokenizer`` is
        needed for ``sampling.stop_strings``."""
        if not prompts:
            return []
        if sampling.stop_strings and tokenizer is None:
            raise NvkitError("stop_strings need the tokenizer: BatchedDecoder.generate(..., tokenizer=tok).")
        if any(len(p) == 0 for p in prompts):
            raise NvkitError("Every prompt needs at least one token.")
        seeds = list(range(len(prompts))) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise NvkitError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one per prompt.")
        longest = max(len(p) for p in prompts) + sampling.max_new_tokens
        if longest > self.max_positions:
            raise NvkitError(f"The longest prompt plus max_new_tokens needs {longest} positions; the model handles "
                             f"{self.max_positions}. Shorten the prompt or ask for fewer tokens.")
        with self._lock:
            lora_on = self._adopt()
            seqs = [Sequence(i, list(p), sampling.max_new_tokens, int(seeds[i]),
                             StopStrings(tokenizer, sampling.stop_strings, p) if sampling.stop_strings else None)
                    for i, p in enumerate(prompts)]
            a = self._arena_for(seqs, sampling.max_new_tokens, sampling.repetition_penalty != 1.0)
            self._fw.rotary_for(a, max(len(p) for p in prompts))
            rows_replay.set_request(a, sampling, self.vocab)
            sched = Scheduler(seqs, a.rows, a.pages, PAGE, self.k, sampling.eos)
            before = dict(self.timings)
            t = time.perf_counter()
            self.last_batches = collections.Counter()
            rows_replay.run(a, sched, lambda batch: self._replay_for(a, batch, sampling.key, lora_on, on_progress),
                            lambda new: rows_replay.prefill(a, new, sampling, self._prefill_fn(lora_on),
                                                            self.prefill_tokens_for(a), on_progress),
                            stop_event, on_tokens, self.last_batches)
            if lora_on not in self._compiled_once:  # the list's decoding, its captures left out
                prepared = sum(self.timings.since(before).values())
                self.uncompiled_seconds += max(0.0, time.perf_counter() - t - prepared)
            return [s.tokens if s.finished else None for s in seqs]
