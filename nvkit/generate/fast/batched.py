"""``BatchedDecoder``: many prompts at once on one GPU — nvkit's fused step over B rows, K decode
steps per CUDA-graph replay, a paged KV cache sized to the request, and continuous refill.

Why: a decode step of a small model at batch 64 reads the same weights as at batch 1, so B rows
per step cost little more than one; what limits the rate is how many steps the GPU runs per second
and how many of its rows hold real work. Here:

- **one graph per batch-size class** (``CLASSES``: 1, 2, 4, … 256): the graph of class B runs
  rows 0..B-1 of the row buffers, each row at its own position (ragged: every row reads its
  position and page table from the device). The step is compiled once for every class (the row
  axis, pool and table sizes are dynamic dimensions), then captured per class in a second or so;
  a batch of one is compiled apart (torch specialises a dimension of size 1).
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

The host loop is pipelined like the batch-1 path's: the next replay is queued before the ids of
the one before are read, two at most in flight. The weights (and LoRA buffers) are the batch-1
decoder's own (``FastDecoder.weights``): one fused copy per model, adapters run unmerged here too.
``graphs=False`` runs the same code without capture or compile, for checking on a CPU.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Callable

from ... import events
from ...errors import NvkitError, error_summary
from ...memory.estimate import attention_dims, kv_bytes_per_token
from . import artifacts, graphs as graphs_mod
from .arena import CLASSES, MAX_ROWS, MEMORY_SHARE, PAGE, Arena, batch_class, prefill_budget, prefill_bytes_per_token
from .capture import FastDecoder, inductor_options
from .fused import decode_head, qk_norm_why
from .fused_rows import decode_rows_layer, decode_rows_step, mark_dynamic, paged_positions, prefill_rows_step
from .prefill_rows import RowsPrefill
from .replay import ticking
from .sampling import RowParams, Sampling, StopStrings, choose_rows
from .schedule import SCRATCH, Scheduler, Sequence, pages_for
from .tier import CompileTier

def _to(device, data, dtype):
    """A host list as a tensor on ``device``, copied without waiting for the GPU's queue."""
    import torch
    t = torch.tensor(data, dtype=dtype)
    return t.to(device, non_blocking=True) if device.type == "cuda" else t


class BatchedDecoder(CompileTier):
    """Decoding of many prompts at once on one GPU (see the module docstring).

    ``single``: the session's batch-1 ``FastDecoder``, whose options, fused weights and adapter
    buffers this one shares. ``graphs=False`` (default: as ``single``) runs without CUDA graphs
    or compile, for checking on a CPU. ``max_rows``: rows at once (a class of ``CLASSES``).
    ``prefill_tokens``: padded prompt tokens per prefill forward (None: ``arena.prefill_budget``
    of the request's pool)."""

    def __init__(self, single: FastDecoder, *, graphs: bool | None = None, max_rows: int = MAX_ROWS,
                 prefill_tokens: int | None = None):
        if not single.fused:
            raise NvkitError("The batched fast path runs nvkit's fused decode step, which "
                             f"{'is turned off (fused=False)' if single.fused_why is None else 'does not fit this model: ' + single.fused_why}.")
        if max_rows not in CLASSES:
            raise NvkitError(f"max_rows must be one of {CLASSES}, not {max_rows!r}.")
        if prefill_tokens is not None and (type(prefill_tokens) is not int or prefill_tokens < 16):
            raise NvkitError(f"prefill_tokens must be a whole number ≥ 16, or None, not {prefill_tokens!r}.")
        self.single = single
        self.model = single.model
        self.options = single.options
        self.graphs = single.graphs if graphs is None else graphs
        self.device = single.device
        self.vocab = single.vocab
        self.max_positions = single.max_positions
        self.max_rows = max_rows
        self.prefill_tokens = prefill_tokens
        self.attention, self.attention_why = self._choose_attention(self.options.attention)
        self._fw = None
        self._lora = None          # the adapter buffers of the request running now (None: no adapter)
        self._lora_built = None    # the buffers the LoRA steps were built on
        self._arena: Arena | None = None
        self._steps: dict = {}       # LoRA on? -> the eager rows step
        self._compiled: dict = {}    # LoRA on? -> its torch.compile wrapper
        self._prefills: dict = {}    # LoRA on? -> its RowsPrefill
        self._prefill_now = False    # compile_prefill_next() was called
        self._restored: dict = {}    # artifacts digest -> whether they were found on disk (once per decoder)
        self._warm: set = set()      # LoRA on? values whose step was compiled (or captured eagerly) once
        self.compiled = False
        self.compile_error: str | None = None
        self.compile_detail: str | None = None
        #: the uncompiled rows step runs nvkit's Triton kernels (as the batch-1 decoder's does)
        self.kernels = single.kernels
        self.uncompiled_seconds = 0.0  # when the rows step compiles: CompileTier
        self._uncompiled: set = set()  # LoRA on? values whose graphs run the uncompiled step
        self.counts = collections.Counter()
        self.capture_seconds: dict = {}
        self.timings = graphs_mod.Timings()  # where the preparation's seconds went
        self.last_batches: collections.Counter = collections.Counter()  # batch class -> replays, last request
        self._lock = threading.Lock()

    @property
    def k(self) -> int:
        return self.options.k_steps

    def _choose_attention(self, asked: str) -> tuple[str, str | None]:
        """("triton" | "matmul", why "auto" did not take the kernel). The paged kernel applies the
        q/k norms itself, so it needs per-head RMS norms (or none) and a power-of-two head size."""
        if asked == "matmul":
            return "matmul", None
        hd = attention_dims(self.model.config)[2]
        why = None
        if asked == "auto" and self.device.type != "cuda":
            why = f"nvkit's Triton attention kernels run on CUDA GPUs; this model is on {self.device.type}"
        if why is None:
            try:
                from .. import decode_attention  # noqa: F401 - imports triton
            except ImportError as e:
                why = f"the triton package is missing ({e})"
        if why is None and hd & (hd - 1):
            why = f"its head_dim ({hd}) is not a power of two"
        if why is None:
            why = qk_norm_why(self.model, hd)
        if why is None:
            return "triton", None
        if asked != "auto":
            raise NvkitError(f"attention={asked!r} on the batched path needs nvkit's paged Triton kernel: {why}.")
        return "matmul", why

    def describe(self) -> str:
        """How this decoder runs, in a few words for the stats line."""
        if not self.graphs:
            how = "eager, no CUDA graphs"
        elif self.compiled:
            how = "compiled by layer" if self.options.regional else "compiled"
        elif self.compile_error:
            how = f"eager: torch.compile failed ({self.compile_error})"
        else:
            how = self._uncompiled_words()
        parts = [f"fused step over rows, {how}", f"paged {self.attention} attention"]
        prefills = list(self._prefills.values())
        if any(p.error for p in prefills):
            parts.append(f"eager prefill: its compile failed ({next(p.error for p in prefills if p.error)})")
        elif any(p.compiled for p in prefills):
            parts.append("compiled prefill")
        elif any(p.waiting for p in prefills):
            parts.append(f"eager prefill (compiled once it has run {self.options.prefill_after:g} s)")
        if self._lora is not None:
            parts.append(f"LoRA unmerged (rank ≤ {self._lora.rank})")
        if self.last_batches:
            parts.append("batch " + "/".join(str(b) for b in sorted(self.last_batches, reverse=True)))
        parts.append(f"{self.k} steps per replay")
        return ", ".join(parts)

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
        if lora is not None and lora is not self._lora_built:  # new adapter buffers (a larger rank)
            self._forget_steps(True)
            self._lora_built = lora
        self._lora = lora
        return lora is not None

    def _forget_steps(self, lora_on: bool | None) -> None:
        """Drop the steps (and their graphs) built for ``lora_on`` (None: all of them)."""
        for d in (self._steps, self._compiled, self._prefills):
            for key in [k for k in d if lora_on is None or k == lora_on]:
                del d[key]
        self._warm = {k for k in self._warm if lora_on is not None and k != lora_on}
        self._uncompiled = {k for k in self._uncompiled if lora_on is not None and k != lora_on}
        a = self._arena
        if a is not None:
            a.drop_graphs(lambda g: lora_on is None or g[2] == lora_on)

    # --- memory ----------------------------------------------------------------------------------
    def _page_bytes(self) -> int:
        return kv_bytes_per_token(self.model.config, self._fw.embed.element_size()) * PAGE

    def prefill_tokens_for(self, a: Arena) -> int:
        """Padded prompt tokens per prefill forward in the pool ``a`` (see ``prefill_tokens``)."""
        if self.prefill_tokens is not None:
            return self.prefill_tokens
        fw = self._fw
        per_token = prefill_bytes_per_token(fw.embed.shape[1], fw.nh, fw.nkv, fw.hd, fw.layers[0].down.shape[1],
                                            fw.embed.element_size())
        return prefill_budget(a.pages * self._page_bytes(), per_token)

    def plan(self, prompt_lens: list[int], max_new: int, free_bytes: int | None = None) -> tuple[int, int]:
        """(rows, pool pages incl. the scratch page) for prompts of these lengths: a row for every
        prompt up to ``max_rows``, and pages for the rows' sequences at once (the longest ones
        when there are more prompts than rows); fewer rows when the pool would not fit in
        ``MEMORY_SHARE`` of ``free_bytes`` (None: no limit)."""
        needs = sorted((pages_for(n + max_new, PAGE) for n in prompt_lens), reverse=True)
        rows = min(len(needs), self.max_rows)
        per_page = self._page_bytes() if free_bytes is not None else 0
        while True:
            pages = sum(needs[:rows]) + 1
            if free_bytes is None or pages * per_page <= MEMORY_SHARE * free_bytes:
                return rows, pages
            if rows == 1:
                raise NvkitError(f"The KV cache of the longest prompt ({needs[0] * PAGE} positions, "
                                 f"{pages * per_page / 2**30:.2f} GiB) does not fit in the GPU's free memory "
                                 f"({free_bytes / 2**30:.2f} GiB): ask for fewer tokens, or free memory.")
            rows = max(1, rows * 3 // 4)

    def _arena_for(self, seqs: list[Sequence], max_new: int, penalty: bool) -> Arena:
        import torch
        a = self._arena
        free = None
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0] + (self._arena_bytes(a) if a is not None else 0)
        rows, pages = self.plan([len(s.prompt) for s in seqs], max_new, free)
        width = pages_for(max(len(s.prompt) for s in seqs) + max_new + 2 * self.k + 2, PAGE)
        cls = batch_class(rows)
        if (a is not None and a.pages >= pages and a.rows >= cls and a.width >= width and a.pages <= 2 * pages + 8
                and (a.seen is not None or not penalty)):
            return a
        if a is not None:
            events.record("compile", f"fast batch: a pool of {pages} pages and {cls} rows replaces the one of "
                                     f"{a.pages} pages and {a.rows} rows; its graphs are captured again")
        self._drop_arena()
        self._arena = self._new_arena(pages, cls, width, penalty)
        return self._arena

    def _arena_bytes(self, a: Arena) -> int:
        return a.pages * self._page_bytes() + (a.seen.numel() if a.seen is not None else 0)

    def _new_arena(self, pages: int, rows: int, width: int, penalty: bool) -> Arena:
        import torch
        fw, dev = self._fw, self.device
        i64 = dict(dtype=torch.long, device=dev)
        f32 = dict(dtype=torch.float32, device=dev)
        with torch.inference_mode(False):
            keys = [torch.zeros((pages * PAGE, fw.nkv, fw.hd), dtype=fw.dtype, device=dev) for _ in fw.layers]
            values = [torch.zeros((pages * PAGE, fw.nkv, fw.hd), dtype=fw.dtype, device=dev) for _ in fw.layers]
            cos, sin = fw.rotary(width * PAGE)
        a = Arena(pages=pages, rows=rows, width=width, keys=keys, values=values, cos=cos, sin=sin,
                  tok=torch.zeros((rows,), **i64), pos=torch.zeros((rows,), **i64),
                  table=torch.zeros((rows, width), dtype=torch.int32, device=dev),
                  seed=torch.zeros((rows,), **i64), min_pos=torch.zeros((rows,), **i64),
                  temperature=torch.ones((rows,), **f32), top_p=torch.ones((rows,), **f32),
                  penalty=torch.ones((rows,), **f32),
                  eos_mask=torch.zeros((1, self.vocab), dtype=torch.bool, device=dev),
                  out=torch.zeros((rows, self.k + 1), **i64),
                  seen=torch.zeros((rows, self.vocab), dtype=torch.bool, device=dev) if penalty else None)
        if dev.type == "cuda":
            a.host = [(torch.empty((rows, self.k + 1), dtype=torch.long, pin_memory=True), torch.cuda.Event())
                      for _ in range(2)]
        return a

    def _drop_arena(self) -> None:
        a, self._arena = self._arena, None
        if a is not None:
            a.drop_graphs()  # uncaptured bodies (graphs=False) hold the arena: no cycle left behind

    # --- the steps and their graphs ----------------------------------------------------------------
    def _step(self, lora_on: bool) -> Callable:
        if lora_on not in self._steps:
            self._steps[lora_on] = decode_rows_step(self._fw, self.attention, PAGE, self._lora if lora_on else None,
                                                    kernels=self.kernels)
        return self._steps[lora_on]

    def _prefill_fn(self, lora_on: bool) -> Callable:
        if lora_on not in self._prefills:
            self._prefills[lora_on] = RowsPrefill(
                prefill_rows_step(self._fw, self._lora if lora_on else None),
                compile=bool(self.options.compile and self.graphs), page=PAGE, scratch=SCRATCH,
                # no coordinate-descent tuning: it pays on the batch-1 step's matrix-vector products,
                # while the prefill's matrix products go to cuBLAS and its fused elementwise kernels
                # are tuned well enough by inductor's heuristics; tuning them would only lengthen the compile
                inductor=lambda: inductor_options(dataclasses.replace(self.options, tune=False), self.single.pdl, True),
                restore=lambda: self._restore_artifacts(self._disk_key(lora_on, "prefill")),
                store=lambda: self._store_artifacts(self._disk_key(lora_on, "prefill")),
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

    def _store_artifacts(self, digest: str | None) -> None:
        if digest is not None:
            with self.timings.part("compile artifacts to disk"):
                artifacts.store(digest)

    def _restore_artifacts(self, digest: str | None) -> bool:
        """The compile artifacts of ``digest`` loaded from disk, once per decoder."""
        if digest is None:
            return False
        if digest not in self._restored:
            with self.timings.part("compile artifacts from disk"):
                self._restored[digest] = artifacts.restore(digest)
        return self._restored[digest]

    def _compiled_step(self, lora_on: bool):
        if not (self.options.compile and self.graphs) or self.compile_error:
            return self._step(lora_on), False
        if lora_on not in self._compiled:
            import torch
            # fullgraph: a graph break would mean host work per step. The sizes that change from one
            # class or pool to the next are marked dynamic, so one compile serves them all.
            if self.options.regional:
                # one layer compiled serves every layer; the step around it is captured per class
                fw = self._fw
                layer = decode_rows_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, self.attention, PAGE)
                self._compiled[lora_on] = decode_rows_step(fw, self.attention, PAGE, self._lora if lora_on else None,
                                                           layer=torch.compile(layer, fullgraph=True),
                                                           head=torch.compile(decode_head(fw), fullgraph=True))
            else:  # the step of torch operations, for inductor to fuse
                step = decode_rows_step(self._fw, self.attention, PAGE, self._lora if lora_on else None)
                self._compiled[lora_on] = torch.compile(step, fullgraph=True)
        return self._compiled[lora_on], True

    def _body(self, a: Arena, batch: int, key: tuple, fn, dynamic: bool):
        import torch
        k = self.k
        mark = dynamic and not self.options.regional  # a step compiled by layer marks each layer's sizes itself

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
                nxt = choose_rows(logits, key, p)
                out[:, i + 1].copy_(nxt)
                tok.copy_(nxt)
                torch.clamp(p.counter, max=a.cap, out=pos)
        return body

    def _graph(self, a: Arena, batch: int, key: tuple, lora_on: bool, on_progress=None):
        import torch
        gkey = (batch, key, lora_on)
        compiling = self.compile_due()
        if compiling and lora_on in self._uncompiled:
            # the compiled step replaces the uncompiled one's graphs
            a.drop_graphs(lambda g: g[2] == lora_on)
            self._warm.discard(lora_on)
            self._uncompiled.discard(lora_on)
        if gkey in a.graphs:
            return a.graphs[gkey]
        expensive = lora_on not in self._warm
        if not expensive:  # another batch class or sampling mode: on the step the graphs already run
            compiling = compiling and lora_on not in self._uncompiled
        if not self.graphs:
            a.graphs[gkey] = self._body(a, batch, key, self._step(lora_on), False)
            self._warm.add(lora_on)
            self.counts["compiles" if expensive else "graphs"] += 1
            return a.graphs[gkey]
        events.record("compile", f"fast batch: capturing {self.k} steps of {batch} rows per graph"
                                 f" ({key[0]}{', LoRA' if lora_on else ''})"
                                 + (" with torch.compile, once per session" if expensive and compiling else ""))
        t = time.perf_counter()
        before = dict(self.timings)
        disk_key = self._disk_key(lora_on) if expensive and compiling else None
        torch.cuda.synchronize(self.device)  # what is in flight ends before the rows are parked for the capture
        saved = a.save_and_park_all()
        restored = False
        try:
            with ticking(on_progress if expensive else None):
                restored = self._restore_artifacts(disk_key)
                graph = self._captured(a, batch, key, lora_on, compiling)
        finally:
            torch.cuda.synchronize(self.device)
            a.restore(saved)
        compiled = self._settle(compiling)
        if not compiled:
            self._uncompiled.add(lora_on)
        self.counts["compiles" if expensive else "graphs"] += 1
        self._warm.add(lora_on)
        if expensive and compiled:
            self._store_artifacts(disk_key)
        seconds = time.perf_counter() - t
        self.capture_seconds[(batch, key, lora_on)] = seconds
        events.record("compile", f"fast batch ready for {batch} rows in {seconds:.1f} s "
                                 f"({'compiled' if compiled else 'uncompiled'} step"
                                 f"{', compile artifacts from disk' if restored else ''}; "
                                 f"{self.timings.since(before).describe()})")
        a.graphs[gkey] = graph.replay
        return a.graphs[gkey]

    def _disk_key(self, lora_on: bool, part: str = "step") -> str | None:
        """The artifacts' key of the rows step or ("prefill") of the prompt prefill: each is
        compiled on a call of its own, so each has its own file."""
        if not (self.options.disk_cache and self.options.compile):
            return None
        extra = {"regional": True} if self.options.regional else {}  # the whole-step compile's keys stay as they were
        if part != "step":
            extra["part"] = part
        return artifacts.key(self.model, dict(batched=True, page=PAGE, k=self.k, attention=self.attention,
                                              pdl=self.single.pdl, tune=self.options.tune,
                                              inductor=self.options.inductor,
                                              lora=(self._lora.rank, str(self._lora.dtype)) if lora_on else None,
                                              **extra),
                             self.device)

    def _captured(self, a: Arena, batch: int, key: tuple, lora_on: bool, compiling: bool):
        """The class's graph: the compiled step when ``compiling``, else (or when the compile
        fails) the uncompiled one; a step whose nvkit kernels fail here is captured again without
        them, and under attention="auto" a Triton step that fails gives way to "matmul" (as the
        batch-1 decoder does)."""
        import torch
        try:
            fn, dynamic = self._compiled_step(lora_on) if compiling else (self._step(lora_on), False)
            return self._capture_with(a, self._body(a, batch, key, fn, dynamic), compiling=dynamic)
        except Exception as e:  # noqa: BLE001 - compile problems fall back, as said above
            kernels = not compiling and self.kernels
            retry_matmul = self.options.attention == "auto" and self.attention != "matmul"
            if not (kernels or retry_matmul or compiling):
                raise
            torch.cuda.synchronize(self.device)
            a.table.fill_(SCRATCH)  # a failed warm-up may have left rows anywhere
            a.pos.zero_()
            if kernels:
                self.kernels = False
                self._steps.clear()
                events.record("compile", f"fast batch: nvkit's kernels failed here ({error_summary(e)}); "
                                         "the rows step runs torch's operations")
                return self._captured(a, batch, key, lora_on, compiling)
            if retry_matmul:
                self.attention_why = (f"the paged Triton attention failed on this GPU ({error_summary(e)}); "
                                      "nvkit uses 'matmul' here")
                events.record("compile", f"fast batch: {self.attention_why}")
                self.attention = "matmul"
                self._forget_steps(None)
                return self._captured(a, batch, key, lora_on, compiling)
            self.compile_error = error_summary(e)
            self.compile_detail = str(e)
            events.record("compile", f"fast batch: torch.compile failed ({self.compile_error}); capturing the eager step")
            return self._capture_with(a, self._body(a, batch, key, self._step(lora_on), False), compiling=False)

    def _capture_with(self, a: Arena, body, compiling: bool, warmups: int = 3):
        import torch
        if a.pool is None:
            a.pool = torch.cuda.graph_pool_handle()
        return graphs_mod.capture(self.device, body, a.pos.zero_, compiling=compiling, warmups=warmups,
                                  inductor=inductor_options(self.options, self.single.pdl, compiling), pool=a.pool,
                                  timings=self.timings)

    # --- rows ------------------------------------------------------------------------------------
    def _set_request(self, a: Arena, sampling: Sampling) -> None:
        """The request's values every row shares (one list call has one set of generation arguments)."""
        a.temperature.fill_(max(sampling.temperature, 1e-5))
        a.top_p.fill_(sampling.top_p)
        a.penalty.fill_(sampling.repetition_penalty)
        a.eos_mask.zero_()
        eos = [e for e in sampling.eos if 0 <= e < self.vocab]
        if eos:
            a.eos_mask[0, eos] = True
        a.table.fill_(SCRATCH)
        a.pos.zero_()

    def _prefill(self, a: Arena, seqs: list[Sequence], sampling: Sampling, lora_on: bool, on_progress=None) -> None:
        """The prompts of newly admitted sequences into their pages, their first tokens picked, and
        their rows set up to decode. Prompts go in groups of similar length (sorted), each padded
        to its longest, at most ``prefill_tokens_for(a)`` padded tokens per forward."""
        import torch
        dev = self.device
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
        prefill = self._prefill_fn(lora_on)
        key = sampling.key
        for group in _groups(sorted(seqs, key=lambda s: len(s.prompt)), self.prefill_tokens_for(a)):
            length = _round_up(max(len(s.prompt) for s in group), 16)
            ids = _to(dev, [s.prompt + [0] * (length - len(s.prompt)) for s in group], torch.long)
            last = _to(dev, [len(s.prompt) - 1 for s in group], torch.long)
            grows = _to(dev, [s.row for s in group], torch.long)
            # Each row's positions 0..length-1 through its page table: a shorter prompt's padding
            # lands in its own later positions (rewritten by the decode steps before they are read)
            # or, past its pages, in the scratch page.
            where = paged_positions(a.table.index_select(0, grows), PAGE, length)
            logits = prefill(ids, last, where, a.cos, a.sin, a.keys, a.values, on_progress=on_progress)
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

    def _readout(self, a: Arena, batch: int):
        """Queue the copy of a replay's ids to where the host reads them (see ``replay._readout``)."""
        if a.out.device.type != "cuda":
            return a.out[:batch].clone(), None, batch
        import torch
        host, done = a.host[a.turn % 2]
        a.turn += 1
        host[:batch].copy_(a.out[:batch], non_blocking=True)
        done.record(torch.cuda.current_stream(a.out.device))
        return host, done, batch

    @staticmethod
    def _collect(item) -> list[list[int]]:
        host, done, batch = item
        if done is not None:
            done.synchronize()
        return host[:batch].tolist()

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
            self._set_request(a, sampling)
            sched = Scheduler(seqs, a.rows, a.pages, PAGE, self.k, sampling.eos)
            before = dict(self.timings)
            t = time.perf_counter()
            self._run(a, sched, sampling, lora_on, stop_event, on_progress, on_tokens)
            if lora_on in self._uncompiled:  # the list's decoding, its captures left out
                prepared = sum(self.timings.since(before).values())
                self.uncompiled_seconds += max(0.0, time.perf_counter() - t - prepared)
            return [s.tokens if s.finished else None for s in seqs]

    def _run(self, a: Arena, sched: Scheduler, sampling: Sampling, lora_on: bool, stop_event, on_progress,
             on_tokens) -> None:
        """The host loop: refill, queue a replay (two at most in flight), read the oldest back."""
        import torch
        key = sampling.key
        # a batch of one is compiled apart (torch specialises a size of 1): only a request of one
        # prompt runs in class 1; the last row of a larger request runs in class 2
        smallest = 1 if len(sched.seqs) == 1 else 2
        pending: collections.deque = collections.deque()
        self.last_batches = collections.Counter()
        stopped = False
        done = produced = 0
        dev = self.device
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
                    self._prefill(a, new, sampling, lora_on, on_progress)
                parked = [r for r in sched.to_park if r < a.rows]
                sched.to_park.clear()
                if parked:
                    a.park(_to(dev, parked, torch.long))
                if sched.live == 0:
                    break
                batch = batch_class(sched.top, smallest)
                replay = self._graph(a, batch, key, lora_on, on_progress)
                snap = sched.plan(batch, {s.row for s in new})
                replay()
                self.last_batches[batch] += 1
                pending.append((snap, self._readout(a, batch)))
                if stop_event is not None and stop_event.is_set():
                    stopped = True
            if not pending:
                break
            snap, item = pending.popleft()
            finished = sched.take(snap, self._collect(item))
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


def unsupported_reason(session, gen: dict) -> str | None:
    """Why a list of prompts cannot take the batched fast path here (None when it can), in a few words."""
    from .fused import fusable_why
    from .lora import lora_why
    from .options import default_options
    from .sampling import resolve
    model = session.model
    if session.device.type != "cuda":
        return f"the model is on {session.device}, and the batched fast path replays CUDA graphs"
    dev_map = getattr(model, "hf_device_map", None)
    if dev_map and len({str(v) for v in dev_map.values()}) > 1:
        return "the model is spread over several GPUs (device_map); the batched fast path needs it on one"
    if getattr(session, "quantization", None):
        return f"the model is quantized ({session.quantization}); the batched fast path covers bf16/fp16/fp32 weights"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    why = fusable_why(base)
    if why:
        return f"it runs nvkit's fused step, which does not fit this model ({why})"
    if default_options().fused is False:
        return "the fused step is turned off (NVKIT_FAST_FUSED=0)"
    layer_types = getattr(base.config.get_text_config(), "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "the model has sliding-window or other non-full attention layers"
    if getattr(model, "peft_config", None):
        why = lora_why(model)
        if why:
            return why
    _, why = resolve(base, gen)
    return why
