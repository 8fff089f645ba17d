"""How a generation request runs (inside the worker thread, under inference_mode).

One prompt: on CUDA nvkit's fast path (``nvkit.generate.fast``: static cache, K decode steps per
CUDA-graph replay), else transformers' ``generate`` with a stop criterion and an incremental
streamer. Several prompts: on CUDA nvkit's batched fast path (``fast.batched``: the fused step over
many rows, a paged cache, continuous refill), else transformers' continuous batching
(``nvkit.generate.batch``); one left-padded batch on the CPU. Every face gets these through ``Session.generate``;
``request.stats.path`` records which one ran.

The session is used through what any loaded session has (``model``, ``tokenizer``, ``device``,
``quantization``), so this wing never imports the session module, which sits above it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import events
from ..errors import NvkitError, error_summary
from ..threads import Job
from . import batch as batch_path
from .fast import decoders as fast_decoders, first_request, sampling as fast_sampling, support
from .stats import GenerationStats


class StopOnEvent:
    """StoppingCriteria that ends generation within a step once the event is set. The answer is
    one of two tensors made once per batch size and device: generate calls this every token."""

    def __init__(self, event: threading.Event):
        self.event = event
        self._answers: dict = {}

    def __call__(self, input_ids, scores, **kwargs):
        import torch
        key = (input_ids.shape[0], input_ids.device)
        answers = self._answers.get(key)
        if answers is None:
            answers = self._answers[key] = tuple(torch.full((input_ids.shape[0],), v, dtype=torch.bool,
                                                            device=input_ids.device) for v in (False, True))
        return answers[self.event.is_set()]


class CallbackStreamer:
    """A transformers streamer that hands text pieces to a callback in the worker thread (no
    queue, so nothing can block forever if generate raises), and counts tokens for ``on_token``.

    Each token decodes only the last few ids (the window since the last piece, and the token
    before it for the tokenizers that drop a leading space), not the whole text so far: decoding
    everything again made every token cost more the longer the answer. Without a callback nothing
    is decoded at all."""

    def __init__(self, tokenizer, callback: Callable[[str], Any] | None = None,
                 on_token: Callable[[int], None] | None = None):
        self.tokenizer = tokenizer
        self.callback = callback
        self.on_token = on_token
        self.ids: list[int] = []
        self.prefix = 0    # ids[prefix:read] decode to the text sent last...
        self.read = 0      # ...ids[read:] are not sent yet
        self.prompt_skipped = False

    def put(self, value):
        if not self.prompt_skipped:  # the first put is the prompt
            self.prompt_skipped = True
            return
        if self.callback is None:
            if self.on_token:
                self.on_token(int(value.numel()))
            return
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())
        if self.on_token:
            self.on_token(int(value.numel()))
        self._send(final=False)

    def _send(self, final: bool) -> None:
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        text = decode(self.ids[self.prefix:], skip_special_tokens=True)
        # Hold back an incomplete UTF-8 sequence (shown as U+FFFD) until its bytes arrive.
        if len(text) > len(before) and (final or not text.endswith("\ufffd")):
            self.callback(text[len(before):])
            self.prefix, self.read = self.read, len(self.ids)

    def end(self):
        if self.callback is not None:
            self._send(final=True)


@dataclass
class Request:
    """One call of ``Session.generate``: the prompt texts (chat template applied), the generation
    arguments, the streaming callback, the fast-path choice, and the stats it fills as it runs."""
    job: Job
    texts: list[str]
    gen: dict
    stream: Callable[[str], Any] | None = None
    fast: bool | None = None
    on_progress: Callable[[GenerationStats], Any] | None = None
    #: each prompt's text as it is alone, in any list (``support.route``'s deterministic paths)
    deterministic: bool = False
    stats: GenerationStats = field(default_factory=GenerationStats)
    t0: float = field(default_factory=time.perf_counter)


def _stopping(job):
    from transformers import StoppingCriteriaList
    return StoppingCriteriaList([StopOnEvent(job.stop_event)])


def run_plain(session, req: Request) -> list[str]:
    """Plain ``model.generate``: one prompt streamed, or a left-padded batch; returns new text per prompt."""
    texts, gen, stats, t0, on_progress = req.texts, req.gen, req.stats, req.t0, req.on_progress
    tok, model = session.tokenizer, session.model
    single = len(texts) == 1
    old_side = tok.padding_side
    tok.padding_side = "left"  # decoder-only models continue from the right edge
    try:
        enc = tok(texts, return_tensors="pt", padding=not single).to(session.device)
    finally:
        tok.padding_side = old_side
    stats.prompt_tokens = int(enc["attention_mask"].sum())
    first = {}

    def on_token(count: int):
        if "t" not in first:
            first["t"] = time.perf_counter() - t0
            stats.time_to_first_token = first["t"]
        stats.new_tokens += count
        if on_progress:
            on_progress(stats)

    streamer = CallbackStreamer(tok, req.stream, on_token)
    extra = {"tokenizer": tok} if gen.get("stop_strings") else {}  # transformers needs it to match the strings
    try:
        out = model.generate(**enc, **gen, **extra, streamer=streamer, stopping_criteria=_stopping(req.job))
    except ValueError as e:
        # transformers checks combinations of settings only once generate runs (nvkit.generate.options
        # checks the single values up front); its ValueError is about the arguments, so say which
        settings = ", ".join(f"{k}={v!r}" for k, v in gen.items() if k != "pad_token_id")
        raise NvkitError(f"transformers refused the generation settings ({settings}): "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    new = out[:, enc["input_ids"].shape[1]:]
    # count what was really produced (streamer counted steps; pads after EOS are not tokens)
    # up to the request's EOS where it names one (eos_token_id=None: none), else the model's
    eos = set(_as_list(gen["eos_token_id"] if "eos_token_id" in gen else getattr(model.generation_config, "eos_token_id", None)))
    pad = gen.get("pad_token_id")
    produced = 0
    for row in new.tolist():
        for t in row:
            if t in eos or (pad is not None and t == pad and pad in eos):
                produced += 1
                break
            produced += 1
    stats.new_tokens = produced
    if single and produced >= 2 and session.device.type == "cuda":
        # what a short first request weighs against capturing the fast path (fast.first_request):
        # this session's, and a session's first one for the next session on this machine
        per_token = (time.perf_counter() - t0) / produced
        if session.decoders.plain_per_token is None:
            first_request.remember_plain(support.base_model(model), session.device, per_token)
        session.decoders.plain_per_token = per_token
    return [tok.decode(row, skip_special_tokens=True) for row in new]


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def run_fast(session, req: Request, route: support.Route | None = None) -> list[str]:
    """One prompt through the fast path, streamed; fills ``stats`` like the plain path. While the
    fast path captures or compiles (once per session each), ``stats.detail`` says so and ``on_progress`` hears it
    about once a second. ``route``: ``support.route``'s answer (None: this path, asked for directly)."""
    import torch
    route = route or support.forced(session, req.texts, req.gen, "fast")
    stats, t0 = req.stats, req.t0
    tok = session.tokenizer
    ids = torch.tensor(route.ids, dtype=torch.long, device=session.device)
    stats.prompt_tokens = int(ids.shape[-1])
    stats.path = "fast"
    streamer = CallbackStreamer(tok, req.stream)
    streamer.put(ids)  # the first put is the prompt, skipped
    produced: list[int] = []

    def on_tokens(chunk: list[int]):
        if stats.time_to_first_token is None:
            stats.time_to_first_token = time.perf_counter() - t0
            stats.detail = ""
        produced.extend(chunk)
        stats.new_tokens = len(produced)
        streamer.put(torch.tensor(chunk))
        if req.on_progress:
            req.on_progress(stats)

    def preparing(seconds: float):
        stats.detail = f"preparing fast decode… {seconds:.0f} s"
        if req.on_progress:
            req.on_progress(stats)

    fresh = fast_decoders.current(session) is None  # then its set-up is part of this request's wait
    d = fast_decoders.decoder(session)
    before = {} if fresh else dict(d.timings)
    entries = first_request.triton_cache_entries() if fresh else None
    try:
        d.generate(ids, route.sampling, on_tokens=on_tokens, stop_event=req.job.stop_event, tokenizer=tok,
                   on_progress=preparing)
    finally:
        stats.prepared = d.timings.since(before).describe()
    if fresh:  # what the next session's short first request weighs against plain generate
        first_request.remember_first_capture(d.model, session.device, d.timings, entries_before=entries)
        fast_decoders.start_compile_ahead(session)
    stats.detail = d.describe()
    streamer.end()
    return [tok.decode(produced, skip_special_tokens=True)]


def run_batched(session, req: Request, route: support.Route | None = None) -> list[str]:
    """Several prompts through the batched fast path (``fast.batched``): outputs in input order,
    "" for a prompt not finished when Stop came; ``on_progress`` hears prompts done and tokens so
    far after each replay (a few times a second at most), and "preparing…" while it captures or compiles.
    A route with ``invariant`` (``deterministic=True``, one prompt too) runs the batch-invariant
    decoder; its one prompt's text reaches ``stream`` in one piece when it is done. One prompt
    runs here too where the lists have captured the rows and the batch-1 path is not captured yet
    (``support.route``; never for a prompt that streams)."""
    import torch
    route = route or support.forced(session, req.texts, req.gen, "fast batch")
    stats, t0 = req.stats, req.t0
    tok = session.tokenizer
    ids = route.ids
    stats.prompt_tokens = sum(len(i) for i in ids)
    stats.path = "fast batch"
    # one draw from torch's generator: seed= (torch.manual_seed) makes the whole batch repeatable,
    # and each prompt's own seed depends on it and the prompt's place only
    base = int(torch.randint(0, 2 ** 62, (1,)).item())
    seeds = fast_sampling.request_seeds(base, len(ids))
    last = [0.0]

    def on_tokens(done: int, produced: int):
        now = time.perf_counter()
        if stats.time_to_first_token is None:
            stats.time_to_first_token = now - t0
            stats.detail = ""
        # seconds so far: the stats' tok/s is live for progress displays (the session sets the total at the end)
        stats.new_tokens, stats.prompts_done, stats.seconds = produced, done, now - t0
        if req.on_progress and (now - last[0] >= 0.2 or done == len(ids)):
            last[0] = now
            req.on_progress(stats)

    def preparing(seconds: float):
        stats.detail = f"preparing batched decode… {seconds:.0f} s"
        if req.on_progress:
            req.on_progress(stats)

    fresh = not route.invariant and session.decoders.rows is None and session.device.type == "cuda"
    bd = (fast_decoders.invariant_decoder if route.invariant else fast_decoders.batched_decoder)(session)
    before = dict(bd.timings)
    entries = first_request.triton_cache_entries() if fresh else None
    try:
        outs = bd.generate(ids, route.sampling, seeds, stop_event=req.job.stop_event, tokenizer=tok, on_progress=preparing,
                           on_tokens=on_tokens)
    finally:
        stats.prepared = bd.timings.since(before).describe()
    if fresh:  # what the next session's short first list weighs against plain generate
        first_request.remember_first_capture(bd.model, session.device, bd.timings, "rows", entries_before=entries)
    stats.detail = "; ".join([bd.describe(), *route.off])
    texts = [tok.decode(o, skip_special_tokens=True) if o is not None else "" for o in outs]
    if req.stream is not None and texts[0]:
        req.stream(texts[0])
    return texts


def run_plain_alone(session, req: Request) -> list[str]:
    """Each prompt of a list alone on plain ``generate``, one after another (``deterministic=True``
    where the invariant path cannot run): every text is the one its prompt gets alone. Stop ends
    it after the prompt running then (the rest come back "")."""
    import dataclasses
    stats, outs = req.stats, []
    for text in req.texts:
        one = dataclasses.replace(req, texts=[text], stats=GenerationStats(), on_progress=None, t0=time.perf_counter())
        outs += run_plain(session, one)
        if stats.time_to_first_token is None and one.stats.time_to_first_token is not None:
            stats.time_to_first_token = one.t0 - req.t0 + one.stats.time_to_first_token
        stats.prompt_tokens += one.stats.prompt_tokens
        stats.new_tokens += one.stats.new_tokens
        stats.prompts_done = len(outs)
        if req.on_progress:
            req.on_progress(stats)
        if req.job.stop_event.is_set():
            break
    return outs + [""] * (len(req.texts) - len(outs))


def run(session, req: Request) -> list[str]:
    """Pick the path for this request (``fast.support.route``) and run it; ``req.stats.path``
    says which one ran.

    One prompt on CUDA: nvkit's fast path unless ``fast=False`` or the request needs something it
    does not implement (then plain ``generate``; ``fast=True`` makes that an error). With
    ``fast=None`` a short request whose length and sampling mode are not captured yet runs on the
    batched fast path where a list has captured it, else plain ``generate`` instead of waiting for
    the capture. Several prompts on CUDA: the batched fast
    path, else continuous batching, else padded ``generate``. On the CPU: plain ``generate`` (a
    left-padded batch for a list). When another path runs on a GPU although the fast path was not
    turned off, ``stats.detail`` says why ("fast path off: ..."); an unexpected failure of a fast
    path falls back the same way unless ``fast=True`` or tokens were already streamed. With
    ``deterministic`` (``support.route``): the batch-invariant rows path, one prompt too, else each
    prompt alone on plain ``generate``."""
    texts, gen, stats, fast = req.texts, req.gen, req.stats, req.fast
    single = len(texts) == 1
    if fast and session.device.type != "cuda":
        raise NvkitError("fast=True needs a CUDA GPU.")
    route = support.route(session, texts, gen, fast, stream=req.stream is not None, deterministic=req.deterministic)
    if route.path in support.FAST:
        try:
            return (run_fast if route.path == "fast" else run_batched)(session, req, route)
        except NvkitError:
            raise
        except Exception as e:  # noqa: BLE001 - an unexpected failure of the fast path is not the user's problem
            what = "fast decode path" if single else "batched fast path"
            if fast or stats.new_tokens:
                raise NvkitError(f"The {what} failed: {type(e).__name__}: {e}. Generate with fast=False to use "
                                 f"{'plain' if single else 'padded'} transformers generate.") from e
            stats.time_to_first_token, stats.detail = None, ""
            failed = f"it failed ({error_summary(e)})"
            if route.invariant:
                route = support.alone_fallback(failed)
            else:
                route = support.fallback(session, texts, gen, fast, failed)
    if fast:
        if single:
            raise NvkitError(f"fast=True, but the fast path cannot run this request: {route.why}. "
                             "Drop fast=True (plain generate is used then) or change the request.")
        raise NvkitError(f"fast=True, but the batched fast path cannot run these prompts: {route.why}. "
                         "Drop fast=True (continuous batching or padded generate is used then) or change the request.")
    for line in route.off:
        events.record("fast-off" if "fast path off" in line else "batch", line)
    stats.detail = "; ".join(route.off)
    if route.path == "generate_batch":
        return batch_path.run(session, req)
    stats.path = "generate"
    if route.alone and not single:
        return run_plain_alone(session, req)
    outs = run_plain(session, req)
    if not single:
        stats.prompts_done = len(texts)
    return outs
