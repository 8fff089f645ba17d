"""The fast decoders a session uses: built on first use and kept on the model (``decoder``; for
lists ``batched_decoder``), warmed up on purpose (``prepare``), freed with the model (``forget``),
and the ``fast=None`` rules for a request when nothing is compiled yet (``worth_capturing``,
``worth_batching``)."""

from __future__ import annotations

from typing import Callable

from ...errors import NvkitError, require
from .batched import BatchedDecoder
from .capture import FastDecoder
from .options import default_options
from .sampling import resolve, unsupported_reason

_ATTR = "_nvkit_fast_decoder"
_BATCHED = "_nvkit_batched_decoder"


def base_model(model):
    """The causal LM under a PEFT wrapper (``model`` itself when it has none). The decoder is kept
    there, so attaching, merging or removing adapters keeps it and its captures."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def current(model) -> FastDecoder | None:
    """The decoder kept on ``model``, if one was built."""
    return getattr(base_model(model), _ATTR, None) if model is not None else None


def keep(model, d: FastDecoder | None) -> None:
    """Keep ``d`` on ``model`` (None: keep none). A plain attribute on the nn.Module, not a
    submodule: unloading drops the model and the decoder with it."""
    base = base_model(model)
    if d is None:
        if getattr(base, _ATTR, None) is not None:
            object.__delattr__(base, _ATTR)
    else:
        object.__setattr__(base, _ATTR, d)


def decoder(session, **overrides) -> FastDecoder:
    """The session's decoder (created on first use; kept on the model so unloading frees it too).

    Keywords are ``FastOptions`` fields (``k_steps=4``, ``attention="matmul"``, ...): a decoder
    built otherwise is replaced by one built that way (its captures are paid again)."""
    model = base_model(session.model)
    d = current(model)
    base = d.options if d is not None else default_options()
    wanted = base.replace(**overrides)
    if d is not None and d.options == wanted:
        return d
    if d is not None:
        d.release()  # its graphs and caches go before the new one captures
    d = FastDecoder(model, wanted)
    keep(model, d)
    return d


def batched_decoder(session) -> BatchedDecoder:
    """The session's batched decoder (created on first use, kept on the model beside the batch-1
    decoder whose weights it shares; a new batch-1 decoder gets a new one)."""
    d = decoder(session)
    base = base_model(session.model)
    bd = getattr(base, _BATCHED, None)
    if bd is not None and bd.single is d:
        return bd
    if bd is not None:
        bd.release()
    bd = BatchedDecoder(d)
    object.__setattr__(base, _BATCHED, bd)
    return bd


def prepare(session, max_new_tokens: int = 256, prompt_tokens: int = 64, do_sample: bool = False,
            on_progress: Callable[[float], None] | None = None, **generation_kwargs) -> float:
    """Compile and capture the session's fast path now (a tutorial's warm-up cell), so that the
    first request does not wait for it; returns the seconds it took (≈ 0 when already done).

    One cache size class serves every request that fits it, so the sizes here only need to be
    no larger than the requests to come; the prefill graphs of prompts up to 512 tokens come too.
    Raises NvkitError saying why when the fast path cannot run this session's requests."""
    require(isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens > 0,
            f"max_new_tokens must be a whole number ≥ 1, not {max_new_tokens!r}.")
    require(isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and prompt_tokens > 0,
            f"prompt_tokens must be a whole number ≥ 1, not {prompt_tokens!r}.")
    gen = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, **generation_kwargs)
    why = unsupported_reason(session, ["x"], gen)
    if why:
        raise NvkitError(f"The fast path cannot run here: {why}.")
    sampling, _ = resolve(base_model(session.model), gen)
    import torch
    with torch.inference_mode():
        return decoder(session).prepare(prompt_tokens, sampling, on_progress=on_progress)


def forget(model) -> None:
    """Release the decoders kept on ``model`` (``Session.unload`` calls this before dropping it)."""
    d = current(model)
    bd = getattr(base_model(model), _BATCHED, None) if model is not None else None
    if bd is not None:
        bd.release()
        object.__delattr__(base_model(model), _BATCHED)
    if d is None and bd is None:
        return
    compiled = (d is not None and d.compiled) or (bd is not None and bd.compiled)
    if d is not None:
        d.release()
    if compiled:
        # Resetting only the step's code entries can leave the weights referenced by dynamo and
        # inductor state; the model is going away, so clear all of it.
        try:
            import torch._dynamo
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
    keep(model, None)


def worth_capturing(session, text: str, gen: dict) -> str | None:
    """For ``fast=None``: None when the fast path should run this request now, else why plain
    ``generate`` is the quicker answer (nothing compiled yet, and too short to pay for that).
    Once the session's fast path is compiled, every request that fits its cache runs on it."""
    min_tokens = default_options().min_tokens
    d = current(session.model)
    sampling, _ = resolve(base_model(session.model), gen)
    if d is not None and sampling is not None:
        n = len(session.tokenizer(text)["input_ids"])
        if d.ready(n, sampling):
            return None
    if int(gen["max_new_tokens"]) >= min_tokens:
        return None
    return (f"not compiled yet, and {gen['max_new_tokens']} new tokens (< {min_tokens}) would not pay for it; "
            f"nvkit.generate.fast.prepare(s), fast=True or a request of ≥ {min_tokens} tokens compiles it once")


def worth_batching(session, n_prompts: int, gen: dict) -> str | None:
    """For ``fast=None`` on a list: None when the batched fast path should run it now, else why
    continuous batching is the quicker answer (nothing compiled yet, and too few tokens in all
    to pay for that)."""
    min_tokens = default_options().min_tokens
    bd = getattr(base_model(session.model), _BATCHED, None)
    if bd is not None and bd.single is current(session.model) and bd.counts:
        return None
    total = n_prompts * int(gen["max_new_tokens"])
    if total >= min_tokens:
        return None
    return (f"not compiled yet, and {total} new tokens in all (< {min_tokens}) would not pay for it; "
            f"fast=True or a request of ≥ {min_tokens} tokens in all compiles it once")
