"""Known third-party messages that a notebook user can neither act on nor needs, routed to nvkit's
debug log while nvkit calls the library that emits them.

Some libraries nvkit drives log a warning on their way in that lands in the notebook as a pink
stderr block and reads as a failure, though nothing failed. nvkit wraps the calls that set them
off in ``routed()``: inside it, a record that matches one of the ``KNOWN`` messages goes to the
``nvkit.quiet`` logger at DEBUG level instead of stderr. Nothing else changes: other messages of
the same loggers pass as before, the same message outside an nvkit call passes as before, and
nvkit's own output is never touched. To see what was routed::

    logging.basicConfig()
    logging.getLogger("nvkit.quiet").setLevel(logging.DEBUG)

Each entry below says why its message carries nothing to act on; add one only with that reason.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

# (logger name, start of the message)
KNOWN: tuple[tuple[str, str], ...] = (
    # bitsandbytes' CPU backend tries, when it is first imported on a CPU with AVX512-BF16, to fetch
    # an optimised 4-bit matmul from the Hugging Face Hub; offline (HF_HUB_OFFLINE, no cached copy)
    # the fetch fails, it warns with a `pip install kernels` hint that does not apply (kernels is
    # installed) and keeps its built-in CPU kernels, which work. Its first import happens inside
    # transformers or peft, e.g. when a 4-bit model loads or a fine-tune starts.
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),
    # The kernels library's note during that same fetch: offline it cannot check the publisher.
    ("kernels.hf_hub", "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'"),
    # DeepSpeed (nvkit's `deepspeed` extra, for nvkit.launch's ZeRO strategies), imported by
    # transformers' Trainer whenever it is installed, announces on a machine without CUDA that it
    # will use the CPU. A fine-tune in the kernel does not run DeepSpeed at all, and DeepSpeed's
    # logger prints to stdout, where it also breaks output meant to be read, such as JSON.
    ("DeepSpeed", "Setting accelerator to CPU"),
)

_log = logging.getLogger("nvkit.quiet")
_lock = threading.Lock()
_depth = 0            # how many routed() blocks are open, in any thread
_installed = False


class _Route(logging.Filter):
    """On one third-party logger: while a routed() block is open, a record that starts with one of
    ``prefixes`` goes to nvkit's debug log and not to that logger's handlers."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if not _depth:
            return True
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: let logging report it as usual
            return True
        if not message.startswith(self.prefixes):
            return True
        _log.debug("%s (%s): %s", record.name, record.levelname, message)
        return False


def _install() -> None:
    # A logger's filters run before its handlers and before the record propagates, and
    # getLogger returns the same object the library gets later, so this works whether or not
    # the library was imported yet. Outside routed() the filters pass everything.
    global _installed
    prefixes: dict[str, list[str]] = {}
    for name, start in KNOWN:
        prefixes.setdefault(name, []).append(start)
    for name, starts in prefixes.items():
        logging.getLogger(name).addFilter(_Route(tuple(starts)))
    _installed = True


@contextmanager
def routed():
    """Route the ``KNOWN`` third-party messages to nvkit's debug log for the duration of the block.

    Use it around the nvkit call that sets such a library off (an import, a load). The routing is
    process-wide while any block is open, because the library may log from a worker thread."""
    global _depth
    with _lock:
        if not _installed:
            _install()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
