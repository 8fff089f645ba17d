"""``FastDecoder``: decoding of one sequence on one GPU, K decode steps per CUDA-graph replay.

Why not ``generate(cache_implementation="static")``: its compiled decode step is fast on the GPU,
but every token still pays the host work of the generate loop and of the graph-tree checks, so the
GPU is idle most of the time. Here one CUDA graph holds K consecutive decode steps: each step's
picked token is written into the next step's input buffer on the device, so the host wakes once
per K tokens, reads K ids with one copy, checks EOS and the stop event, and streams the K tokens
at once (up to K-1 extra steps are computed past an EOS and dropped).

The step is nvkit's fused one for the Llama family (``fused``), else the model's own forward over a
``StaticCache``. It is compiled with inductor (``torch.compile(fullgraph=True)``, no cudagraphs of
its own) so the many small elementwise kernels are fused, and then captured K times into one
graph; if compiling fails, the eager step is captured instead (more kernels per token, still no
host work between them). The prompt's prefill runs eagerly (any length) into the same cache.

Shapes: the cache length is rounded up to a bucket (powers of two from 256), so the capture is paid
once per bucket, shown as a ``compile`` event (``nvkit.events``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ... import events
from ...errors import NvkitError, error_summary
from ...memory.estimate import attention_dims
from .fused import FusedWeights, fusable_why, fused_step, qk_norm_why
from .options import FastOptions, default_options
from .sampling import Sampling, pick

MIN_BUCKET = 256
MAX_BUCKETS = 3  # captured buckets kept per model (each holds a KV cache of its length)


def bucket_len(needed: int) -> int:
    """The cache length a request of ``needed`` positions is served from."""
    n = MIN_BUCKET
    while n < needed:
        n *= 2
    return n


def triton_cannot_run_on(device) -> str | None:
    """Why nvkit's Triton decode-attention kernels cannot run on ``device`` (None: they can).
    "auto" asks this first; a kernel asked for by name is built anyway (Triton's interpreter runs
    it on a CPU in the tests)."""
    if device.type != "cuda":
        return f"nvkit's Triton attention kernels run on CUDA GPUs; this model is on {device.type}"
    return None


@dataclass
class _Cache:
    """One static KV cache with the device buffers its graphs read and write."""
    length: int
    kv: Any           # transformers StaticCache
    tok: Any          # (1, 1) int64: the next step's input id
    out: Any          # (K,) int64: the ids picked by one replay
    arange: Any       # (length,) int64
    temperature: Any  # 0-dim float32
    top_p: Any        # 0-dim float32
    pos: Any = None   # 0-dim int64: the next position (the fused step's own counter)
    step: Callable | None = None
    graphs: dict = field(default_factory=dict)
    logits: Any = None  # (K, vocab) float32 when a graph keeps its logits (FastDecoder.trace)
    host: Any = None    # two (pinned K-id buffer, CUDA event) pairs the host reads replays through


class FastDecoder:
    """Greedy/sampled decoding of one sequence on one GPU, K steps per CUDA-graph replay.

    ``options``: a ``FastOptions`` (default: the process's, from ``NVKIT_FAST_*``); keywords
    override single fields (``FastDecoder(model, k_steps=4)``). ``graphs=False`` runs the same step
    code without capture, for checking the logic on a CPU; it is not a fast path."""

    def __init__(self, model, options: FastOptions | None = None, *, graphs: bool = True, **overrides):
        self.options = (options or default_options()).replace(**overrides)
        self.model = model
        self.graphs = graphs
        self.device = model.get_input_embeddings().weight.device
        self.max_positions = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 1 << 20)
        self._caches: "collections.OrderedDict[int, _Cache]" = collections.OrderedDict()
        self.compiled = False      # True once the inductor step was used for a capture
        self.compile_error: str | None = None
        self.compile_detail: str | None = None  # the whole message (inductor's carry the worker's traceback)
        self.capture_seconds: dict[tuple, float] = {}
        self.last_logits: list = []
        self._lock = threading.Lock()
        opts = self.options
        self.fused_why = fusable_why(model)
        if opts.fused and self.fused_why:
            raise NvkitError(f"The fused decode step does not fit this model: {self.fused_why}. Use fused=None or False.")
        self._fused = FusedWeights(model) if opts.fused is not False and self.fused_why is None else None
        self.attention, self.attention_why = self._choose_attention(opts.attention)
        self.pdl = self._choose_pdl(opts.pdl)
        import torch._inductor.config as inductor_config
        bad = [k for k, _ in opts.inductor if not _has_inductor_option(inductor_config, k)]
        if bad:
            raise NvkitError(f"Unknown inductor option(s) {bad}: see torch._inductor.config.")

    @property
    def k(self) -> int:
        return self.options.k_steps

    @property
    def fused(self) -> bool:
        return self._fused is not None

    def _choose_attention(self, asked: str) -> tuple[str, str | None]:
        """(attention, why "auto" did not take triton-fused). "auto" is triton-fused where it fits
        (CUDA, a power-of-two head size, per-head RMS q/k norms or none), matmul elsewhere; and
        matmul also where the Triton step fails to capture on this GPU (``_captured``)."""
        if asked != "auto":
            if asked.startswith("triton"):
                self._check_triton_attention(asked)
            return asked, None
        why = triton_cannot_run_on(self.device)
        if why is None:
            try:
                self._check_triton_attention("triton-fused")
            except NvkitError as e:
                why = str(e)
        return ("matmul", why) if why else ("triton-fused", None)

    def _check_triton_attention(self, kind: str) -> None:
        if self._fused is None:
            raise NvkitError(f"attention={kind!r} belongs to the fused decode step, which does not fit this model"
                             f"{': ' + self.fused_why if self.fused_why else ' (fused=False)'}.")
        try:
            from .. import decode_attention  # noqa: F401 - imports triton
        except ImportError as e:
            raise NvkitError(f"attention={kind!r} needs the triton package ({e}); PyTorch's CUDA builds bring it.") from e
        hd = attention_dims(self.model.config)[2]
        if hd & (hd - 1):
            raise NvkitError(f"attention={kind!r} needs a power-of-two head_dim; this model's is {hd}.")
        if kind == "triton-fused":
            why = qk_norm_why(self.model, hd)
            if why:
                raise NvkitError(f"attention='triton-fused' does not fit this model: {why}. attention='triton' does.")

    @staticmethod
    def _choose_pdl(asked: bool | None) -> bool:
        """PDL where this torch's inductor can emit it (it checks the GPU itself), unless turned off."""
        import torch._inductor.config as inductor_config
        can = hasattr(inductor_config.triton, "enable_pdl")
        if asked and not can:
            import torch
            raise NvkitError(f"pdl=True needs a torch whose inductor can emit Programmatic Dependent Launch "
                             f"(torch._inductor.config.triton.enable_pdl); torch {torch.__version__} has none. "
                             "Use pdl=False.")
        return can if asked is None else bool(asked)

    def describe(self) -> str:
        """How this decoder runs, in a few words for the stats line: the step, compiled or why not,
        its attention, the steps per graph replay."""
        step = "fused step" if self._fused is not None else "model forward"
        if not self.graphs:
            how = "eager, no CUDA graphs"
        elif self.compiled:
            how = "compiled"
        elif self.compile_error:
            how = f"eager: torch.compile failed ({self.compile_error})"
        else:
            how = "eager"
        parts = [f"{step}, {how}"]
        if self._fused is not None:
            parts.append(f"{self.attention} attention" + (" (auto)" if self.options.attention == "auto" else ""))
        parts.append(f"{self.k} steps per replay")
        return ", ".join(parts)

    def _check_fused(self) -> None:
        """Weights replaced since fusing (an adapter merged, say) -> fuse again and capture again."""
        if self._fused is not None and not self._fused.valid():
            self._fused.fuse()
            self._caches.clear()
            events.record("compile", "fast decode: the weights changed; fusing and capturing again")

    # --- caches and their graphs ---------------------------------------------------------------
    def _new_cache(self, length: int) -> _Cache:
        import torch
        from transformers import StaticCache
        dev = self.device
        kv = StaticCache(config=self.model.config, max_cache_len=length)
        c = _Cache(length=length, kv=kv, pos=torch.zeros((), dtype=torch.long, device=dev),
                   tok=torch.zeros((1, 1), dtype=torch.long, device=dev),
                   out=torch.zeros((self.k,), dtype=torch.long, device=dev),
                   arange=torch.arange(length, device=dev),
                   temperature=torch.ones((), dtype=torch.float32, device=dev),
                   top_p=torch.ones((), dtype=torch.float32, device=dev))
        # Allocate the cache eagerly (lazy allocation inside a traced/captured region would move it).
        self.model(input_ids=c.tok, past_key_values=kv, use_cache=True, logits_to_keep=1)
        kv.reset()
        c.step = self._step_for(c)
        return c

    def _step_for(self, c: _Cache) -> Callable:
        if self._fused is not None:
            return fused_step(self.model, self._fused, c, attention=self.attention)
        import torch
        model, length = self.model, c.length
        layer0 = c.kv.layers[0]
        zero = torch.zeros((), dtype=model.dtype, device=self.device)
        neg = torch.full((), torch.finfo(model.dtype).min, dtype=model.dtype, device=self.device)

        def step(tok):
            # The position lives on the device (the cache's own counter), so the graph needs no host input.
            pos = layer0.cumulative_length
            # additive mask in the model dtype: sdpa takes it as is (a bool one is converted in every layer)
            mask = torch.where(c.arange <= pos, zero, neg).view(1, 1, 1, length)
            out = model(input_ids=tok, attention_mask=mask, position_ids=pos.view(1, 1), past_key_values=c.kv,
                        use_cache=True, logits_to_keep=1)
            return out.logits[:, -1, :].float()
        return step

    def _cache(self, needed: int) -> _Cache:
        length = bucket_len(needed)
        if length > self.max_positions:
            raise NvkitError(f"The prompt plus max_new_tokens (+{self.k} steps of slack) needs {needed} positions; "
                             f"the model handles {self.max_positions}. Shorten the prompt or ask for fewer tokens.")
        c = self._caches.get(length)
        if c is None:
            while len(self._caches) >= MAX_BUCKETS:
                self._caches.popitem(last=False)  # oldest: its cache and graphs are freed
            c = self._caches[length] = self._new_cache(length)
        self._caches.move_to_end(length)
        return c

    def _step_fn(self, c: _Cache):
        if not (self.options.compile and self.graphs) or self.compile_error:
            return c.step
        import torch
        # dynamic=False: one specialised kernel set per cache; fullgraph: a graph break would mean host work per step
        return torch.compile(c.step, fullgraph=True, dynamic=False)

    def _body(self, c: _Cache, key: tuple, fn, keep_logits: bool):
        def body():
            for i in range(self.k):
                logits = fn(c.tok)
                nxt = pick(logits, c.temperature, c.top_p, key)
                if keep_logits:
                    c.logits[i].copy_(logits[0])
                c.out[i].copy_(nxt[0])
                c.tok.copy_(nxt.view(1, 1))
        return body

    def _capture(self, c: _Cache, key: tuple, keep_logits: bool):
        import torch
        gkey = (key, keep_logits)
        if gkey in c.graphs:
            return c.graphs[gkey]
        if keep_logits and c.logits is None:
            vocab = int(self.model.config.get_text_config().vocab_size)
            c.logits = torch.zeros((self.k, vocab), dtype=torch.float32, device=self.device)
        if not self.graphs:
            c.graphs[gkey] = self._body(c, key, c.step, keep_logits)
            return c.graphs[gkey]
        what = f"fast decode: capturing {self.k} steps per graph for cache length {c.length} ({key[0]})"
        events.record("compile", what + (" with torch.compile; once per session and length" if self.options.compile else ""))
        t = time.perf_counter()
        # Warm-up and capture draw random numbers; keep the user's seeded stream as it was.
        rng = torch.cuda.get_rng_state(self.device)
        try:
            graph = self._captured(c, key, keep_logits)
        finally:
            torch.cuda.set_rng_state(rng, self.device)
            c.kv.reset()
        seconds = time.perf_counter() - t
        self.capture_seconds[(c.length, key, keep_logits)] = seconds
        self.compiled = self.options.compile and not self.compile_error
        events.record("compile", f"fast decode ready for cache length {c.length} in {seconds:.1f} s "
                                 f"({'compiled' if self.compiled else 'eager'} step, {self.k} steps per replay)")
        c.graphs[gkey] = graph.replay
        return c.graphs[gkey]

    def _captured(self, c: _Cache, key: tuple, keep_logits: bool):
        """The cache's graph: the compiled step, else the eager one. Under ``attention="auto"`` a
        Triton attention step that fails first gives way to "matmul", compiled: the eager Triton
        step would be slower than compiled matmul."""
        import torch
        try:
            return self._capture_with(c, key, keep_logits, self._step_fn(c))
        except Exception as e:  # noqa: BLE001 - compile problems fall back, as said above
            retry_matmul = self.options.attention == "auto" and self.attention != "matmul"
            if not retry_matmul and (not self.options.compile or self.compile_error):
                raise
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # what the failed warm-up queued ends before the retry
            if retry_matmul:
                self._attention_failed(c, e)
                return self._captured(c, key, keep_logits)
            self.compile_error = error_summary(e)
            self.compile_detail = str(e)
            events.record("compile", f"fast decode: torch.compile failed ({self.compile_error}); capturing the eager forward")
            return self._capture_with(c, key, keep_logits, c.step)

    def _attention_failed(self, c: _Cache, e: Exception) -> None:
        """attention="auto" settles on "matmul" for this decoder: ``c`` gets the matmul step, and the
        other caches (captured with the Triton step) are dropped so that every length runs one path."""
        self.attention_why = (f"attention={self.attention!r} failed on this GPU ({error_summary(e)}); "
                              "nvkit uses 'matmul' here")
        events.record("compile", f"fast decode: {self.attention_why}")
        self.attention = "matmul"
        for length in [n for n, other in self._caches.items() if other is not c]:
            del self._caches[length]
        c.graphs.clear()
        c.kv.reset()
        c.step = self._step_for(c)

    def _inductor_options(self, compiling: bool):
        """inductor settings around the capture: coordinate-descent tuning, PDL, ``options.inductor``."""
        opts = self.options
        if not compiling or not (opts.tune or self.pdl or opts.inductor):
            return contextlib.nullcontext()
        import torch._inductor.config as inductor_config
        patch = {"coordinate_descent_tuning": True} if opts.tune else {}
        if self.pdl:
            patch["triton.enable_pdl"] = True
        patch.update(dict(opts.inductor))
        return inductor_config.patch(patch)

    def _capture_with(self, c: _Cache, key: tuple, keep_logits: bool, fn):
        import torch
        body = self._body(c, key, fn, keep_logits)
        c.kv.reset()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), self._inductor_options(fn is not c.step):
            for _ in range(3):  # compile + autotune, then settle the allocator before capture
                c.kv.reset()
                c.pos.zero_()
                body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        c.kv.reset()
        c.pos.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        torch.cuda.synchronize(self.device)
        return graph

    def _positions(self, prompt_len: int, sampling: Sampling) -> int:
        """Cache positions a request needs: the prompt, the new tokens, and the up to K-1 steps a
        replay computes past the last one (+1 of slack)."""
        return prompt_len + sampling.max_new_tokens + self.k

    def ready(self, prompt_len: int, sampling: Sampling) -> bool:
        """True when a request of this size and sampling mode runs without capturing anything first."""
        c = self._caches.get(bucket_len(self._positions(prompt_len, sampling)))
        return (c is not None and (sampling.key, False) in c.graphs
                and (self._fused is None or self._fused.valid()))

    def prepare(self, prompt_len: int, sampling: Sampling) -> float:
        """Capture what a request of this size needs now; returns the seconds it took (0 when cached)."""
        with self._lock:
            t = time.perf_counter()
            self._check_fused()
            c = self._cache(self._positions(prompt_len, sampling))
            self._capture(c, sampling.key, False)
            return time.perf_counter() - t

    # --- decoding ------------------------------------------------------------------------------
    def generate(self, input_ids, sampling: Sampling, on_tokens: Callable[[list[int]], None] | None = None,
                 stop_event: threading.Event | None = None) -> list[int]:
        """Decode up to ``sampling.max_new_tokens`` ids after ``input_ids`` ((1, n) on the model's device).

        ``on_tokens`` gets each chunk of new ids as soon as it is known (the first one right after
        the prefill). Returns the new ids, EOS included when reached."""
        return self._decode(input_ids, sampling, on_tokens, stop_event, keep_logits=False)

    def trace(self, input_ids, sampling: Sampling) -> tuple[list[int], list]:
        """Debug API (tests, benchmarks): ``generate`` that also returns the float logits of each
        step as the captured graph computed them ((vocab,) tensors). It runs a graph of its own,
        which copies the logits out; the tokens are those ``generate`` gives."""
        tokens = self._decode(input_ids, sampling, None, None, keep_logits=True)
        return tokens, self.last_logits

    def _decode(self, input_ids, sampling, on_tokens, stop_event, keep_logits: bool) -> list[int]:
        with self._lock:
            n = int(input_ids.shape[-1])
            self._check_fused()
            c = self._cache(self._positions(n, sampling))
            replay = self._capture(c, sampling.key, keep_logits)
            c.kv.reset()
            c.temperature.fill_(max(sampling.temperature, 1e-5))
            c.top_p.fill_(sampling.top_p)
            eos = set(sampling.eos)
            kept: list = []
            out = self.model(input_ids=input_ids, past_key_values=c.kv, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :].float()
            first = pick(logits, c.temperature, c.top_p, sampling.key)
            c.tok.copy_(first.view(1, 1))
            c.pos.fill_(n)
            if keep_logits:
                kept.append(logits[0].clone())
            # Pipelined: the next replay is queued before the host reads the ids of the one before,
            # so the GPU is not idle while the host checks EOS and runs the callbacks (streamed text,
            # progress). At most two replays are in flight; the one queued past an EOS or a Stop is
            # wasted work (the next request resets the cache).
            pending: collections.deque = collections.deque()
            planned = 1  # tokens covered by the replays queued so far, if no EOS comes

            def queue_next() -> None:
                nonlocal planned
                if planned >= sampling.max_new_tokens or (stop_event is not None and stop_event.is_set()):
                    return
                replay()
                pending.append(self._readout(c, (planned - 1) // self.k, keep_logits))
                planned += self.k

            queue_next()  # before the first token's sync: the GPU goes on while the host streams it
            tokens = [int(first.item())]
            if on_tokens:
                on_tokens(tokens[:])
            if tokens[0] in eos:
                self._drain(pending)
                self.last_logits = kept
                return tokens
            while pending:
                queue_next()
                chunk, logits_k = self._collect(pending.popleft())
                kept.extend(logits_k)
                chunk = chunk[:sampling.max_new_tokens - len(tokens)]
                for i, t in enumerate(chunk):
                    if t in eos:
                        chunk = chunk[:i + 1]
                        break
                tokens.extend(chunk)
                if on_tokens and chunk:
                    on_tokens(chunk)
                if chunk and chunk[-1] in eos:
                    break
            self._drain(pending)
            self.last_logits = kept[:len(tokens)]
            return tokens

    def _readout(self, c: _Cache, slot: int, keep_logits: bool) -> tuple:
        """Queue the copy of one replay's ids (and logits) to where the host reads them, ahead of
        the next replay overwriting them; ``_collect`` waits for it. On CUDA the ids go to one of
        two pinned buffers (two replays in flight at most) with an event to wait on."""
        import torch
        logits = [c.logits[i].clone() for i in range(self.k)] if keep_logits else []
        if c.out.device.type != "cuda":
            return c.out.clone(), None, logits
        if c.host is None:
            c.host = [(torch.empty(self.k, dtype=torch.long, pin_memory=True), torch.cuda.Event()) for _ in range(2)]
        host, done = c.host[slot % 2]
        host.copy_(c.out, non_blocking=True)  # on c.out's device's current stream, after the replay
        done.record(torch.cuda.current_stream(c.out.device))  # that stream, not the current device's
        return host, done, logits

    @classmethod
    def _drain(cls, pending: collections.deque) -> None:
        """Wait for the replays queued past an EOS: nothing of this request runs on the GPU after
        it returns (a cache dropped next must not free a graph that is still replaying)."""
        while pending:
            cls._collect(pending.popleft())

    @staticmethod
    def _collect(item: tuple) -> tuple[list[int], list]:
        host, done, logits = item
        if done is not None:
            done.synchronize()
        return host.tolist(), logits

    def release(self) -> None:
        """Drop every captured graph and cache, and the compiled step (memory back to the allocator)."""
        with self._lock:
            codes = {c.step.__code__ for c in self._caches.values() if c.step is not None}
            self._caches.clear()
            if codes and self.options.compile and self.graphs:
                # dynamo keeps compiled entries (and what their guards hold: the model) on the code object
                try:
                    import torch._dynamo
                    for code in codes:
                        torch._dynamo.reset_code(code)
                except Exception:  # noqa: BLE001 - an older torch: the entries only cost memory
                    pass


def _has_inductor_option(config, dotted: str) -> bool:
    obj = config
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True
