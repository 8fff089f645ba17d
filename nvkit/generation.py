"""How a generation request runs (inside the worker thread, under inference_mode).

One prompt: on CUDA nvkit's fast path (``nvkit.fast``: static cache, K decode steps per CUDA-graph
replay), else transformers' ``generate`` with a stop criterion and an incremental streamer.
Several prompts: continuous batching on CUDA, one left-padded batch on the CPU. Every face gets
these through ``Session.generate``; ``stats.path`` records which one ran.
"""

from __future__ import annotations

import time

from .errors import NvkitError, error_summary


def _stopping(job):
    from transformers import StoppingCriteriaList
    from .session import _StopOnEvent
    return StoppingCriteriaList([_StopOnEvent(job.stop_event)])


def plain(session, job, texts, gen, stream, stats, t0, on_progress=None):
    """Plain ``model.generate``: one prompt streamed, or a left-padded batch; returns new text per prompt."""
    from .session import _CallbackStreamer
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

    def on_token():
        if "t" not in first:
            first["t"] = time.perf_counter() - t0
            stats.time_to_first_token = first["t"]
        stats.new_tokens += len(texts)
        if on_progress:
            on_progress(stats)

    streamer = _CallbackStreamer(tok, stream or (lambda piece: None), on_token)
    out = model.generate(**enc, **gen, streamer=streamer, stopping_criteria=_stopping(job))
    new = out[:, enc["input_ids"].shape[1]:]
    # count what was really produced (streamer counted steps; pads after EOS are not tokens), up to the
    # request's EOS where it names one (eos_token_id=None: none), else the model's
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
    return [tok.decode(row, skip_special_tokens=True) for row in new]


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def cache_blocks(prompt_lengths: list[int], max_new_tokens: int, page_size: int = 256,
                 bytes_per_block: int | None = None, free_bytes: int | None = None) -> int | None:
    """Paged-cache blocks that hold every request of a batch at once: each needs its prompt plus
    ``max_new_tokens`` in pages of ``page_size``, plus one for the page it is writing into.

    Why not leave it to transformers: without ``num_blocks`` it sizes the cache from free memory
    (90 % of it), so 64 short prompts took 124.7 GiB of an H200, which the memory chart then shows
    as used and other work in the notebook cannot get. When the whole batch would not fit in 80 %
    of ``free_bytes`` (given ``bytes_per_block``), None: transformers then sizes the cache from
    memory and runs the requests in waves, as it would have."""
    per = [-(-(n + max_new_tokens) // page_size) + 1 for n in prompt_lengths]
    blocks = max(sum(per), 2)
    if bytes_per_block is not None and free_bytes is not None and blocks * bytes_per_block > 0.8 * free_bytes:
        return None
    return blocks


def _block_bytes(model, page_size: int = 256) -> int:
    """Bytes of one paged-cache block: keys and values of ``page_size`` tokens in every layer."""
    from .estimate import kv_bytes_per_token
    return kv_bytes_per_token(model.config, model.dtype.itemsize) * page_size


def batch(session, job, texts, gen, stats, t0, on_progress=None, use_cuda_graph=True):
    """Several prompts through transformers' continuous batching (``generate_batch``'s machinery):
    requests join and leave the running batch as they finish, so short prompts don't wait for long
    ones and nothing is padded. We drive the manager ourselves rather than call ``generate_batch``
    so that progress reaches ``on_progress`` and Stop cancels the remaining requests."""
    import copy

    import torch
    from transformers import ContinuousBatchingConfig
    tok, model = session.tokenizer, session.model
    ids = [tok(t)["input_ids"] for t in texts]
    stats.prompt_tokens = sum(len(i) for i in ids)
    stats.path = "generate_batch"
    cfg = copy.deepcopy(model.generation_config)
    cfg.update(**{k: v for k, v in gen.items() if k != "max_new_tokens"})
    cfg.max_new_tokens = gen["max_new_tokens"]
    free, _ = torch.cuda.mem_get_info(session.device)
    blocks = cache_blocks([len(i) for i in ids], gen["max_new_tokens"], bytes_per_block=_block_bytes(model),
                          free_bytes=free)
    # auto_switch_to_flash=False: the flash packages come from the Hub when missing, unreachable offline
    cb_config = ContinuousBatchingConfig(use_cuda_graph=use_cuda_graph, auto_switch_to_flash=False, num_blocks=blocks)
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        hints = WorkloadHints(max_prompt_length=max(len(i) for i in ids), max_generated_length=gen["max_new_tokens"],
                              num_requests=len(ids))
    except ImportError:  # the hints only size the cache better; older layouts work without them
        hints = None
    # The manager's own thread runs under no_grad, not inference_mode: buffers it creates here under
    # the worker's inference_mode would be read-only to it ("inplace update to inference tensor").
    with torch.inference_mode(False), torch.no_grad():
        return _batch_run(model, tok, job, ids, cfg, cb_config, hints, gen, stats, t0, on_progress)


def _batch_run(model, tok, job, ids, cfg, cb_config, hints, gen, stats, t0, on_progress):
    manager = model.init_continuous_batching(generation_config=cfg, continuous_batching_config=cb_config,
                                             workload_hints=hints)
    results: dict = {}
    stopped = False
    try:
        manager.warmup()
        manager.start()
        request_ids = manager.add_requests(inputs=ids, max_new_tokens=gen["max_new_tokens"], record_timestamps=True)
        while len(results) < len(request_ids):
            if job.stop_event.is_set():
                stopped = True
                for rid in request_ids:
                    if rid not in results:
                        manager.cancel_request(rid)
                break
            res = manager.get_result(timeout=0.05)
            if res is None:
                if not manager.is_running():
                    break
                continue
            if not res.is_finished():
                continue
            if res.error is not None:
                raise NvkitError(f"Continuous batching failed on a request: {res.error}")
            results[res.request_id] = res
            stats.new_tokens += len(res.generated_tokens)
            first = (res.timestamps or [None])[0]
            if first is not None:
                ttft = first - t0
                if stats.time_to_first_token is None or ttft < stats.time_to_first_token:
                    stats.time_to_first_token = ttft
            stats.prompts_done = len(results)
            if on_progress:
                on_progress(stats)
        if not stopped and len(results) < len(request_ids):
            raise NvkitError(f"Continuous batching ended early: {len(results)} of {len(request_ids)} prompts finished "
                             "(see the log above). Pass fast=False to use padded generate instead.")
    finally:
        try:
            manager.stop(block=True, timeout=30, hard_stop=stopped)
        finally:
            manager.destroy()
    # outputs in input order; a prompt cut short by Stop gives ""
    return [tok.decode(results[r].generated_tokens, skip_special_tokens=True) if r in results else ""
            for r in request_ids]


def run(session, job, texts, gen, stream, fast, stats, t0, on_progress=None):
    """Pick the path for this request and run it; ``stats.path`` says which one ran.

    One prompt on CUDA: nvkit's fast path (``nvkit.fast``) unless ``fast=False`` or the request needs
    something it does not implement (then plain ``generate``; ``fast=True`` makes that an error).
    With ``fast=None`` a short request whose length and sampling mode are not captured yet runs
    plain ``generate`` instead of waiting for the capture (``fast.worth_capturing``).
    Several prompts on CUDA: continuous batching. On the CPU: plain ``generate`` (a left-padded
    batch for a list)."""
    from . import events
    cuda = session.device.type == "cuda"
    if fast and not cuda:
        raise NvkitError("fast=True needs a CUDA GPU.")
    if len(texts) > 1:
        if cuda and fast is not False and not stream:
            from .fast import unsupported_reason
            why = unsupported_reason(session, texts[:1], gen, batch=True)  # one GPU, no adapter, no quantization
            if why is None:
                return batch(session, job, texts, gen, stats, t0, on_progress)
            events.record("batch", f"continuous batching off: {why}; padded generate instead")
            stats.detail = f"continuous batching off: {getattr(why, 'short', why)}"
        stats.path = "generate"
        outs = plain(session, job, texts, gen, stream, stats, t0, on_progress)
        stats.prompts_done = len(texts)
        return outs
    if cuda and fast is not False:
        from . import fast as fast_path
        why = fast_path.unsupported_reason(session, texts, gen)
        if why is None and fast is None:
            why = fast_path.worth_capturing(session, texts[0], gen)
        if why is None:
            try:
                return fast_path.run(session, job, texts[0], gen, stream, stats, t0, on_progress)
            except NvkitError:
                raise
            except Exception as e:  # noqa: BLE001 - an unexpected failure of the fast path is not the user's problem
                if fast or stats.new_tokens:
                    raise NvkitError(f"The fast decode path failed: {type(e).__name__}: {e}. "
                                     "Generate with fast=False to use plain transformers generate.") from e
                why = fast_path.Reason(f"it failed ({error_summary(e)})", f"it failed ({type(e).__name__})")
        if fast:
            raise NvkitError(f"fast=True, but the fast path cannot run this request: {why}. "
                             "Drop fast=True (plain generate is used then) or change the request.")
        events.record("fast-off", f"fast decode off: {why}")
        stats.detail = f"fast path off: {getattr(why, 'short', why)}"
    stats.path = "generate"
    return plain(session, job, texts, gen, stream, stats, t0, on_progress)
