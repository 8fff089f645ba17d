"""Argument checks shared by every public entry point, so one kind of value is refused with one
wording everywhere (``NvkitError`` naming the argument and what it takes)."""

from __future__ import annotations

from .errors import NvkitError


def positive_int(name: str, v, allow_none: bool = False):
    """``v`` when it is a whole number ≥ 1 (``None`` too, with ``allow_none``), else NvkitError."""
    if v is None and allow_none:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise NvkitError(f"{name} must be a whole number ≥ 1, not {v!r}.")
    return v
