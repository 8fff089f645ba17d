"""Argument checks shared by every public entry point, so one kind of value is refused with one
wording everywhere (``NvkitError`` naming the argument and what it takes), and the parsers of
nvkit's ``NVKIT_*`` environment variables (an unusable value is an error naming the variable, not
a ``ValueError`` from deep inside an import)."""

from __future__ import annotations

import math
import os
import re

from .errors import NvkitError


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def whole_number(name: str, v, lo: int = 1, hi: int | None = None, allow_none: bool = False):
    """``v`` when it is a whole number in ``[lo, hi]`` (``None`` too, with ``allow_none``), else NvkitError."""
    if v is None and allow_none:
        return None
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        span = f"from {lo} to {hi}" if hi is not None else f"≥ {lo}"
        raise NvkitError(f"{name} must be a whole number {span}, not {v!r}.")
    return v


def positive_int(name: str, v, allow_none: bool = False):
    """``v`` when it is a whole number ≥ 1 (``None`` too, with ``allow_none``), else NvkitError."""
    return whole_number(name, v, 1, allow_none=allow_none)


def number(name: str, v, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False, allow_none: bool = False):
    """``v`` as a float when it is a finite real number within the bounds (``lo_open``: ``v > lo``
    rather than ``≥``), else NvkitError. NaN and infinities are refused: no setting means them."""
    if v is None and allow_none:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    if not ok:
        if lo is not None and hi is not None:
            span = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            span = f" {'>' if lo_open else '≥'} {lo:g}"
        elif hi is not None:
            span = f" {'<' if hi_open else '≤'} {hi:g}"
        else:
            span = ""
        raise NvkitError(f"{name} must be a finite number{span}, not {v!r}.")
    return float(v)


def flag(name: str, v, allow_none: bool = False):
    """``v`` when it is True or False (``None`` too, with ``allow_none``), else NvkitError."""
    if v is None and allow_none:
        return None
    if not isinstance(v, bool):
        raise NvkitError(f"{name} must be True or False{' or None' if allow_none else ''}, not {v!r}.")
    return v


def one_of(name: str, v, choices, allow_none: bool = False):
    """``v`` when it is one of ``choices`` (strings; compared without hashing, so a list or a dict
    given by mistake is refused like any other wrong value), else NvkitError listing them."""
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or v not in tuple(choices):
        raise NvkitError(f"{name} must be one of {', '.join(map(repr, choices))}"
                         f"{' or None' if allow_none else ''}, not {v!r}.")
    return v


# Units accelerate's max_memory parser takes (convert_file_size_to_int); a trailing lowercase "b"
# means bits there ("8Gb" = 1 GB), which nvkit passes through unchanged.
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(GiB|MiB|KiB|GB|MB|KB)\s*$", re.IGNORECASE)
_UNIT = {"gib": 2**30, "mib": 2**20, "kib": 2**10, "gb": 10**9, "mb": 10**6, "kb": 10**3}


def byte_size(name: str, v) -> int:
    """Bytes of a memory size: a whole number of bytes ≥ 0 or a string such as "20GiB", "512MiB",
    "1.5GB" (the forms transformers' ``max_memory`` takes), else NvkitError."""
    if _is_int(v) and v >= 0:
        return v
    m = _SIZE.match(v) if isinstance(v, str) else None
    if m is None:
        raise NvkitError(f"{name} must be a size such as '20GiB', '512MiB' or '1.5GB' (units GiB, MiB, KiB, GB, "
                         f"MB, KB), or a whole number of bytes ≥ 0, not {v!r}.")
    unit = m.group(2)
    n = float(m.group(1)) * _UNIT[unit.lower()]
    return int(n // 8 if unit.endswith("b") and "i" not in unit.lower() else n)


# --- environment variables ----------------------------------------------------------------------

def _env(name: str, environ=None) -> str | None:
    raw = (os.environ if environ is None else environ).get(name)
    return None if raw is None or raw.strip() == "" else raw.strip()


def _env_error(name: str, raw: str, wanted: str) -> NvkitError:
    return NvkitError(f"The environment variable {name}={raw!r} is not valid: it must be {wanted}. "
                      f"Fix it or unset it (del os.environ[{name!r}] in Python, unset {name} in a shell) "
                      "before nvkit reads it.")


def env_int(name: str, default: int, lo: int = 1, hi: int | None = None, environ=None) -> int:
    """The whole number in ``$name`` (``default`` when unset or empty), else NvkitError naming it.
    ``environ``: the mapping to read (default: this process's environment)."""
    raw = _env(name, environ)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = None
    if v is None or v < lo or (hi is not None and v > hi):
        raise _env_error(name, raw, f"a whole number {f'from {lo} to {hi}' if hi is not None else f'≥ {lo}'}")
    return v


def env_number(name: str, default: float, lo: float = 0.0, environ=None) -> float:
    """The finite number ≥ ``lo`` in ``$name`` (``default`` when unset or empty), else NvkitError naming it."""
    raw = _env(name, environ)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = None
    if v is None or not math.isfinite(v) or v < lo:
        raise _env_error(name, raw, f"a number ≥ {lo:g}")
    return v


def env_flag(name: str, default: bool, environ=None) -> bool:
    """``$name`` as a switch: 1/true/yes/on or 0/false/no/off (``default`` when unset or empty)."""
    raw = _env(name, environ)
    if raw is None:
        return default
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise _env_error(name, raw, "1 or 0 (true/false, yes/no, on/off)")


def env_choice(name: str, default: str, choices, environ=None) -> str:
    """``$name`` when it is one of ``choices`` (``default`` when unset or empty), else NvkitError."""
    raw = _env(name, environ)
    if raw is None:
        return default
    if raw not in tuple(choices):
        raise _env_error(name, raw, f"one of {', '.join(choices)}")
    return raw


def env_set(name: str, environ=None) -> bool:
    """True when ``$name`` holds something (an empty value counts as unset)."""
    return _env(name, environ) is not None


def env_path(name: str) -> str | None:
    """The folder path in ``$name`` with ``~`` expanded (None when unset or empty)."""
    raw = _env(name)
    if raw is None:
        return None
    if "\0" in raw:
        raise _env_error(name, raw, "a folder path")
    return os.path.expanduser(raw)
