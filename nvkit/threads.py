"""Long work in a worker thread, with three ways to wait for it.

- ``job.result()`` blocks, but joins in short slices so the notebook's Interrupt (a
  KeyboardInterrupt in the main thread) turns into a clean stop instead of an abandoned thread.
- ``await job`` waits on an asyncio future the worker completes as it ends, so the kernel keeps
  serving widget messages (a Stop click) while the cell awaits (a thread join would not let them
  through) and the answer arrives the moment it is ready (a polling loop would hold each short
  generation back by up to its period).
- ``job.done`` / callbacks for panels that fire and forget.

The waits (``result``, ``wait_done``, ``await``) return once the done callbacks have run too: a
script that waits on a panel's job then reads the panel finds it showing the result (``job.done``
is true a moment earlier, as soon as the result exists; ``job.settled`` once the callbacks ran).

Widget callbacks only set ``job.stop_event``; the worker checks it between steps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

_SLICE = 0.05  # seconds between checks for Interrupt while blocking


class Job:
    """A function running in a daemon thread, with a stop event it may watch."""

    def __init__(self, fn: Callable[["Job"], Any], name: str = "nvkit-worker", device: Any = None):
        self.stop_event = threading.Event()
        self._fn = fn
        self._done = threading.Event()     # the result (or error) exists
        self._settled = threading.Event()  # ... and the done callbacks have run
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Job"], None]] = []
        self._settled_waiters: list[Callable[[], None]] = []  # the awaits' wake-ups
        self._lock = threading.Lock()
        self._device = device
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Job":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if self._device is not None:
                # The CUDA current device is per thread: a worker starts on cuda:0 otherwise.
                import torch
                if torch.cuda.is_available():
                    torch.cuda.set_device(self._device)
            self._result = self._fn(self)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits for the result
            self._error = e
        finally:
            self._done.set()
            with self._lock:
                callbacks = list(self._callbacks)
            try:
                for cb in callbacks:
                    try:
                        cb(self)
                    except Exception:
                        pass
            finally:
                with self._lock:
                    self._settled.set()
                    waiters = list(self._settled_waiters)
                for wake in waiters:
                    wake()

    def _waited(self) -> threading.Event:
        """What a wait waits for: the callbacks too, except from a callback itself (the worker
        thread), which would wait for its own end."""
        return self._done if threading.current_thread() is self._thread else self._settled

    # --- state ---------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def settled(self) -> bool:
        """Done, and the done callbacks have run (a panel's buttons and status are final)."""
        return self._settled.is_set()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the end (no result, no error raised); True once done."""
        return self._waited().wait(timeout)

    def stop(self) -> None:
        """Ask the work to end at its next check; returns at once."""
        self.stop_event.set()

    def add_done_callback(self, cb: Callable[["Job"], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(cb)
                return
        cb(self)

    # --- waiting -------------------------------------------------------------------------------
    def result(self, timeout: float | None = None) -> Any:
        """Block until done. Interrupt (KeyboardInterrupt) stops the work cleanly, waits for the
        worker to reach its stop check, then re-raises so the cell still ends as interrupted."""
        try:
            waited = 0.0
            event = self._waited()
            while not event.wait(_SLICE):
                waited += _SLICE
                if timeout is not None and waited >= timeout:
                    raise TimeoutError(f"{self._thread.name} still running after {timeout} s")
        except KeyboardInterrupt:
            self.stop()
            self._done.wait(30)
            raise
        return self._value()

    def _value(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result

    async def wait(self) -> Any:
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake() -> None:  # in the worker thread, after the done callbacks
            try:
                loop.call_soon_threadsafe(lambda: woken.done() or woken.set_result(None))
            except RuntimeError:  # the loop closed meanwhile (a kernel shutting down): nobody waits
                pass

        with self._lock:
            waiting = not self._settled.is_set()
            if waiting:
                self._settled_waiters.append(wake)
        if waiting:
            await woken
        return self._value()

    def __await__(self):
        return self.wait().__await__()


def run_in_worker(fn: Callable[[Job], Any], name: str = "nvkit-worker", device: Any = None) -> Job:
    """Start ``fn(job)`` in a worker thread and return the Job."""
    return Job(fn, name=name, device=device).start()
