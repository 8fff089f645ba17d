"""The fast decoder a session uses: built on first use and kept on the model (``decoder``), freed
with it (``forget``), and the ``fast=None`` rule for a request nothing is captured for yet
(``worth_capturing``)."""

from __future__ import annotations

from .capture import FastDecoder
from .options import default_options
from .sampling import resolve

_ATTR = "_nvkit_fast_decoder"


def current(model) -> FastDecoder | None:
    """The decoder kept on ``model``, if one was built."""
    return getattr(model, _ATTR, None) if model is not None else None


def keep(model, d: FastDecoder | None) -> None:
    """Keep ``d`` on ``model`` (None: keep none). A plain attribute on the nn.Module, not a
    submodule: unloading drops the model and the decoder with it."""
    if d is None:
        if current(model) is not None:
            object.__delattr__(model, _ATTR)
    else:
        object.__setattr__(model, _ATTR, d)


def decoder(session, **overrides) -> FastDecoder:
    """The session's decoder (created on first use; kept on the model so unloading frees it too).

    Keywords are ``FastOptions`` fields (``k_steps=4``, ``attention="matmul"``, ...): a decoder
    built otherwise is replaced by one built that way (its captures are paid again)."""
    model = session.model
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


def forget(model) -> None:
    """Release the decoder kept on ``model`` (``Session.unload`` calls this before dropping it)."""
    d = current(model)
    if d is None:
        return
    compiled = d.compiled
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
    ``generate`` is the quicker answer (nothing captured for it yet, and too short to pay for that)."""
    min_tokens = default_options().min_tokens
    if int(gen["max_new_tokens"]) >= min_tokens:
        return None
    d = current(session.model)
    sampling, _ = resolve(session.model, gen)
    if d is not None and sampling is not None:
        n = len(session.tokenizer(text)["input_ids"])
        if d.ready(n, sampling):
            return None
    return (f"nothing is captured yet for this length and sampling mode, and {gen['max_new_tokens']} new tokens "
            f"(< {min_tokens}) would not pay the one-time capture; fast=True (or a request of "
            f"≥ {min_tokens} tokens) captures it once per session")
