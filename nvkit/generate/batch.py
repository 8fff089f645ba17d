"""Several prompts through transformers' continuous batching on CUDA, with a paged cache sized to
the requests (``cache_blocks``), progress per finished prompt and Stop that cancels the rest.
When a list runs here is ``fast.support``'s answer."""

from __future__ import annotations

from ..errors import NvkitError
from ..memory.estimate import kv_bytes_per_token


def cache_blocks(prompt_lengths: list[int], max_new_tokens: int, page_size: int = 256,
                 bytes_per_block: int | None = None, free_bytes: int | None = None) -> int | None:
    """Paged-cache blocks that hold every request of a batch at once: each needs its prompt plus
    ``max_new_tokens`` in pages of ``page_size``, plus one for the page it is writing into.

    Why not leave it to transformers: without ``num_blocks`` it sizes the cache from free memory
    (90 % of it), so 64 short prompts take most of a large GPU (docs/benchmarks.md), which the
    memory chart then shows as used and other work in the notebook cannot get. When the whole batch would not fit in 80 %
    of ``free_bytes`` (given ``bytes_per_block``), None: transformers then sizes the cache from
    memory and runs the requests in waves, as it would have."""
    per = [-(-(n + max_new_tokens) // page_size) + 1 for n in prompt_lengths]
    blocks = max(sum(per), 2)
    if bytes_per_block is not None and free_bytes is not None and blocks * bytes_per_block > 0.8 * free_bytes:
        return None
    return blocks


def batch_tokens(blocks: int | None, page_size: int = 256, default: int = 8192) -> int | None:
    """The most tokens one forward of the batch takes (transformers' ``max_batch_tokens``) for a
    cache of ``blocks`` pages: no more than one request can hold. transformers' default (8192)
    assumes a cache sized from free memory; with a cache sized for the batch its CUDA-graph warm-up
    asks for one 8192-token request, finds no room, and warns on stderr. A forward never needs
    more tokens than the cache holds, so this costs nothing. None (transformers sizes both) when
    ``blocks`` is None."""
    if blocks is None:
        return None
    return max(page_size, min(default, (blocks - 1) * page_size))


def _block_bytes(model, page_size: int = 256) -> int:
    """Bytes of one paged-cache block: keys and values of ``page_size`` tokens in every layer."""
    return kv_bytes_per_token(model.config, model.dtype.itemsize) * page_size


def run(session, req, use_cuda_graph: bool = True) -> list[str]:
    """Several prompts through transformers' continuous batching (``generate_batch``'s machinery):
    requests join and leave the running batch as they finish, so short prompts don't wait for long
    ones and nothing is padded. We drive the manager ourselves rather than call ``generate_batch``
    so that progress reaches ``on_progress`` and Stop cancels the remaining requests."""
    import copy

    import torch
    from transformers import ContinuousBatchingConfig
    tok, model = session.tokenizer, session.model
    texts, gen, stats = req.texts, req.gen, req.stats
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
    cb_config = ContinuousBatchingConfig(use_cuda_graph=use_cuda_graph, auto_switch_to_flash=False, num_blocks=blocks,
                                         max_batch_tokens=batch_tokens(blocks))
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        hints = WorkloadHints(max_prompt_length=max(len(i) for i in ids), max_generated_length=gen["max_new_tokens"],
                              num_requests=len(ids))
    except ImportError:  # the hints only size the cache better; older layouts work without them
        hints = None
    # The manager's own thread runs under no_grad, not inference_mode: buffers it creates here under
    # the worker's inference_mode would be read-only to it ("inplace update to inference tensor").
    with torch.inference_mode(False), torch.no_grad():
        return _batch_run(model, tok, req.job, ids, cfg, cb_config, hints, gen, stats, req.t0, req.on_progress)


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
