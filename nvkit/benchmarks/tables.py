"""How the benchmarks print their tables: one width and column rule for all of them, so a log of
several benchmarks reads alike."""

from __future__ import annotations


def table_text(df, *, index: bool = True, colwidth: int = 70, float_format=None) -> str:
    """``df`` as text, wide enough for a terminal log (no wrapping of the columns)."""
    import pandas as pd
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.max_colwidth", colwidth):
        return df.to_string(index=index, float_format=float_format)
