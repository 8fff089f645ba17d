"""Sizes and counts as people read them. One formatter each, so every face prints a byte count the
same way and says "1 step", never "1 steps"."""

from __future__ import annotations


def fmt_bytes(n: float | int | None) -> str:
    """``1536`` → ``"1.50 KiB"``; ``None`` → ``"n/a"`` (a reading that could not be taken)."""
    if n is None:
        return "n/a"
    n = float(n)
    if n != n:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``counted(1, "step")`` → ``"1 step"``; ``counted(3, "step")`` → ``"3 steps"`` (``plural`` for
    nouns that don't take an s)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
