"""A process-wide, bounded log of things that happened (load, unload, generate, training steps,
user marks), with timestamps, so the memory chart can draw them where they happened.

It lives in the core, not in the chart, because the session and the fine-tune loop record events
whether or not a chart is showing; a chart created later still draws what came before.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# Everything measures time from here, so the chart's x axis and the events agree.
T0 = time.monotonic()
_MAX_EVENTS = 2000


@dataclass(frozen=True)
class Event:
    t: float        # seconds since T0 (time.monotonic based)
    kind: str       # "load", "unload", "generate-start", "generate-end", "train-step", "checkpoint", "mark", "oom", ...
    text: str
    # What the event is about, for listeners that need more than the text (the memory tracker
    # takes the loaded session from a "load" event instead of importing the session module).
    subject: Any = field(default=None, repr=False, compare=False)


_lock = threading.Lock()
_events: collections.deque[Event] = collections.deque(maxlen=_MAX_EVENTS)
_listeners: list = []


def now() -> float:
    """Seconds since nvkit was imported (the chart's time axis)."""
    return time.monotonic() - T0


def record(kind: str, text: str = "", subject: Any = None) -> Event:
    """Record an event; safe from any thread. Listeners are called outside the lock."""
    ev = Event(now(), str(kind), str(text), subject)
    with _lock:
        _events.append(ev)
        listeners = list(_listeners)
    for fn in listeners:
        try:
            fn(ev)
        except Exception:  # a broken listener (e.g. a closed chart) must not break the work
            pass
    return ev


def events(since: float | None = None) -> list[Event]:
    """The recorded events, oldest first (only those at or after ``since`` when given)."""
    with _lock:
        evs = list(_events)
    return evs if since is None else [e for e in evs if e.t >= since]


def subscribe(fn) -> None:
    """Call ``fn(event)`` for every event recorded from now on (once, however often subscribed)."""
    with _lock:
        if fn not in _listeners:
            _listeners.append(fn)


def unsubscribe(fn) -> None:
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)


def mark(text: str) -> Event:
    """Put a user event on the memory chart: ``nvkit.mark("before LoRA")``."""
    if not isinstance(text, str) or not text.strip():
        from .errors import NvkitError
        raise NvkitError("nvkit.mark needs a non-empty text, e.g. nvkit.mark('before fine-tune').")
    return record("mark", text.strip())


def clear() -> None:
    with _lock:
        _events.clear()
