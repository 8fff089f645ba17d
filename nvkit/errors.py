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


def error_summary(e: BaseException, limit: int = 300) -> str:
    """One line for a status or a table cell: the exception's type and first line and, when the
    message goes on, its last non-empty line. Inductor's errors start with a header
    ("SubprocException: An exception occurred in a subprocess:") and end with the cause, which is
    the part that says what went wrong."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = type(e).__name__ + (": " + lines[0] if lines else "")
    # Dynamo's messages end in advice and a stack ("from user code:", File lines, "Set
    # TORCHDYNAMO_VERBOSE=1 ..."); the cause is the last line before those
    tail = [ln for ln in lines[1:] if not ln.startswith(_BOILERPLATE)]
    if tail:
        text += " … " + tail[-1]
    return text if len(text) <= limit else text[: limit - 1] + "…"


_BOILERPLATE = ("Set TORCHDYNAMO_VERBOSE", "For more details about this graph break", "from user code:", 'File "',
                "Hint:", "Explanation:")
