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

A ``Worker`` runs jobs one after another on one long-lived thread: CUDA libraries keep some
caches per thread (cuDNN's attention plans, cuBLAS handles), so requests that each start a thread
of their own pay for setting them up on every request.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

from .errors import NvkitError

_SLICE = 0.05  # seconds between checks for Interrupt while blocking


class Worker:
    """One long-lived daemon thread that runs the jobs handed to it in order (see the module
    docstring). It starts with the first job and ends with ``close()``, after the jobs queued
    before it; a job a closed worker is given starts a new thread."""

    def __init__(self, name: str = "nvkit-worker"):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: "Job") -> threading.Thread:
        """Queue ``job``; returns the thread that will run it."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._queue = queue.SimpleQueue()  # a thread that died took nothing queued with it
                self._thread = threading.Thread(target=self._loop, args=(self._queue,), name=self.name, daemon=True)
                self._thread.start()
            self._queue.put(job)
            return self._thread

    def close(self) -> None:
        """End the thread once the jobs queued so far are done; returns at once."""
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread = None
                self._queue = queue.SimpleQueue()

    @staticmethod
    def _loop(q: queue.SimpleQueue) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                job._run()
            except BaseException:  # noqa: BLE001 - Job._run keeps its own errors; the next job still runs
                pass
            del job  # what the job holds (its session, its result) is not kept alive by the idle thread


class Job:
    """A function running in a daemon thread (its own, or a ``Worker``'s), with a stop event it
    may watch."""

    def __init__(self, fn: Callable[["Job"], Any], name: str = "nvkit-worker", device: Any = None,
                 worker: Worker | None = None):
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
        self._worker = worker
        self._thread = threading.Thread(target=self._run, name=name, daemon=True) if worker is None else None

    def start(self) -> "Job":
        if self._worker is not None:
            self._thread = self._worker.submit(self)
        else:
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
            self._settle()

    def _settle(self) -> None:
        """Done: the done callbacks, then every wait woken."""
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

    def _abandoned(self) -> bool:
        """True (once) when the thread that was to run this job has ended without running it: a
        hook that a debugger or profiler sets on new threads raised before the job began. The job
        is settled here with an NvkitError, so no wait hangs on it and its done callbacks put the
        caller's state back; a worker starts a new thread for the next job."""
        th = self._thread
        if th is None or th.is_alive() or th.ident is None:
            return False
        with self._lock:
            if self._done.is_set():
                return False
            self._error = NvkitError(f"The thread {th.name!r} ended before it ran this work (a hook on new threads, "
                                     "from a debugger or a profiler, may have failed in it). Run it again.")
            self._done.set()
        self._settle()
        return True

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
                if self._abandoned():
                    break
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
