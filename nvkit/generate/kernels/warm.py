"""A process's one-off Triton costs, paid while a model loads onto a GPU instead of inside the
session's first request.

Why: in a new process the first Triton kernel launched, even one Triton's on-disk cache holds,
first computes Triton's own cache key (``triton_key``: a hash of its compiler's sources and of
libtriton, hundreds of megabytes read and hashed, once per process), and the first use of nvkit's
kernel modules imports them (their custom ops registered with torch). A session's first request
would wait for both inside its warm-up. ``start`` runs them in a daemon thread while the weights
load: the reading and hashing release the GIL, so the load goes on beside it. A request that comes
sooner waits for the same work it would have done itself; nothing here changes what runs.
"""

from __future__ import annotations

import importlib
import threading

#: nvkit's kernel modules the batch-1 and the rows steps launch
MODULES = ("common", "gemv", "decode_attention", "add_rms_norm", "silu_mul", "lora_add", "paged_attention")

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
    try:
        key = _triton_key()
        if key is not None:
            key()  # lru_cached: every compile after this one reads it
        for name in MODULES:
            importlib.import_module(f"{__package__}.{name}")
    except Exception:  # noqa: BLE001 - a head start only: the first request does whatever is left
        pass


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
