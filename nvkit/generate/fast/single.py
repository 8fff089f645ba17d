"""``FastDecoder``: one sequence on one GPU, K decode steps per CUDA-graph replay.

Why: ``generate(cache_implementation="static")`` pays the generate loop's host work every token,
so the GPU idles. Here one graph holds K steps, each step's token written into the next one's input
on the device: the host wakes once per K tokens, reads K ids with one copy, checks EOS, stop
strings and Stop, and streams them (up to K-1 steps past an EOS are dropped).

The step is nvkit's fused one for the Llama family (``llama_step``), else the model's own forward
over a ``StaticCache`` (adapters in PEFT's layers, a graph per adapter state). It is captured
uncompiled first (the fused step's norms, activation and adapter products in nvkit's Triton
kernels); once the compile is due (``compile_policy``) a long request compiles it, measures it
against the uncompiled graph and keeps the faster, once per session and cache size class
(``static_cache``; artifacts on disk with ``FastOptions.disk_cache``). The fused step's prefill
gets a graph per prompt-length class, at the class's second prompt or up front in ``prepare``.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ... import events
from ...errors import NvkitError
from . import cuda_graphs as graphs_mod, experts as experts_mod, lora as lora_mod
from .static_cache import Cache, GraphKey, model_prefill, model_step, new_cache, prefill_class, set_request, size_class
from .llama_step import decode_head, decode_step, model_decode_layer, prefill_step
from .fused_fit import fusable_why
from .fused_weights import FusedWeights
from .gemv_step import gemv_parts, gemv_why, gemv_words
from .options import FOLD_RANK, FastOptions, default_options
from .replay import replays, ticking
from .compile_policy import compile_fullgraph
from .runner import (GraphRunner, KeptReplay, StepVariant, batch1_attention, has_inductor_option, split_overrides,
                     triton_cannot_run_on)
from .sampling import Sampling, StopStrings, choose


class FastDecoder(GraphRunner):
    """Greedy/sampled decoding of one sequence on one GPU, K steps per CUDA-graph replay.

    ``model``: the causal LM (a PEFT wrapper's base model; adapters injected into it are run by the
    fused step). ``options``: a ``FastOptions`` (default: the process's, from ``NVKIT_FAST_*``);
    keywords override single fields (``FastDecoder(model, k_steps=4)``). ``graphs=False`` runs the
    same step code without capture, for checking the logic on a CPU; it is not a fast path."""

    label = "fast decode"

    def __init__(self, model, options: FastOptions | None = None, *, graphs: bool = True,
                 variant: StepVariant | None = None, **overrides):
        t0 = time.perf_counter()
        opts, variant = split_overrides(options or default_options(), variant or StepVariant(), overrides)
        device = model.get_input_embeddings().weight.device
        super().__init__(model, opts, variant, graphs, device, kernels=False)
        self._cache: Cache | None = None
        self._adapters = lora_mod.Adapters(fold=opts.lora_fold, merge=variant.lora_merged)
        self.last_logits: list = []
        self._forward_state: tuple = ()  # the model's own forward: the last adapters' state captured
        self.fused_why = fusable_why(model)
        if opts.fused and self.fused_why:
            raise NvkitError(f"The fused decode step does not fit this model: {self.fused_why}. Use fused=None or False.")
        self._fw = self._fused_weights() if opts.fused is not False and self.fused_why is None else None
        self.attention, self.attention_why = batch1_attention(
            self, self._fw is not None, self.fused_why, opts.attention, triton_cannot_run_on(self.device))
        # nvkit's kernels in the uncompiled step: the fused step's, or a mixture's grouped experts
        moe = variant.experts and experts_mod.is_mixture(model.config.get_text_config())
        self.kernels = (self._fw is not None or moe) and self.graphs and triton_cannot_run_on(self.device) is None
        import torch._inductor.config as inductor_config
        bad = [k for k, _ in variant.inductor if not has_inductor_option(inductor_config, k)]
        if bad:
            raise NvkitError(f"Unknown inductor option(s) {bad}: see torch._inductor.config.")
        self.timings["set-up"] = time.perf_counter() - t0  # fused weights, the attention kernel's check

    @property
    def fused(self) -> bool:
        return self._fw is not None

    @property
    def regional(self) -> bool:
        """Whether the compile is one layer's (``StepVariant.regional``; the fused step only)."""
        return self.variant.regional and self._fw is not None

    @property
    def cache_length(self) -> int | None:
        """The size class of the cache the graphs run on (None before the first request)."""
        return self._cache.length if self._cache is not None else None

    def describe(self) -> str:
        """How this decoder runs, in a few words for the stats line: the step, compiled or why not,
        its attention, adapters, the steps per graph replay."""
        step = "fused step" if self._fw is not None else "model forward"
        parts = [f"{step}, {self._how(self.regional)}"]
        on = self._adapters.slots is not None and lora_mod.active(self.model)
        apart = self._adapters.weights(self._fw, on)[1]  # the buffers the step adds (None: merged, or off)
        six = False  # the six-kernel layers run: their adapter products stay apart
        if self._fw is not None:
            parts.append(f"{self.attention} attention" + (" (auto)" if self.options.attention == "auto" else ""))
            if self.variant.gemv and self.kernels and not self.compiled:  # the step they would be
                parts.append(gemv_words(self._fw, self.attention, self.pdl, apart))
                six = gemv_why(self._fw, self.attention, apart) is None
        # the uncompiled step with nvkit's kernels folds where the GPU gives float32 products
        folds = self.compiled or not self.kernels or (lora_mod.kernel_folds(self.device) and not six)
        words = self._adapters.words(on, folds)
        if words:
            parts.append(words)
        elif self._fw is None and lora_mod.forward_state(self.model):
            parts.append("LoRA in PEFT's own layers")
        parts.append(f"{self.k} steps per replay")
        return ", ".join(parts)

    # --- the model's state -----------------------------------------------------------------------
    def _fused_weights(self) -> FusedWeights:
        return FusedWeights(self.model, spare=2 * FOLD_RANK if self.options.lora_fold else 0)

    def _sync(self):
        """Weights and adapters as the model has them now; returns whether adapters run (on the
        model's own forward: their state, ``lora.forward_state``, whose graphs are captured apart)."""
        if self._fw is None:
            state = lora_mod.forward_state(self.model)
            if state and self._forward_state and state != self._forward_state and self._cache is not None:
                self._cache.forget_lora()  # the older adapters' graphs would never replay again
            self._forward_state = state or self._forward_state
            return state
        try:
            synced = self._fw.sync()
            if synced:
                events.record("compile", "fast decode: the model's weights changed; its graphs read the new ones")
        except ValueError as e:  # shapes changed: nothing captured fits any more
            self._drop_cache()
            self._fw, synced = self._fused_weights(), 0
            self._adapters = lora_mod.Adapters(fold=self.options.lora_fold, merge=self.variant.lora_merged)
            events.record("compile", f"fast decode: {e}; capturing again")
        self._adapters.base_changed |= bool(synced)  # a merged copy is made from the base weights
        if not lora_mod.active(self.model):
            if self._adapters.merged is not None and not lora_mod.attached(self.model):
                self._drop_merged()  # the adapters are gone (unloaded, merged by PEFT): their copy too
            return False
        if self._adapters.sync(self._fw, self.model) and self._cache is not None:
            self._cache.forget_lora()  # graphs on older buffers or an older copy would never replay again
        return True

    def release_merged(self) -> int:
        """Drop the adapters' merged copy and the graphs on it (a fine-tune needs the memory more;
        the next request with adapters makes it again); returns its bytes."""
        with self._lock:
            return self._drop_merged()

    def _drop_merged(self) -> int:
        if (freed := self._adapters.release_merged()) and self._cache is not None:
            self._cache.forget_lora()
        return freed

    # --- caches and their graphs -------------------------------------------------------------------
    def _positions(self, prompt_len: int, sampling: Sampling) -> int:
        """Cache positions a request needs: the prompt, the new tokens, and the up to K-1 steps a
        replay computes past the last one (+1 of slack)."""
        return prompt_len + sampling.max_new_tokens + self.k

    def _cache_for(self, needed: int) -> Cache:
        if needed > self.max_positions:
            raise NvkitError(f"The prompt plus max_new_tokens (+{self.k} steps of slack) needs {needed} positions; "
                             f"the model handles {self.max_positions}. Shorten the prompt or ask for fewer tokens.")
        c = self._cache
        if c is not None and c.length >= needed:
            return c
        length = size_class(needed, self.options.cache_tokens, self.max_positions)
        if c is not None:
            events.record("compile", f"fast decode: a request needs {needed} positions; the cache grows from "
                                     f"{c.length} to {length} tokens and is captured again")
            self._drop_cache()
        self._cache = new_cache(self.model, self._fw, length, self.k, self.device)
        return self._cache

    def _drop_cache(self) -> None:
        self._cache = None  # its compiled steps' Dynamo entries go with it (compile_fullgraph)

    def _forget_kernel_steps(self) -> None:
        if self._cache is not None:
            self._cache.steps.clear()

    def _forget_attention_steps(self) -> None:
        if self._cache is not None:
            self._cache.forget_steps()

    def _step(self, c: Cache, lora_on: bool) -> Callable:
        if lora_on not in c.steps:
            if self._fw is not None:
                fw, lora = self._adapters.weights(self._fw, lora_on)
                c.steps[lora_on] = decode_step(fw, c, self.attention, lora, kernels=self.kernels, **gemv_parts(
                    fw, self.attention, self.variant.gemv and self.kernels, self.pdl, lora))
            else:
                c.steps[lora_on] = model_step(self.model, c, self.device, grouped=self.kernels)
        return c.steps[lora_on]

    def _compiled(self, c: Cache, lora_on: bool):
        if lora_on not in c.compiled:
            # dynamic=False: one specialised kernel set per cache
            fw, lora = self._adapters.weights(self._fw, lora_on)
            if self.regional:
                # one layer compiled serves every layer (called per layer inside a capture: free to replay)
                layer = model_decode_layer(fw, self.attention)
                c.compiled[lora_on] = decode_step(fw, c, self.attention, lora,
                                                  layer=compile_fullgraph(layer, dynamic=False),
                                                  head=compile_fullgraph(decode_head(fw), dynamic=False))
            else:  # the whole step of torch operations (without nvkit's kernels), for inductor to fuse
                whole = lambda f: compile_fullgraph(f, dynamic=False)  # noqa: E731
                c.compiled[lora_on] = (whole(decode_step(fw, c, self.attention, lora)) if self._fw is not None
                                       else model_step(self.model, c, self.device, compiler=whole))
        return c.compiled[lora_on]

    def _body(self, c: Cache, key: GraphKey, fn):
        def body():
            for i in range(self.k):
                logits = fn(c.tok)
                nxt = choose(logits, c, key.sampling)
                if key.logits:
                    c.logits[i].copy_(logits[0])
                c.out[i].copy_(nxt[0])
                c.tok.copy_(nxt.view(1, 1))
        return body

    def _capture(self, c: Cache, key: GraphKey, compiling: bool):
        """The graph of ``key`` on the compiled step or the uncompiled one (with the fall-backs of
        ``GraphRunner.capture_or_fall_back``); returns (graph, whether it runs the compiled step)."""
        def capture(compiling: bool):
            step = self._compiled(c, key.lora) if compiling else self._step(c, key.lora)
            return graphs_mod.capture(self.device, self._body(c, key, step), lambda: self._rewind(c),
                                      compiling=compiling, warmups=graphs_mod.warmups(compiling),
                                      inductor=self.inductor_options(compiling), timings=self.timings)
        return self.capture_or_fall_back(capture, compiling)

    def _graph(self, c: Cache, key: GraphKey, on_progress=None, may_compile: bool = True):
        import torch
        if key.logits and c.logits is None:
            c.logits = torch.zeros((self.k, self.vocab), dtype=torch.float32, device=self.device)
        lora_on = key.lora
        running = [g for g in c.graphs if g.lora == lora_on]
        compiling = may_compile and self.compile_due(lora_on) and lora_on in c.uncompiled or (
            not running and may_compile and self.compile_due(lora_on))
        if key in c.graphs and not compiling:
            return c.graphs[key]
        if not self.graphs:
            c.graphs[key] = self._body(c, key, self._step(c, lora_on))
            self.counts["compiles" if not running else "graphs"] += 1
            return c.graphs[key]
        expensive = not running or compiling  # nothing captured for this step yet, or it compiles now
        if not expensive:  # another sampling mode: on the step the cache's graphs already run
            compiling = lora_on not in c.uncompiled and lora_on in c.compiled
        what = (f"fast decode: capturing {self.k} steps per graph for a {c.length}-token cache "
                f"({key.sampling[0]}{', LoRA' if lora_on else ''})")
        events.record("compile", what + (" with torch.compile, once per session" if expensive and compiling else ""))
        t = time.perf_counter()
        before = dict(self.timings)
        # Warm-up, capture and measuring draw random numbers; keep the user's seeded stream as it was.
        rng = torch.cuda.get_rng_state(self.device)
        disk_key = self._disk_key(c, lora_on) if expensive and compiling else None
        verdict = None
        try:
            with ticking(on_progress if expensive else None):
                restored = self.restore_artifacts(disk_key)
                graph, compiled = self._capture(c, key, compiling)
                if compiled and expensive:
                    verdict, graph, compiled = self._measured(c, key, graph)
        finally:
            torch.cuda.set_rng_state(rng, self.device)
            self._rewind(c)
        if compiled and expensive:
            # the compiled step replaces the uncompiled one's graphs for this cache
            for g in [g for g in c.graphs if g.lora == lora_on]:
                del c.graphs[g]
            c.uncompiled.discard(lora_on)
        elif not compiled:
            c.uncompiled.add(lora_on)
        self.counts["compiles" if expensive else "graphs"] += 1
        if compiled or verdict is not None:
            self.store_artifacts(disk_key)
        seconds = time.perf_counter() - t
        self.capture_seconds[(c.length, key.sampling, lora_on, key.logits)] = seconds
        self.record_ready(f"a {c.length}-token cache", seconds, compiled, expensive and restored, verdict, self.k, before)
        c.graphs[key] = graph.replay
        return c.graphs[key]

    def _measured(self, c: Cache, key: GraphKey, graph):
        """The compiled ``graph`` against the uncompiled one of the same key, timed on this cache
        (``GraphRunner.keep_faster``); a compiled step that loses is dropped."""
        # a small cache holds few replays before its positions run out
        replays = max(1, (c.length - 1) // self.k - 2) if c.length <= 8 * self.k else None
        kept = self.keep_faster(graph, c.graphs.get(key) if key.lora in c.uncompiled else None,
                                lambda: self._capture(c, key, False)[0].replay, lambda: self._rewind(c), key.lora,
                                self.k, f"on a {c.length}-token cache", replays)
        if not kept[2]:
            c.compiled.pop(key.lora, None)
        return kept

    def _disk_key(self, c: Cache, lora_on: bool) -> str | None:
        extra = {"regional": True} if self.regional else {}  # keys of the whole-step compile stay as they were
        if lora_on and self._fw is None:
            return None  # the model's own forward with PEFT's layers: the key would not tell adapters apart
        if lora_on and self._adapters.merged is not None:
            extra["lora_merged"] = True  # the base step's code over other tensors
        elif lora_on and self._adapters.slots.folded:
            extra["lora_fold"] = True
        lora = self._adapters.weights(self._fw, lora_on)[1]
        return self.disk_key(lora, fused=self._fw is not None, length=c.length, **extra)

    def _rewind(self, c: Cache) -> None:
        if c.kv is not None:
            c.kv.reset()
        c.pos.zero_()

    def _prefill(self, c: Cache, input_ids, lora_on: bool, capture: bool = False):
        """Run the prompt into the cache; returns its last position's (1, vocab) float logits.
        ``capture``: capture its length class's graph now even if no prompt of it came before."""
        n = int(input_ids.shape[-1])
        if self._fw is None:  # the model's own forward, eagerly (any length)
            return model_prefill(self.model, c, input_ids)
        length = prefill_class(n, c.length)
        c.last.fill_(n - 1)
        if length is None:  # longer than any class: eagerly, at its own length
            fw, lora = self._adapters.weights(self._fw, lora_on)
            return prefill_step(fw, c, lora)(input_ids[0])
        c.prompt[0, :n].copy_(input_ids[0])
        c.prompt[0, n:length].zero_()
        pkey = (length, lora_on)
        if pkey not in c.prefills:
            fw, lora = self._adapters.weights(self._fw, lora_on)
            fn = prefill_step(fw, c, lora)

            def body():
                c.first_logits.copy_(fn(c.prompt[0, :length]))
            if pkey not in c.prefills_seen and not capture:
                # a class's first prompt runs the graph's code eagerly (the same padded shapes, so the same
                # logits as its graph will give): a capture costs a warm-up run and the capture on top, which
                # a session's first short request or a one-off prompt length would wait for and never get back
                c.prefills_seen.add(pkey)
                body()
                return c.first_logits
            if self.graphs:
                import torch
                if c.pool is None:
                    c.pool = torch.cuda.graph_pool_handle()
                t = time.perf_counter()
                c.prefills[pkey] = graphs_mod.capture(self.device, body, lambda: self._rewind(c), compiling=False,
                                                      warmups=1, inductor=self.inductor_options(False), pool=c.pool,
                                                      timings=self.timings,
                                                      parts=("prefill graphs", "prefill graphs")).replay
                self.capture_seconds[("prefill", length, lora_on)] = time.perf_counter() - t
                self.counts["prefill graphs"] += 1
            else:
                c.prefills[pkey] = body
        c.prefills[pkey]()
        return c.first_logits

    # --- the public side -----------------------------------------------------------------------
    def ready(self, prompt_len: int, sampling: Sampling, exact: bool = False) -> bool:
        """True when a request of this size runs without compiling anything first (a graph for
        another sampling mode on the compiled step is captured in about a second); ``exact``: nor
        capturing anything, the graph of this very sampling mode there already."""
        c = self._cache
        if c is None or c.length < self._positions(prompt_len, sampling):
            return False
        lora_on = lora_mod.forward_state(self.model) if self._fw is None else lora_mod.active(self.model)
        fits = not lora_on or self._fw is None or self._adapters.fits(self.model)
        return fits and any(g.lora == lora_on and (not exact or g.sampling == sampling.key) for g in c.graphs)

    def prepare(self, prompt_len: int, sampling: Sampling, on_progress: Callable[[float], None] | None = None,
                prefill_up_to: int = 512, compile: bool = True) -> float:
        """Capture (``compile``: compile first) what a request of this size and sampling mode needs now,
        and the prefill graphs of prompts up to ``prefill_up_to`` tokens; returns the seconds."""
        import torch
        with self._lock:
            t = time.perf_counter()
            if compile:
                self.compile_next()
            lora_on = self._sync()
            c = self._cache_for(self._positions(prompt_len, sampling))
            self._graph(c, GraphKey(sampling.key, lora_on), on_progress)
            if self._fw is not None:
                n = 1
                while n <= prefill_up_to:
                    length = prefill_class(n, c.length)
                    if length is None:
                        break
                    self._prefill(c, torch.zeros((1, length), dtype=torch.long, device=self.device), lora_on,
                                  capture=True)
                    n = length + 1
            return time.perf_counter() - t

    def generate(self, input_ids, sampling: Sampling, on_tokens: Callable[[list[int]], None] | None = None,
                 stop_event: threading.Event | None = None, tokenizer=None,
                 on_progress: Callable[[float], None] | None = None) -> list[int]:
        """Decode up to ``sampling.max_new_tokens`` ids after ``input_ids`` ((1, n) on the model's device).

        ``on_tokens`` gets each chunk of new ids as soon as it is known (the first one right after
        the prefill). Returns the new ids, EOS included when reached. ``tokenizer`` is needed for
        ``sampling.stop_strings``. ``on_progress(seconds)`` is called about once a second while a
        compile runs."""
        return self._decode(input_ids, sampling, on_tokens, stop_event, tokenizer, on_progress, keep_logits=False)

    def trace(self, input_ids, sampling: Sampling, tokenizer=None) -> tuple[list[int], list]:
        """Debug API (tests, benchmarks): ``generate``'s tokens and each step's float logits as the
        captured graph computed them ((vocab,) tensors; a graph of its own copies them out)."""
        tokens = self._decode(input_ids, sampling, None, None, tokenizer, None, keep_logits=True)
        return tokens, self.last_logits

    def _decode(self, input_ids, sampling, on_tokens, stop_event, tokenizer, on_progress, keep_logits: bool):
        if sampling.stop_strings and tokenizer is None:
            raise NvkitError("stop_strings need the tokenizer: FastDecoder.generate(..., tokenizer=tok).")
        with self._lock:
            n = int(input_ids.shape[-1])
            lora_on = self._sync()
            c = self._cache_for(self._positions(n, sampling))
            if self._fw is not None:
                self._fw.rotary_for(c, n)
            # a short request does not stop for a compile that was due (compile_after > 0): it
            # replays what is captured
            replay = self._graph(c, GraphKey(sampling.key, lora_on, keep_logits), on_progress,
                                 may_compile=sampling.max_new_tokens >= self.options.min_tokens
                                 or not self.options.compile_after)
            t = time.perf_counter()
            self._rewind(c)
            set_request(c, input_ids, sampling, self.vocab)
            logits = self._prefill(c, input_ids, lora_on)
            c.pos.fill_(n)
            first = choose(logits, c, sampling.key)
            c.tok.copy_(first.view(1, 1))
            kept = [logits[0].clone()] if keep_logits else None
            stops = StopStrings(tokenizer, sampling.stop_strings, input_ids[0].tolist()) if sampling.stop_strings else None
            tokens = replays(c, replay, first, sampling, on_tokens=on_tokens, stop_event=stop_event, stops=stops,
                             kept=kept)
            self.last_logits = kept[:len(tokens)] if kept is not None else []
            if lora_on in c.uncompiled:
                self.uncompiled_seconds += time.perf_counter() - t
            return tokens

    def weights(self):
        """(fused weights, ``lora.AdapterWeights`` or None: no adapter on) as the model has them now,
        for a decoder that shares them (``rows.BatchedDecoder``): one fused copy of the weights per
        model, the adapters loaded (or merged) once. (None, None) where the fused step does not run."""
        with self._lock:
            if not self._sync() or self._fw is None:
                return self._fw, None
            weights, slots = self._adapters.weights(self._fw, True)
            return self._fw, lora_mod.AdapterWeights(weights, slots, self._adapters.words(True, folds=False))

    def release(self) -> None:
        """Drop every captured graph and cache, and the compiled steps (memory back to the allocator)."""
        with self._lock:
            self._drop_cache()
            self._adapters = lora_mod.Adapters(fold=self.options.lora_fold, merge=self.variant.lora_merged)
