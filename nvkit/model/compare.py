"""Base vs tuned, side by side: ``s.compare(prompts)``.

One loaded model answers each prompt twice: once with the adapter switched off (PEFT's
``disable_adapter``: the LoRA layers pass their input through the frozen base weights only, which
is exactly the base model) and once with it on, with the same seed and generation settings, through
the session's ordinary ``generate``. So the "base" column is what the base model says and the
"tuned" column what the session says now, by construction; nothing is loaded twice.

On a GPU both sides run on the fast path where it can run them: the graph of each side (adapter
off and on) is captured before either side is timed, so a short comparison does not pay a capture
inside one side's figure, nor fall back to plain ``generate`` for being short. The seconds that
took are the comparison's ``prepared``.
"""

from __future__ import annotations

import contextlib
import html
import time
from dataclasses import dataclass

from ..errors import NvkitError, require

_REFUSED = ("stream", "fast", "on_progress")


@dataclass
class Row:
    prompt: str
    base: str
    tuned: str
    base_tokens_per_s: float
    tuned_tokens_per_s: float

    @property
    def same(self) -> bool:
        return self.base == self.tuned


class Comparison:
    """The rows of a comparison (``Row``: prompt, base, tuned, tok/s per side), printable, shown as
    a side-by-side table in a notebook, ``.to_frame()`` for pandas."""

    def __init__(self, rows: list[Row], adapter: str, settings: dict, prepared: float = 0.0):
        self.rows = rows
        self.adapter = adapter
        self.settings = settings
        #: seconds spent capturing both sides' fast path before either was timed
        self.prepared = prepared

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, i) -> Row:
        return self.rows[i]

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame([{"prompt": r.prompt, "base": r.base, "tuned": r.tuned, "same": r.same,
                              "base_tok_s": r.base_tokens_per_s, "tuned_tok_s": r.tuned_tokens_per_s}
                             for r in self.rows])

    def __str__(self) -> str:
        out = [f"base vs tuned (adapter {self.adapter!r}; {self._how()})"]
        for r in self.rows:
            out.append(f"\n>>> {r.prompt}\n  base  ({r.base_tokens_per_s:.1f} tok/s): {r.base}\n"
                       f"  tuned ({r.tuned_tokens_per_s:.1f} tok/s): {r.tuned}" + ("   [same]" if r.same else ""))
        return "\n".join(out)

    def __repr__(self) -> str:
        changed = sum(not r.same for r in self.rows)
        return f"<nvkit Comparison: {len(self.rows)} prompt(s), {changed} answer(s) changed by adapter {self.adapter!r}>"

    def _how(self) -> str:
        how = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return how + (f"; fast path prepared first: {self.prepared:.1f} s" if self.prepared >= 0.05 else "")

    def _repr_html_(self) -> str:
        cell = "style='text-align:left;vertical-align:top;white-space:pre-wrap;padding:4px 8px'"
        head = (f"<tr><th {cell}>prompt</th><th {cell}>base</th><th {cell}>tuned ({html.escape(self.adapter)})</th>"
                f"<th {cell}>tok/s base · tuned</th></tr>")
        body = "".join(
            f"<tr><td {cell}>{html.escape(r.prompt)}</td><td {cell}>{html.escape(r.base)}</td>"
            f"<td {cell}>{html.escape(r.tuned)}{' <i>(same)</i>' if r.same else ''}</td>"
            f"<td {cell}>{r.base_tokens_per_s:.1f} · {r.tuned_tokens_per_s:.1f}</td></tr>" for r in self.rows)
        return (f"<table class='nvkit-compare'>{head}{body}</table>"
                f"<p style='font-size:90%'>{html.escape(self._how())}</p>")


def _prepare(session, prompts, kwargs: dict):
    session._require_loaded()
    single = isinstance(prompts, str)
    items = [prompts] if single else prompts
    require(isinstance(items, (list, tuple)) and len(items) > 0 and all(isinstance(p, str) for p in items),
            f"prompts must be a string or a non-empty list of strings, not {prompts!r:.80}.")
    bad = [k for k in _REFUSED if k in kwargs]
    require(not bad, f"compare does not take {', '.join(bad)}: it runs both sides the same way, without streaming.")
    model = session.model
    peft_config = getattr(model, "peft_config", None)
    if not peft_config or not callable(getattr(model, "disable_adapter", None)):
        raise NvkitError("compare needs an adapter on the model: fine-tune (nvkit.finetune) or s.load_adapter(dir) "
                         "first; the base side is the same model with the adapter switched off.")
    if session.training is not None and not session.training.done:
        raise NvkitError("A fine-tune is training this model: wait for it (await run) or run.stop() it first.")
    adapter = getattr(model, "active_adapter", None)
    adapter = adapter if isinstance(adapter, str) else ", ".join(map(str, adapter or [])) or "default"
    return list(items), model, adapter


def _off(model, base: bool):
    return model.disable_adapter() if base else contextlib.nullcontext()


def _prepare_fast(session, items: list[str], max_new_tokens: int, do_sample: bool, kwargs: dict) -> float:
    """On a GPU, capture the fast path's graph of each side before either is timed, with the
    prefill graphs of prompts this long (a side's first prompt would otherwise pay its prefill's
    first run inside its own timing); returns the seconds it took. A side the fast path cannot run is
    left to ``generate``'s own choice, with its reason in the stats as usual. Nothing is compiled
    for it: a comparison of a few short answers would wait tens of seconds for a compile that
    saves it milliseconds (the session compiles as it would for any request)."""
    if session.device.type != "cuda":
        return 0.0
    from ..generate.fast import decoders, support
    gen = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, **kwargs)
    longest = max(len(session.tokenizer(p)["input_ids"]) for p in items) + 64  # a chat template's tokens too
    t = time.perf_counter()
    for base in (True, False):
        with _off(session.model, base):
            if support.single_why(session, gen) is None:
                try:
                    decoders.prepare(session, max_new_tokens, longest, do_sample, prefill_up_to=longest, compile=False,
                                     **kwargs)
                except NvkitError:
                    pass  # generate chooses again for this side, and its stats line says why
    return time.perf_counter() - t


def compare(session, prompts, max_new_tokens: int = 50, do_sample: bool = False, seed: int = 0,
            **generation_kwargs) -> Comparison:
    """Generate each prompt with the adapter off (the base model) and on (the tuned model), same
    seed and settings, one loaded model; returns a ``Comparison``."""
    items, model, adapter = _prepare(session, prompts, generation_kwargs)
    prepared = _prepare_fast(session, items, max_new_tokens, do_sample, generation_kwargs)
    rows = []
    for p in items:
        out = {}
        for side in ("base", "tuned"):
            with _off(model, side == "base"):
                text = session.generate(p, max_new_tokens=max_new_tokens, do_sample=do_sample, seed=seed,
                                        **generation_kwargs)
            out[side] = (text, session.last_stats.tokens_per_second)
        rows.append(Row(p, out["base"][0], out["tuned"][0], out["base"][1], out["tuned"][1]))
    return Comparison(rows, adapter, dict(max_new_tokens=max_new_tokens, do_sample=do_sample, seed=seed,
                                          **generation_kwargs), prepared)


async def acompare(session, prompts, max_new_tokens: int = 50, do_sample: bool = False, seed: int = 0,
                   **generation_kwargs) -> Comparison:
    """``compare``, awaitable: the kernel keeps serving widgets (a Stop click) meanwhile."""
    items, model, adapter = _prepare(session, prompts, generation_kwargs)
    prepared = _prepare_fast(session, items, max_new_tokens, do_sample, generation_kwargs)
    rows = []
    for p in items:
        out = {}
        for side in ("base", "tuned"):
            with _off(model, side == "base"):
                text = await session.agenerate(p, max_new_tokens=max_new_tokens, do_sample=do_sample, seed=seed,
                                               **generation_kwargs)
            out[side] = (text, session.last_stats.tokens_per_second)
        rows.append(Row(p, out["base"][0], out["tuned"][0], out["base"][1], out["tuned"][1]))
    return Comparison(rows, adapter, dict(max_new_tokens=max_new_tokens, do_sample=do_sample, seed=seed,
                                          **generation_kwargs), prepared)
