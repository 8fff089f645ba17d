"""A process's one-off Triton costs, paid while a model loads onto a GPU instead of inside the
session's first request.

Why: in a new process the first Triton kernel launched, even one Triton's on-disk cache holds,
first computes Triton's own cache key (``triton_key``: a hash of its compiler's sources and of
libtriton, hundreds of megabytes read and hashed, once per process), and the first use of nvkit's
kernel modules imports them (their custom ops registered with torch). A session's first request
would wait for both inside its warm-up. ``start`` runs them in a daemon thread while the weights
load: the reading and hashing release the GIL, so the load goes on beside it. A request that comes
sooner waits for the same work it would have done itself; nothing here changes what runs. Each
part is tried on its own: a Triton release that lacks one (a key function moved, no Gluon) still
gets the others ahead of the request. ``seconds`` says what each part took in this process.
"""

from __future__ import annotations

import importlib
import threading
import time

#: nvkit's kernel modules the batch-1 and the rows steps launch
MODULES = ("common", "gemv", "decode_attention", "add_rms_norm", "silu_mul", "lora_add", "paged_attention",
           "prefill_rope")
#: Triton's own modules that its first launch in a process imports (where the release has them)
TRITON_MODULES = ("triton.experimental.gluon",)
#: seconds each part of the warm-up took in this process ("triton key", "import NAME"; the rows
#: prefill's compile ahead, ``fast.compile_ahead``, adds its own), for a profile
seconds: dict[str, float] = {}
#: what failed in a part, by its name (the part's work is then left to the request)
errors: dict[str, str] = {}
#: the threads that compile kernels ahead of a request (``fast.compile_ahead``), by what they compile
ahead: dict[str, threading.Thread] = {}

_lock = threading.Lock()
_thread: threading.Thread | None = None


def start() -> threading.Thread | None:
    """Start the warm-up thread once per process (None where it has started already, or where
    Triton is not installed). Triton itself is imported here, in the caller's thread, so no two
    threads import it at once."""
    global _thread
    with _lock:
        if _thread is not None:
            return None
        try:
            import triton  # noqa: F401
        except ImportError:
            return None
        _thread = threading.Thread(target=_warm, name="nvkit-triton-warm", daemon=True)
        _thread.start()
        return _thread


def _warm() -> None:
    key = _triton_key()
    parts = [("triton key", key)] if key is not None else []  # lru_cached: every compile after reads it
    parts += [(f"import {name}", lambda n=f"{__package__}.{name}": importlib.import_module(n)) for name in MODULES]
    parts += [(f"import {name}", lambda n=name: importlib.import_module(n)) for name in TRITON_MODULES]
    for what, part in parts:
        t = time.perf_counter()
        try:
            part()
        except Exception:  # noqa: BLE001 - a head start only: the first request does whatever is left
            continue
        seconds[what] = time.perf_counter() - t


def _triton_key():
    """Triton's per-process cache key function (its module moved between Triton releases)."""
    for where in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            key = getattr(importlib.import_module(where), "triton_key", None)
        except ImportError:
            continue
        if key is not None:
            return key
    return None


def words() -> str:
    """Where this process's warm-up stands, for a profile's log: not started, still running, or
    done, with what its parts took, and what is still being compiled ahead (``ahead``)."""
    busy = [what for what, t in list(ahead.items()) if t.is_alive()]
    if _thread is None and not seconds and not errors and not busy:
        return "the Triton warm-up has not started in this process"
    parts = ", ".join([f"{k} {v:.2f} s" for k, v in seconds.items()] + [f"{k} failed: {v}" for k, v in errors.items()])
    parts = parts or "nothing done"
    state = "not started" if _thread is None else "still running" if _thread.is_alive() else "done"
    compiling = f"; still compiling ahead: {', '.join(busy)}" if busy else ""
    return f"the Triton warm-up is {state}: {parts}{compiling}"
