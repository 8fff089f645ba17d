"""The one exception type nvkit raises.

Every message says what went wrong and what to do next. Library errors are wrapped with the cause
kept (``raise NvkitError(...) from e``) so the original traceback is one scroll away.
"""

from __future__ import annotations


class NvkitError(Exception):
    """Something nvkit could not do; the message says why and what to do instead."""


def require(condition: bool, message: str) -> None:
    """Raise NvkitError(message) unless condition holds (argument checks read as one line)."""
    if not condition:
        raise NvkitError(message)
