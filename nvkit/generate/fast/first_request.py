"""A short request before anything is captured: plain ``generate`` or capture the fast path first,
whichever is expected to answer sooner (one prompt and the batch-1 path; a list and the rows path).

Plain ``generate`` on a GPU is bound by the host: every new token issues a few dozen kernels per
decoder layer, so its cost per token grows with the layer count and hardly with the model's width.
The fast path's first request pays the capture of the uncompiled step first, then decodes many
times faster. For ``n`` new tokens:

    plain:  n × (plain seconds per token)
    fast:   capture seconds + n × (fast seconds per token)

and the smaller wins. Both sides are taken from this machine where they are known:

- the plain cost per token from the session's own plain requests on the GPU
  (``Decoders.plain_per_token``), else from a session's first plain request on this machine;
- the capture's seconds from a session's first capture on this machine (the batch-1 path's and
  the rows path's apart: ``what`` = "capture" or "rows").

A short list weighs the same two ways: padded ``generate`` (or continuous batching) pays about one
prompt's host time per step whatever its rows, so its cost is a step count times the plain cost per
token, against the rows path's first capture and its steps.

Both machine figures are kept in ``$NVKIT_CACHE/fast-decode/first-capture.json``, keyed by the
model's shape, dtype, GPU and versions (the compile artifacts' key), so a machine that has run nvkit
before knows its own costs. The capture kept is the smallest seen: a process's first capture also
pays one-off costs (Triton's kernels loaded or compiled, the CUDA libraries' set-up) that a later
session may not, and a record that only grew would keep a machine on plain ``generate`` for good.
A capture during which Triton compiled kernels (its on-disk cache gained entries: the machine's
first run of nvkit's kernels, or a cache that does not last) is kept apart, with the cache's size
after it: while the cache still holds at least that many entries, the kernels load instead of
compiling, so the prior stands in for it; a cache that shrank (emptied, or a fresh container) makes
the compiling capture's seconds the expected ones again.
A session's first plain request pays its own one-off costs too, so its cost per token is the one kept.
Only a capture of the uncompiled step is kept (``first_capture_seconds``): a session that asked for a
compiled step (``prepare(compile=...)``, a test's options) pays inductor's compile in its first
capture, which is not what the default first request weighs.

Before either is known, a prior stands in (``PLAIN_SECONDS_PER_LAYER`` and, for a session whose
plain path has not run yet, ``PLAIN_FIRST_CALL_SECONDS``; ``CAPTURE_SECONDS``). The
file is JSON numbers, read under :mod:`nvkit.cache`'s rule like every file nvkit reads back; a
missing, foreign or broken file means the prior.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from ... import cache
from . import artifacts

log = logging.getLogger(__name__)

#: plain generate's host time per new token and decoder layer before a plain request is measured:
#: a few dozen small kernels per layer, each issued by the host (a data-centre GPU's host is not fast)
PLAIN_SECONDS_PER_LAYER = 0.003
#: what a process's first plain request pays once on top (generate's lazy set-up, first launches)
PLAIN_FIRST_CALL_SECONDS = 0.5
#: a first capture (set-up, warm-up, capture of the uncompiled step) before one is on record here
CAPTURE_SECONDS = 1.5
#: the fast path's seconds per token counted against it: a slow case, so the rule leans to plain
FAST_SECONDS_PER_TOKEN = 0.004
#: entries kept in the file (the most recent models)
KEEP = 64


@dataclass(frozen=True)
class Expected:
    """Expected seconds of one request by each way, and where the figures came from."""
    plain: float
    fast: float
    capture: float
    plain_from: str    # where plain's seconds per token came from, for the reason's words
    capture_from: str  # where the capture's seconds came from

    @property
    def capture_pays(self) -> bool:
        return self.fast <= self.plain

    def words(self, new_tokens: int) -> str:
        return (f"plain generate answers {new_tokens} new tokens in about {self.plain:.2f} s ({self.plain_from}), "
                f"the fast path in about {self.fast:.2f} s with its capture first ({self.capture:.1f} s, {self.capture_from})")


def expected(new_tokens: int, plain_per_token: float, capture: float,
             fast_per_token: float = FAST_SECONDS_PER_TOKEN, *, plain_first: float = 0.0,
             plain_from: str = "estimated", capture_from: str = "estimated") -> Expected:
    """The two expected times for ``new_tokens`` new tokens (``plain_first``: plain's one-off
    set-up still to pay)."""
    n = max(1, int(new_tokens))
    return Expected(plain=plain_first + n * plain_per_token, fast=capture + n * fast_per_token, capture=capture,
                    plain_from=plain_from, capture_from=capture_from)


def _path():
    return artifacts.folder() / "first-capture.json"


def _key(model, device, what: str = "capture") -> str | None:
    try:
        return artifacts.key(model, {"first": what}, device)
    except Exception:  # noqa: BLE001 - a device torch cannot describe: no record, the prior stands in
        return None


def _read() -> dict:
    raw = cache.read_trusted_bytes(_path(), "the fast path's first-capture times")
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("%s is not JSON; the first-capture prior stands in", _path())
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e9}


def stored_capture(model, device, what: str = "capture") -> float | None:
    """The seconds a first capture of this model took on this machine (None: not on record);
    ``what``: "capture" (the batch-1 path) or "rows" (the rows path)."""
    return _stored(model, device, what)


def stored_plain(model, device) -> float | None:
    """Seconds per new token of a session's first plain request of this model on this machine."""
    return _stored(model, device, "plain")


def _stored(model, device, what: str, most: float = 3600) -> float | None:
    return _lookup(_records(), model, device, what, most)


def _records() -> dict:
    try:
        return _read()
    except OSError:
        return {}


def _lookup(data: dict, model, device, what: str, most: float = 3600) -> float | None:
    key = _key(model, device, what)
    v = data.get(key) if key is not None else None
    return v if v is not None and 0 < v < most else None


def triton_cache_folder() -> str:
    """The folder of Triton's on-disk kernel cache in this process (one entry per compiled kernel
    or built launcher)."""
    try:
        import triton.knobs
        return str(triton.knobs.cache.dir)
    except Exception:  # noqa: BLE001 - a Triton without knobs: its documented default
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def triton_cache_entries() -> int | None:
    """How many entries Triton's on-disk kernel cache holds now (None: it cannot be read): it only
    grows while it lasts, so more entries after a capture mean Triton compiled during it. A folder
    not there yet holds none: Triton makes it at its first compile, the fresh machine's first capture,
    which must count as compiling."""
    try:
        with os.scandir(triton_cache_folder()) as entries:
            return sum(1 for _ in entries)
    except FileNotFoundError:
        return 0
    except OSError:
        return None


#: the parts of a first capture of the uncompiled step (``cuda_graphs.PARTS``); any other part
#: (a compile, compile artifacts read or written, the compile policy's measurement) makes it another
#: preparation than the one a first request weighs
UNCOMPILED_PARTS = frozenset({"set-up", "warm-up", "capture", "prefill graphs"})


def first_capture_seconds(timings: dict) -> float | None:
    """The seconds of a first capture to keep (``remember_capture``) from a decoder's ``timings``;
    None when it was not the uncompiled step's capture alone (see ``UNCOMPILED_PARTS``)."""
    if not timings or any(part not in UNCOMPILED_PARTS for part, v in timings.items() if v > 0):
        return None
    return float(sum(timings.values()))


def remember_capture(model, device, seconds: float, what: str = "capture", *, entries_before: int | None = None,
                     entries_after: int | None = None) -> None:
    """Keep what this session's first capture took (``what``: as ``stored_capture``), if less than
    the record, for the next session's first request; ``entries_before``/``after``: Triton's cache
    entries around it (``triton_cache_entries``), a capture that compiled kept apart (see the module
    docstring). A cache folder that cannot be written only means the prior next time."""
    if entries_before is not None and entries_after is not None and entries_after > entries_before:
        _remember(model, device, [(what + "-compiling", seconds, True, 3600),
                                  (what + "-compiling-entries", float(entries_after), False, 1e9)])
    else:
        _remember(model, device, [(what, seconds, True, 3600)])


def remember_first_capture(model, device, timings: dict, what: str = "capture", *,
                           entries_before: int | None = None) -> None:
    """What a session's first request or list leaves for the next session's first one: its capture's
    seconds from the decoder's ``timings`` (``first_capture_seconds``; nothing where that capture
    was not the uncompiled step's alone), Triton's cache entries before it (``entries_before``)
    against those now (``remember_capture``)."""
    seconds = first_capture_seconds(timings)
    if seconds is not None:
        remember_capture(model, device, seconds, what, entries_before=entries_before,
                         entries_after=triton_cache_entries())


def remember_plain(model, device, seconds_per_token: float) -> None:
    """Keep what a session's first plain request cost per new token here."""
    _remember(model, device, [("plain", seconds_per_token, False, 3600)])


def _remember(model, device, entries: list[tuple[str, float, bool, float]]) -> None:
    """Write ``entries`` (what, value, keep the smaller of it and the record, the largest value
    that makes sense) into the file in one read and one write."""
    keyed = [(_key(model, device, what), float(value), smaller) for what, value, smaller, most in entries
             if 0 < value < most]
    keyed = [k for k in keyed if k[0] is not None]
    if not keyed:
        return
    try:
        data = _read()
        for key, value, smaller in keyed:
            old = data.pop(key, None)
            data[key] = round(min(value, old) if smaller and old is not None else value, 4)
        cache.own_dir(artifacts.folder().name)
        cache.write_atomic(_path(), json.dumps(dict(list(data.items())[-KEEP:]), indent=0))
    except OSError as e:
        log.warning("could not keep the first capture's time in %s: %s", _path(), e)


def estimate(model, device, plain_per_token: float | None, new_tokens: int,
             session_captures: list[float] | None = None, what: str = "capture") -> Expected:
    """The expected times of a request of ``new_tokens`` on ``model`` (the base model) on
    ``device`` now; ``plain_per_token``: the session's measured plain cost (None: not yet);
    ``session_captures``: seconds of the graphs the session's decoder has captured already, the
    cost of one more (another sampling mode, an adapter switched on or off) where there are some;
    ``what``: whose first capture (as ``stored_capture``)."""
    layers = int(getattr(model.config.get_text_config(), "num_hidden_layers", 0) or 24)
    measured = plain_per_token is not None
    stored_per_token = None if measured else stored_plain(model, device)
    if session_captures:
        capture, source = min(session_captures), "as this session's graphs took"
    else:
        capture, source = _capture_expected(model, device, what)
    if measured:
        per_token, first, plain_from = plain_per_token, 0.0, "measured in this session"
    elif stored_per_token is not None:  # a first request's figure: its one-off costs are in it
        per_token, first, plain_from = stored_per_token, 0.0, "as a first request took on this machine"
    else:
        per_token, first, plain_from = layers * PLAIN_SECONDS_PER_LAYER, PLAIN_FIRST_CALL_SECONDS, "estimated"
    return expected(new_tokens, per_token, capture, plain_first=first, plain_from=plain_from, capture_from=source)


def _capture_expected(model, device, what: str) -> tuple[float, str]:
    """A first capture's expected seconds here and where the figure comes from (see the module
    docstring): the quickest on record that compiled nothing, else one that compiled while
    Triton's cache has lost entries since, else the prior."""
    data = _records()  # one read of the file for the three figures
    stored = _lookup(data, model, device, what)
    if stored is not None:
        return stored, "as measured on this machine"
    compiling = _lookup(data, model, device, what + "-compiling")
    if compiling is not None:
        then, now = _lookup(data, model, device, what + "-compiling-entries", most=1e9), triton_cache_entries()
        if then is None or now is None or now < then:
            return compiling, "as measured on this machine, compiling Triton's kernels"
        return CAPTURE_SECONDS, (f"estimated: this machine's first capture took {compiling:.1f} s compiling "
                                 "Triton's kernels, which are on disk now")
    return CAPTURE_SECONDS, "estimated"
