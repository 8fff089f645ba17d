"""What ``nvkit.train.data.preview`` returns: the rows as the model sees them, and the totals.

Printed, each row is its rendered text with the tokens that carry the loss between ⟦ and ⟧; in a
notebook the same spans are highlighted. Everything shown is escaped (the data is the user's).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from ..units import counted

_OPEN, _CLOSE = "⟦", "⟧"


def _carry(n: int) -> str:
    return f"{n} {'carries' if n == 1 else 'carry'} loss"


@dataclass
class Row:
    index: int
    where: str                      # "Example 3 (data.jsonl, line 5)"
    tokens: int
    target_tokens: int
    too_long: bool
    segments: list = field(default_factory=list)   # [(text, carries loss?)]

    @property
    def text(self) -> str:
        """The row as the model sees it (chat template applied)."""
        return "".join(t for t, _ in self.segments)

    @property
    def marked(self) -> str:
        """The row with the loss-carrying tokens between ⟦ and ⟧."""
        return "".join(f"{_OPEN}{t}{_CLOSE}" if target else t for t, target in self.segments)


class Preview:
    """``rows`` (the first n, as ``Row``), ``totals`` (a dict: rows, tokens, target_tokens,
    too_long, longest, packing, sequences, steps_per_epoch, ...), ``too_long`` (which rows are over
    seq_len: finetune refuses them)."""

    def __init__(self, rows: list[Row], totals: dict, too_long: list[str]):
        self.rows = rows
        self.totals = totals
        self.too_long = too_long

    def summary(self) -> str:
        t = self.totals
        packed = (f"packed into {counted(t['sequences'], 'sequence')} of ≤ {t['seq_len']} tokens" if t["packing"]
                  else f"{counted(t['sequences'], 'sequence')} (not packed)")
        line = (f"{counted(t['rows'], t['kind'] + ' row')} · {counted(t['tokens'], 'token')} "
                f"({_carry(t['target_tokens'])}) · {packed} · {counted(t['steps_per_epoch'], 'step')} per epoch "
                f"at batch {t['batch_size']} × grad_accum {t['grad_accum']}")
        if t["too_long"]:
            line += (f"\n{counted(t['too_long'], 'row')} longer than seq_len={t['seq_len']} (finetune refuses them; "
                     f"the longest has {t['longest']} tokens): {', '.join(self.too_long[:5])}"
                     f"{' ...' if len(self.too_long) > 5 else ''}")
        return line

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"row": r.index, "where": r.where, "tokens": r.tokens, "carry_loss": r.target_tokens,
                              "too_long": r.too_long, "text": r.marked} for r in self.rows]).set_index("row")

    def __str__(self) -> str:
        out = [self.summary(), f"Tokens between {_OPEN} {_CLOSE} carry the loss."]
        for r in self.rows:
            flag = f" · over seq_len={self.totals['seq_len']}" if r.too_long else ""
            out.append(f"\n--- {r.where} · {counted(r.tokens, 'token')} · {_carry(r.target_tokens)}{flag}\n"
                       f"{r.marked}")
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<nvkit Preview: {self.summary().splitlines()[0]}>"

    def _repr_html_(self) -> str:
        parts = [f"<div class='nvkit-preview'><p>{html.escape(self.summary()).replace(chr(10), '<br>')}</p>",
                 "<p><mark>highlighted</mark> tokens carry the loss</p>"]
        for r in self.rows:
            flag = f" · <b>over seq_len={self.totals['seq_len']}</b>" if r.too_long else ""
            body = "".join(f"<mark>{html.escape(t)}</mark>" if target else html.escape(t) for t, target in r.segments)
            parts.append(f"<p><b>{html.escape(r.where)}</b> · {counted(r.tokens, 'token')} · "
                         f"{_carry(r.target_tokens)}{flag}</p>"
                         f"<pre style='white-space:pre-wrap'>{body}</pre>")
        return "".join(parts) + "</div>"
