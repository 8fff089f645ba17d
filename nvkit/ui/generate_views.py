"""What the Generate panel shows, as HTML built from plain values: the transcript, the stats line,
the list mode's prompts and results table, base and tuned side by side. Every piece of the user's
text is escaped here; the panel only places these strings into its widgets."""

from __future__ import annotations

import html

from ..errors import NvkitError

MAX_SHOWN_CHARS = 20_000   # the output widget keeps the tail; the full text is in .text
LIST_SHOWN_ROWS = 500      # the results table shows this many prompts; .outputs holds them all
LIST_CELL_CHARS = 2_000    # characters of one output shown in its cell
LIST_CSS = """
.nvkit-panel-root .nvkit-results { border-collapse: collapse; width: 100%; table-layout: fixed; }
.nvkit-panel-root .nvkit-results th, .nvkit-panel-root .nvkit-results td { border-bottom: 1px solid var(--jp-border-color2);
  padding: 2px 6px; text-align: left; vertical-align: top; white-space: pre-wrap; overflow-wrap: break-word;
  color: var(--jp-content-font-color1); font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); }
.nvkit-panel-root .nvkit-results th:first-child, .nvkit-panel-root .nvkit-results td:first-child { width: 3em; }
"""
# base and tuned side by side, each wrapping by word; one above the other when the panel is narrow
COMPARE_CSS = """
.nvkit-panel-root .nvkit-compare { display: flex; flex-wrap: wrap; gap: 8px; }
.nvkit-panel-root .nvkit-compare-side { flex: 1 1 260px; min-width: 0; padding: 4px 8px; border-radius: 4px;
  border: 1px solid var(--jp-border-color2); white-space: pre-wrap; word-break: normal; overflow-wrap: break-word;
  color: var(--jp-content-font-color1); font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); }
.nvkit-panel-root .nvkit-compare-tuned { background: var(--jp-layout-color2); }
.nvkit-panel-root .nvkit-compare-prompt { color: var(--jp-ui-font-color2); margin-bottom: 4px; white-space: pre-wrap;
  overflow-wrap: break-word; }
"""


def pre_html(text: str) -> str:
    return f"<div class='nvkit-text'>{html.escape(text)}</div>"


def prompt_lines(text: str, name: str = "") -> tuple[list[str], int]:
    """The prompts of a list: one per non-empty line of ``text``, or, for a ``.jsonl`` file
    (``name``), one per line as a JSON string or an object with a "prompt" (or "text") field.
    Returns (prompts, how many had line breaks that were joined with spaces)."""
    import json
    prompts, joined = [], 0
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if name.lower().endswith(".jsonl"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise NvkitError(f"{name} line {i} is not JSON ({e.msg}): give one prompt per line.") from None
            item = item.get("prompt", item.get("text")) if isinstance(item, dict) else item
            if not isinstance(item, str):
                raise NvkitError(f"{name} line {i}: expected a string or an object with a \"prompt\" field.")
            if "\n" in item or "\r" in item:
                joined += 1
                item = " ".join(item.split())
            line = item
        if line.strip():
            prompts.append(line.rstrip())
    return prompts, joined


def results_html(prompts: list[str], outputs: list[str] | None, stopped: bool = False) -> str:
    """The list's prompts and answers as a table, escaped; at most ``LIST_SHOWN_ROWS`` rows."""
    rows = []
    for i, prompt in enumerate(prompts[:LIST_SHOWN_ROWS]):
        out = outputs[i] if outputs is not None else None
        if out is None:
            cell = "<span class='nvkit-muted'>…</span>"
        elif out == "" and stopped:
            cell = "<span class='nvkit-muted'>(stopped before it finished)</span>"
        else:
            cell = html.escape(out[:LIST_CELL_CHARS] + ("…" if len(out) > LIST_CELL_CHARS else ""))
        short = prompt if len(prompt) <= 300 else prompt[:300] + "…"
        rows.append(f"<tr><td>{i + 1}</td><td>{html.escape(short)}</td><td>{cell}</td></tr>")
    more = len(prompts) - LIST_SHOWN_ROWS
    tail = f"<div class='nvkit-muted'>{more} more prompts: all answers are in panel.outputs</div>" if more > 0 else ""
    return ("<table class='nvkit-results'><tr><th>#</th><th>prompt</th><th>answer</th></tr>"
            + "".join(rows) + "</table>" + tail)


def stats_text(st) -> str:
    """The stats line of one request: tokens, the rate over the whole request, the decode rate
    after the first token, time to first token, the path. Reads GenerationStats' fields, so it
    holds whether or not the stats carry ``decode_tokens_per_second`` (where they don't,
    ``tokens_per_second`` is the decode rate)."""
    overall = st.new_tokens / st.seconds if st.seconds and st.seconds > 0 else 0.0
    decode = getattr(st, "decode_tokens_per_second", None)
    if callable(decode):
        decode = decode()
    if decode is None:
        decode = st.tokens_per_second
    ttft = f"{st.time_to_first_token * 1000:.0f} ms" if st.time_to_first_token is not None else "n/a"
    return (f"{st.new_tokens} tokens in {st.seconds:.2f} s · {overall:.1f} tok/s overall · decode "
            f"{float(decode):.1f} tok/s · first token {ttft} · path {st.how}{' · stopped' if st.stopped else ''}")


def compare_html(cmp, prompt: str) -> str:
    """A ``Comparison`` of one prompt: base and tuned side by side, each with its tok/s, escaped."""
    r = cmp.rows[0]
    adapter = html.escape(str(cmp.adapter))

    def side(cls: str, title: str, text: str, rate: float) -> str:
        return (f"<div class='nvkit-compare-side nvkit-compare-{cls}'><span class='nvkit-role'>{title} · "
                f"{rate:.1f} tok/s</span>{html.escape(text)}</div>")

    same = " <i>(same answer)</i>" if r.same else ""
    return (f"<div class='nvkit-compare-prompt'>{html.escape(prompt[-MAX_SHOWN_CHARS:])}{same}</div>"
            f"<div class='nvkit-compare'>{side('base', 'base (adapter off)', r.base, r.base_tokens_per_s)}"
            f"{side('tuned', f'tuned (adapter {adapter})', r.tuned, r.tuned_tokens_per_s)}</div>")


def transcript_html(turns: list[dict], tail_chars: int = MAX_SHOWN_CHARS) -> str:
    """Chat turns as blocks, newest last, keeping at most ``tail_chars`` characters of text."""
    out, used = [], 0
    for m in reversed(turns):
        text = m["content"]
        if used + len(text) > tail_chars:
            text = "…" + text[-max(0, tail_chars - used):]
        used += len(text)
        role = m["role"] if m["role"] in ("user", "assistant", "system") else "user"
        out.append(f"<div class='nvkit-turn nvkit-turn-{role}'><span class='nvkit-role'>{role}</span>"
                   f"{html.escape(text)}</div>")
        if used >= tail_chars:
            break
    return "".join(reversed(out))
