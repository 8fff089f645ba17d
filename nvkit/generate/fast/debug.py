"""Debug API of the fast path, for benchmarks and tests: several decoders of one model side by
side (``swap``). ``FastDecoder.trace`` gives each step's logits."""

from __future__ import annotations

from ...errors import NvkitError
from .attached import current, keep
from .capture import FastDecoder


def swap(session, d: FastDecoder | None) -> FastDecoder | None:
    """Make ``d`` the session's decoder and return the one it replaces, without releasing either
    (the decode benchmark keeps several captured side by side to time them in alternation). The
    caller owns the returned decoder: ``release()`` it, or swap it back."""
    model = session.model
    if d is not None and d.model is not model:
        raise NvkitError("This decoder was built for another model; nvkit.generate.fast.decoder(session) builds one for it.")
    old = current(model)
    keep(model, d)
    return old
