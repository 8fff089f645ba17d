"""The live view: a daemon thread sampling, per GPU, NVML used (whole device) and this process's
PyTorch allocator, plus the process RSS, into bounded float64 ring buffers. ``sampler()`` is the
shared one the charts, the report and the peak tracker read, so there is one sampling thread
however many charts are open.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from .. import events
from ..checks import number
from ..errors import NvkitError
from ..state import STATE
from .usage import Device, fast_rss, nvml_used, pick_devices, torch_stats, visible_gpus


MAX_RATE_HZ = 20.0


DEFAULT_RATE_HZ = 5.0


class RingBuffer:
    """A fixed-capacity float64 buffer: appends overwrite the oldest value once full, so a sampler
    left running for days holds the same memory as one started a minute ago."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or capacity < 1:
            raise NvkitError(f"RingBuffer capacity must be a whole number ≥ 1, not {capacity!r}.")
        self.capacity = capacity
        self._data = np.full(capacity, np.nan, dtype=np.float64)
        self._n = 0          # values ever appended
        self._lock = threading.Lock()

    def append(self, value: float) -> None:
        with self._lock:
            self._data[self._n % self.capacity] = value
            self._n += 1

    def __len__(self) -> int:
        return min(self._n, self.capacity)

    def values(self) -> np.ndarray:
        """A copy, oldest first (float64; what plotly sends as a binary buffer)."""
        with self._lock:
            n, cap = self._n, self.capacity
            if n <= cap:
                return self._data[:n].copy()
            i = n % cap
            return np.concatenate((self._data[i:], self._data[:i]))

    def clear(self) -> None:
        with self._lock:
            self._data[:] = np.nan
            self._n = 0


SERIES = ("nvml_used", "torch_allocated", "torch_reserved")


def check_rate(rate_hz) -> float:
    """``rate_hz`` as a float when it is a sampling rate nvkit runs (0 < rate ≤ MAX_RATE_HZ)."""
    return number("rate_hz", rate_hz, 0, MAX_RATE_HZ, lo_open=True)


def check_window(window_s) -> float:
    """``window_s`` as a float when it is a history length a sampler keeps (1 s to one day)."""
    return number("window_s", window_s, 1, 86400)


class Sampler:
    """Samples, ``rate_hz`` times a second in a daemon thread, per GPU: NVML used (whole device),
    torch allocated and reserved (this process); and the process RSS. Each series is a bounded
    ring buffer holding ``window_s`` seconds. Times are seconds since ``nvkit.events.T0``."""

    def __init__(self, devices=None, rate_hz: float = DEFAULT_RATE_HZ, window_s: float = 300.0):
        check_rate(rate_hz)
        check_window(window_s)
        chosen = pick_devices(visible_gpus(), devices)
        self.devices: list[Device] = chosen
        self.rate_hz = float(rate_hz)
        self.window_s = float(window_s)
        cap = int(self.window_s * MAX_RATE_HZ) + 1  # room for the highest rate a later set_rate may ask
        self.capacity = cap
        self.t = RingBuffer(cap)
        self.rss = RingBuffer(cap)
        self.buffers = {(name, d.cuda_index): RingBuffer(cap) for d in chosen for name in SERIES}
        self.version = 0                     # increases with each sample: charts skip redundant redraws
        self._peaks: dict = {}
        self._peak_since = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sample_seconds = RingBuffer(256)   # how long each sample took (the overhead benchmark reads it)

    # --- control ----------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "Sampler":
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="nvkit-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        self._thread = None

    def set_rate(self, rate_hz: float) -> None:
        self.rate_hz = check_rate(rate_hz)

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a failing read (driver hiccup) must not end the sampler
                pass
            next_t += 1.0 / self.rate_hz
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (suspended laptop, long GIL hold): don't burst to catch up
                next_t, delay = time.monotonic(), 0
            self._stop.wait(delay)

    # --- sampling ---------------------------------------------------------------------------------
    def sample(self) -> dict:
        """Take one sample now (the thread calls this; tests may too). Returns the values."""
        t0 = time.perf_counter()
        values = {}
        for d in self.devices:
            values[("nvml_used", d.cuda_index)] = nvml_used(d.index)
            a, r = torch_stats(d.cuda_index)
            values[("torch_allocated", d.cuda_index)] = a
            values[("torch_reserved", d.cuda_index)] = r
        rss = float(fast_rss())
        t = events.now()
        with self._lock:
            for key, v in values.items():
                self.buffers[key].append(v)
                if v == v and v > self._peaks.get(key, -1.0):
                    self._peaks[key] = v
            if rss > self._peaks.get(("rss", None), -1.0):
                self._peaks[("rss", None)] = rss
            self.rss.append(rss)
            self.t.append(t)
            self.version += 1
        self.sample_seconds.append(time.perf_counter() - t0)
        values[("rss", None)] = rss
        return values

    # --- reading ----------------------------------------------------------------------------------
    def series(self, name: str, cuda_index: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(t, values) float64 arrays of one series, oldest first; ``name`` in SERIES or "rss"."""
        with self._lock:
            t = self.t.values()
            if name == "rss":
                y = self.rss.values()
            else:
                key = (name, cuda_index)
                if key not in self.buffers:
                    raise NvkitError(f"This sampler has no {name!r} series for cuda:{cuda_index}; it samples "
                                     f"{sorted({k[1] for k in self.buffers}) or 'no GPU'} with {SERIES} and 'rss'.")
                y = self.buffers[key].values()
        n = min(len(t), len(y))
        return t[-n:], y[-n:]

    def __len__(self) -> int:
        return len(self.t)

    def peak(self, name: str, cuda_index: int | None = None) -> float | None:
        """The highest sample of a series since the last ``reset_peaks`` (None if never sampled)."""
        with self._lock:
            return self._peaks.get((name, None if name == "rss" else cuda_index))

    def reset_peaks(self) -> None:
        with self._lock:
            self._peaks.clear()
            self._peak_since = events.now()

    def overhead(self) -> dict:
        """Mean seconds per sample and the share of one core it takes at the current rate."""
        s = self.sample_seconds.values()
        mean = float(s.mean()) if len(s) else float("nan")
        return {"seconds_per_sample": mean, "rate_hz": self.rate_hz, "core_share": mean * self.rate_hz}

    def __repr__(self) -> str:
        devs = ", ".join(d.label for d in self.devices) or "CPU only (process RSS)"
        return (f"<nvkit.Sampler {devs} · {self.rate_hz:g} Hz · {len(self)} samples"
                f"{' · running' if self.running else ''}>")


def sampler(rate_hz: float | None = None, window_s: float | None = None, start: bool = True) -> Sampler:
    """The shared sampler (all GPUs this process sees), started on first use; ``rate_hz`` changes
    its rate, a ``window_s`` longer than it keeps replaces it with a longer one. Charts and
    ``memory_report`` read it, so there is one sampling thread however many charts."""
    if rate_hz is not None:
        check_rate(rate_hz)
    if window_s is not None:
        check_window(window_s)
    with STATE.lock:
        old = None
        cur = STATE.sampler
        if cur is not None and window_s is not None and window_s > cur.window_s:
            old, cur = cur, None
        if cur is None:
            cur = STATE.sampler = Sampler(rate_hz=rate_hz if rate_hz is not None else DEFAULT_RATE_HZ,
                                          window_s=window_s if window_s is not None else 300.0)
            events.subscribe(follow_selection)
        elif rate_hz is not None:
            cur.set_rate(rate_hz)
    if old is not None:
        old.stop()
    if start:
        cur.start()
    return cur


def follow_selection(ev) -> None:
    """On a "select" event (a GPU selection applied before CUDA started changes which GPUs cuda:i
    are): the shared sampler is rebuilt for them, with its rate and window, running if it ran."""
    if ev.kind != "select":
        return
    with STATE.lock:
        old, STATE.sampler = STATE.sampler, None
    if old is not None:
        was_running = old.running
        old.stop()
        sampler(rate_hz=old.rate_hz, window_s=old.window_s, start=was_running)


def shared() -> Sampler | None:
    """The shared sampler if one was made, without making one."""
    return STATE.sampler


def forget_shared() -> None:
    """Stop and drop the shared sampler (after a GPU selection change; the next ``sampler()`` call
    makes one for the GPUs in force then)."""
    with STATE.lock:
        old, STATE.sampler = STATE.sampler, None
    if old is not None:
        old.stop()
