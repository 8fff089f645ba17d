"""GPU memory, measured: the driver's view (NVML, whole device) beside this process's PyTorch
allocator (allocated / reserved), live and after the fact.

- ``Sampler``: a daemon thread sampling both views per GPU (and process RSS) at 5-20 Hz into bounded
  float64 ring buffers; ``sampler()`` is the shared one the charts read.
- ``memory_report()``: a DataFrame per device, with the rest (NVML − reserved: CUDA context, cuBLAS,
  NCCL, other processes) and peaks since ``reset_peak()``.
- Predicted vs measured: events (load/generate/train start and end) open and close a peak window;
  the estimate in force (``expect()``, or the one nvkit makes for each generation) is stored beside
  the measured peak (``comparisons()``).
- ``verified_release``: what an unload gave back per view, and which live tensors hold the rest.
- ``oom_error``: the post-mortem of a CUDA out-of-memory.

Run ``python -m nvkit.memory --overhead`` on a GPU machine for the sampler's cost on decode speed.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import gc
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"


def rss_bytes() -> int:
    """Resident set size of this process (what the OS sees us holding)."""
    try:
        import psutil
        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:  # psutil missing: /proc is enough on Linux
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _torch():
    return sys.modules.get("torch")


def cuda_in_use() -> bool:
    """True once this process has a CUDA context (never creates one)."""
    torch = _torch()
    return bool(torch is not None and torch.cuda.is_initialized())


def _torch_sum(stat: str, devices) -> int:
    if not cuda_in_use():
        return 0
    torch = _torch()
    devs = range(torch.cuda.device_count()) if devices is None else devices
    return int(sum(getattr(torch.cuda, stat)(d) for d in devs))


def torch_allocated(devices=None) -> int:
    """Bytes held by live tensors in PyTorch's CUDA allocator, summed over ``devices`` (all)."""
    return _torch_sum("memory_allocated", devices)


def torch_reserved(devices=None) -> int:
    """Bytes PyTorch's CUDA allocator holds from the driver, summed over ``devices`` (all)."""
    return _torch_sum("memory_reserved", devices)


def release() -> None:
    """Give freed memory back: Python garbage, PyTorch's CUDA cache, glibc's free lists."""
    gc.collect()
    if cuda_in_use():
        _torch().cuda.empty_cache()
    if sys.platform.startswith("linux"):
        try:  # glibc keeps freed heap pages unless asked; RSS would then hide a real free
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass


def oom_error(e: BaseException, during: str, session=None):
    """An NvkitError for a CUDA out-of-memory during ``during`` (load, generate, fine-tune), after
    releasing what the failed step held, with what was asked vs free, the largest consumers and
    what to try next."""
    import traceback
    from .errors import NvkitError
    from . import events
    # The traceback's frames still reference the failed step's tensors (activations, the KV
    # cache): clear them first, or release() below would free nothing.
    traceback.clear_frames(e.__traceback__)
    release()
    msg = str(e)
    first = msg.splitlines()[0] if msg else "CUDA out of memory"
    asked = _parse_size(r"Tried to allocate ([\d.]+ [KMGT]i?B)", msg)
    free_then = _parse_size(r"of which ([\d.]+ [KMGT]i?B) is free", msg)
    lines = [f"Out of GPU memory during {during}: {first.rstrip('.')}."]
    if asked is not None:
        lines.append(f"Asked for {fmt_bytes(asked)} while {fmt_bytes(free_then) if free_then is not None else 'less'} "
                     "was free on that GPU.")
    torch = _torch()
    if cuda_in_use():
        try:
            f, t = torch.cuda.mem_get_info()
            lines.append(f"After releasing the failed step: {fmt_bytes(f)} free of {fmt_bytes(t)}; this process holds "
                         f"{fmt_bytes(torch_allocated())} in tensors, {fmt_bytes(torch_reserved())} reserved.")
        except Exception:
            pass
        try:
            held = live_tensors("cuda", limit=5)
            if held:
                lines.append("Largest live tensors: " + "; ".join(str(h) for h in held) + ".")
        except Exception:
            pass
        lines += _other_processes()
    events.record("oom", f"out of memory during {during}" + (f": asked {fmt_bytes(asked)}" if asked else ""))
    tips = {
        "load": "quantize (quantization='nf4' needs about a quarter of the bf16 weights), device_map='auto' to "
                "split over the selected GPUs, or pick a GPU with more free memory (nvkit.gpus())",
        "generate": "fewer prompts at once (smaller batch), a shorter prompt or max_new_tokens, or quantize the "
                    "model; nvkit.estimate(s, batch_size=..., seq_len=...) shows what fits",
        "fine-tune": "a smaller batch_size or shorter sequences, gradient_checkpointing=True, QLoRA (load with "
                     "quantization='nf4'), or another GPU; nvkit.estimate(s, mode='lora', ...) shows what fits",
    }.get(during, "reduce the batch or sequence length, or quantize")
    lines.append("The failed step's memory was released and the session is still usable.")
    lines.append(f"Next: {tips}.")
    return NvkitError(" ".join(lines))


def _parse_size(pattern: str, text: str) -> int | None:
    import re as _re
    m = _re.search(pattern, text)
    if not m:
        return None
    num, unit = m.group(1).split()
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}.get(unit, 1)
    return int(float(num) * scale)


def _other_processes() -> list[str]:
    """Other processes on this process's GPUs that NVML can name (often the real culprit)."""
    try:
        from .gpus import gpus as _list_gpus
        mine = os.getpid()
        idx = {d.index for d in visible_gpus()}
        others = [(g.index, p) for g in _list_gpus(processes=True) if g.index in idx
                  for p in g.processes if p.pid != mine and p.used_memory]
    except Exception:
        return []
    if not others:
        return []
    others.sort(key=lambda x: -x[1].used_memory)
    return ["Other processes on these GPUs: " + "; ".join(
        f"GPU {i}: pid {p.pid} {p.name or ''} {fmt_bytes(p.used_memory)}" for i, p in others[:5]) + "."]


# =================================================================================================
# The live view: a sampler thread with bounded ring buffers, the report, verified unload, and the
# record of predicted vs measured peaks.
# =================================================================================================


MAX_RATE_HZ = 20.0
DEFAULT_RATE_HZ = 5.0


class RingBuffer:
    """A fixed-capacity float64 buffer: appends overwrite the oldest value once full, so a sampler
    left running for days holds the same memory as one started a minute ago."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or capacity < 1:
            from .errors import NvkitError
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


@dataclass(frozen=True)
class Device:
    """One GPU the sampler watches: its cuda ordinal in this process and its nvidia-smi index."""
    cuda_index: int
    index: int            # nvidia-smi (NVML) index
    name: str
    memory_total: int

    @property
    def label(self) -> str:
        return f"cuda:{self.cuda_index}" + ("" if self.index == self.cuda_index else f" (GPU {self.index})")


def visible_gpus() -> list[Device]:
    """The GPUs this process's ``cuda:i`` map to, read without creating a CUDA context."""
    from .gpus import gpus as _list_gpus
    try:
        inventory = {g.index: g for g in _list_gpus(processes=False)}
    except Exception:
        return []
    if not inventory:
        return []
    mapping: list[int | None] = []
    try:
        from .selection import selection
        mapping = [d.index for d in selection().devices]
    except Exception:  # selection unavailable: CUDA sees every GPU in NVML order
        mapping = sorted(inventory)
    if not mapping and os.environ.get("CUDA_VISIBLE_DEVICES", None) is None:
        mapping = sorted(inventory)
    out = []
    for ci, phys in enumerate(mapping):
        g = inventory.get(phys) if phys is not None else None
        if g is not None:
            out.append(Device(ci, g.index, g.name, int(g.memory_total)))
    return out


def _nvml_used(index: int) -> float:
    from .gpus import memory_used
    try:
        return float(memory_used(index))
    except Exception:
        return float("nan")


def _torch_stats(cuda_index: int) -> tuple[float, float]:
    """(allocated, reserved) of one device without building torch's flattened stats dict (the
    sampler calls this up to 20 times a second while a decode loop wants the GIL)."""
    torch = _torch()
    if torch is None or not torch.cuda.is_initialized():
        return 0.0, 0.0
    try:
        st = torch._C._cuda_memoryStats(cuda_index)
        return float(st["allocated_bytes"]["all"]["current"]), float(st["reserved_bytes"]["all"]["current"])
    except Exception:
        try:
            return float(torch.cuda.memory_allocated(cuda_index)), float(torch.cuda.memory_reserved(cuda_index))
        except Exception:
            return float("nan"), float("nan")


SERIES = ("nvml_used", "torch_allocated", "torch_reserved")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _fast_rss() -> int:
    """RSS from /proc/self/statm (~20 µs; psutil builds a Process each time, ~1 ms)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return rss_bytes()


def pick_devices(every: list, devices, what: str = "sample") -> list:
    """The devices among ``every`` named by ``devices`` (cuda indices; None = all), or NvkitError."""
    from .errors import NvkitError, require
    if devices is None:
        return list(every)
    require(isinstance(devices, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in devices),
            f"devices must be a list of cuda indices such as [0, 1], or None for all, not {devices!r}.")
    by_ci = {d.cuda_index: d for d in every}
    missing = [d for d in devices if d not in by_ci]
    if missing:
        raise NvkitError(f"No cuda:{missing[0]} to {what}: this process sees "
                         f"{', '.join(d.label for d in every) or 'no GPU'}. Pick from those, or devices=None.")
    return [by_ci[d] for d in devices]


class Sampler:
    """Samples, ``rate_hz`` times a second in a daemon thread, per GPU: NVML used (whole device),
    torch allocated and reserved (this process); and the process RSS. Each series is a bounded
    ring buffer holding ``window_s`` seconds. Times are seconds since ``nvkit.events.T0``."""

    def __init__(self, devices=None, rate_hz: float = DEFAULT_RATE_HZ, window_s: float = 300.0):
        from .errors import NvkitError, require
        require(isinstance(rate_hz, (int, float)) and not isinstance(rate_hz, bool) and 0 < rate_hz <= MAX_RATE_HZ,
                f"rate_hz must be a number in (0, {MAX_RATE_HZ:g}], not {rate_hz!r}.")
        require(isinstance(window_s, (int, float)) and not isinstance(window_s, bool) and 1 <= window_s <= 86400,
                f"window_s must be between 1 and 86400 seconds, not {window_s!r}.")
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
        from .errors import require
        require(isinstance(rate_hz, (int, float)) and not isinstance(rate_hz, bool) and 0 < rate_hz <= MAX_RATE_HZ,
                f"rate_hz must be a number in (0, {MAX_RATE_HZ:g}], not {rate_hz!r}.")
        self.rate_hz = float(rate_hz)

    def _loop(self) -> None:
        from . import events
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
        from . import events
        t0 = time.perf_counter()
        values = {}
        for d in self.devices:
            values[("nvml_used", d.cuda_index)] = _nvml_used(d.index)
            a, r = _torch_stats(d.cuda_index)
            values[("torch_allocated", d.cuda_index)] = a
            values[("torch_reserved", d.cuda_index)] = r
        rss = float(_fast_rss())
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
                    from .errors import NvkitError
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
        from . import events
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


_default: Sampler | None = None
_default_lock = threading.Lock()


def sampler(rate_hz: float | None = None, window_s: float | None = None, start: bool = True) -> Sampler:
    """The shared sampler (all GPUs this process sees), started on first use; ``rate_hz`` changes
    its rate, a ``window_s`` longer than it keeps replaces it with a longer one. Charts and
    ``memory_report`` read it, so there is one sampling thread however many charts."""
    global _default
    with _default_lock:
        old = None
        if _default is not None and window_s is not None and window_s > _default.window_s:
            old, _default = _default, None
        if _default is None:
            _default = Sampler(rate_hz=rate_hz if rate_hz is not None else DEFAULT_RATE_HZ,
                               window_s=window_s if window_s is not None else 300.0)
        elif rate_hz is not None:
            _default.set_rate(rate_hz)
        s = _default
    if old is not None:
        old.stop()
    if start:
        s.start()
    return s


def _reset_default_sampler() -> None:
    """Forget the shared sampler (tests; after a GPU selection change)."""
    global _default
    with _default_lock:
        old, _default = _default, None
    if old is not None:
        old.stop()


# --- predicted vs measured ---------------------------------------------------------------------

@dataclass
class Comparison:
    """An estimate beside the peak it predicted, measured over one load / generate / fine-tune."""
    what: str                      # "load", "generate", "train"
    t_start: float
    t_end: float
    device: str                    # "cuda:0", "cpu"
    predicted: int | None          # Estimate.total (None: nothing was predicted)
    measured_torch_allocated: int  # torch peak allocated (CUDA); on CPU see _cpu_measured
    measured_torch_reserved: int
    measured_nvml: int | None      # NVML peak used on that GPU, from the sampler; None without one
    estimate: object = None

    @property
    def measured(self) -> int:
        """The number the prediction is compared with: NVML's peak (what the GPU really had to
        hold, context included) when sampled, else torch's reserved peak plus the estimate's
        context part."""
        if self.measured_nvml is not None:
            return int(self.measured_nvml)
        ctx = 0 if self.estimate is None else int(getattr(self.estimate, "parts", {}).get("CUDA context", 0))
        return int(self.measured_torch_reserved + ctx)

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured

    def __str__(self) -> str:
        err = "" if self.error is None else f" ({self.error:+.0%})"
        if self.device == "cpu":
            return (f"{self.what} on cpu: predicted {fmt_bytes(self.predicted)} · measured {fmt_bytes(self.measured)}{err} "
                    f"(process RSS growth{'' if self.what == 'load' else ' + resident weights'})")
        return (f"{self.what} on {self.device}: predicted {fmt_bytes(self.predicted)} · measured "
                f"{fmt_bytes(self.measured)}{err} · torch peak allocated {fmt_bytes(self.measured_torch_allocated)}, "
                f"reserved {fmt_bytes(self.measured_torch_reserved)}")


_START_KINDS = {"load-start": "load", "generate-start": "generate", "train-start": "train"}
_END_KINDS = {"load": "load", "generate-end": "generate", "train-end": "train"}
_comparisons: collections.deque = collections.deque(maxlen=200)
_expect: dict = {"explicit": None, "auto": None}
_open: dict = {}
_open_rss: dict = {}  # what -> process RSS when it started (CPU comparisons count the growth)
_track_lock = threading.Lock()


def expect(estimate, what: str | None = None):
    """Set the prediction the next load/generate/fine-tune is compared with (and that the chart
    draws as "predicted peak"); ``None`` clears it. Returns the estimate."""
    from .errors import require
    from .estimate import Estimate
    require(estimate is None or isinstance(estimate, Estimate),
            f"expect() takes an nvkit.Estimate (from nvkit.estimate(...)) or None, not {type(estimate).__name__}.")
    with _track_lock:
        _expect["explicit"] = estimate
    return estimate


def expectation():
    """The prediction in force: the one set with ``expect``, else the one nvkit made itself for
    the running generation (from the prompt count and lengths)."""
    with _track_lock:
        return _expect["explicit"] or _expect["auto"]


def _expect_for(session, **kw) -> None:
    """Make ``nvkit.estimate`` of the loaded ``session`` (its config, dtype, quantization and
    device, plus ``kw``) the automatic expectation. Best effort: a prediction is a bonus and
    never breaks the load, generation or run it describes."""
    try:
        from .estimate import for_session
        est = for_session(session, **kw)
    except Exception:
        est = None
    with _track_lock:
        _expect["auto"] = est


def expect_generation(session, texts, gen: dict) -> None:
    """Predict the peak of a generation about to run (called by the session, best effort)."""
    try:
        tok = session.tokenizer
        prompt = max((len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts), default=1)
    except Exception:
        with _track_lock:
            _expect["auto"] = None
        return
    new = int(gen.get("max_new_tokens", 50))
    _expect_for(session, batch_size=len(texts), seq_len=prompt + new, prompt_len=max(prompt, 1))


def expect_finetune(session, batch_size: int, seq_len: int, lora_r: int, gradient_checkpointing: bool) -> None:
    """Predict the peak of the LoRA run ``nvkit.finetune`` is about to start (best effort)."""
    _expect_for(session, mode="lora", batch_size=batch_size, seq_len=seq_len, lora_r=lora_r,
                gradient_checkpointing=gradient_checkpointing, path="nvkit")


def reset_peak() -> None:
    """Start a new peak window: torch's peak stats on every device and the shared sampler's."""
    torch = _torch()
    if cuda_in_use():
        for d in range(torch.cuda.device_count()):
            try:
                torch.cuda.reset_peak_memory_stats(d)
            except Exception:
                pass
    if _default is not None:
        _default.reset_peaks()


def _main_device() -> tuple[str, int | None]:
    s = _loaded_session()
    if s is not None:
        d = s.device
        return (f"cuda:{d.index or 0}", d.index or 0) if d.type == "cuda" else ("cpu", None)
    return ("cuda:0", 0) if cuda_in_use() else ("cpu", None)


def _on_event(ev) -> None:
    if ev.kind in _START_KINDS:
        reset_peak()
        with _track_lock:
            _open[_START_KINDS[ev.kind]] = ev.t
            _open_rss[_START_KINDS[ev.kind]] = _fast_rss()
        if _default is not None and _default.running:
            _default.sample()  # a point right at the start, however the rate falls
        return
    what = _END_KINDS.get(ev.kind)
    if what is None:
        return
    with _track_lock:
        t0 = _open.pop(what, ev.t)
        rss0 = _open_rss.pop(what, None)
    if what == "load":  # after a load the weights are the prediction: config-only, as before the load
        s = _loaded_session()
        if s is not None:
            _expect_for(s, seq_len=1)
    record_peak(what, t_start=t0, rss_start=rss0)


def _cpu_measured(what: str, rss_start: int | None) -> int:
    """The CPU counterpart of a GPU peak: how much the process RSS grew during the operation (the
    sampler's peak when it ran, else now), plus the weights already resident when the operation
    did not load them. The whole RSS would count Python, torch and every import (≈ 1 GB against a
    7 MB demo model), which no estimate of the model describes."""
    now = _fast_rss()
    if rss_start is None:
        return now
    peak = now
    if _default is not None and _default.running:
        p = _default.peak("rss")
        if p is not None and p == p:
            peak = max(peak, int(p))
    grown = max(0, peak - int(rss_start))
    s = _loaded_session() if what != "load" else None
    if s is not None:
        try:
            grown += int(s.model.get_memory_footprint())
        except Exception:  # a model without the method: the growth alone
            pass
    return grown


def _loaded_session():
    """The current session when a model is loaded in it, else None."""
    try:
        from .session import session as _cur
        s = _cur(required=False)
    except Exception:
        return None
    return s if s is not None and s.model is not None else None


def record_peak(what: str, t_start: float | None = None, estimate=None, rss_start: int | None = None) -> Comparison:
    """Measure the peak since the last ``reset_peak`` and store it beside ``estimate`` (default:
    the expectation in force). ``comparisons()`` lists them. On CPU the measurement is the RSS
    growth since ``rss_start`` plus the resident weights (``_cpu_measured``)."""
    from . import events
    est = estimate if estimate is not None else expectation()
    label, ci = _main_device()
    torch = _torch()
    if ci is not None and cuda_in_use():
        alloc = int(torch.cuda.max_memory_allocated(ci))
        reserved = int(torch.cuda.max_memory_reserved(ci))
    else:
        alloc = reserved = _cpu_measured(what, rss_start)
    nvml = None
    s = _default
    if s is not None and ci is not None and ("nvml_used", ci) in s.buffers:
        s.sample()
        p = s.peak("nvml_used", ci)
        nvml = None if p is None or p != p else int(p)
    c = Comparison(what, t_start if t_start is not None else events.now(), events.now(), label,
                   None if est is None else int(est.total), alloc, reserved, nvml, est)
    with _track_lock:
        _comparisons.append(c)
    return c


def comparisons(frame: bool = True):
    """Predicted vs measured, one row per load / generate / fine-tune (newest last)."""
    with _track_lock:
        rows = list(_comparisons)
    if not frame:
        return rows
    import pandas as pd
    return pd.DataFrame([{"what": c.what, "device": c.device, "t_start": round(c.t_start, 2),
                          "t_end": round(c.t_end, 2), "predicted": c.predicted, "measured": c.measured,
                          "error": None if c.error is None else round(c.error, 3),
                          "torch_peak_allocated": c.measured_torch_allocated,
                          "torch_peak_reserved": c.measured_torch_reserved, "nvml_peak": c.measured_nvml}
                         for c in rows],
                        columns=["what", "device", "t_start", "t_end", "predicted", "measured", "error",
                                 "torch_peak_allocated", "torch_peak_reserved", "nvml_peak"])


def open_since() -> float | None:
    """When the load / generate / fine-tune running now started (None when none is running)."""
    with _track_lock:
        return min(_open.values()) if _open else None


def last_comparison() -> Comparison | None:
    with _track_lock:
        return _comparisons[-1] if _comparisons else None


from . import events as _events  # noqa: E402 - the tracker listens from import on
_events.subscribe(_on_event)


# --- the report --------------------------------------------------------------------------------

REPORT_COLUMNS = ["source", "used", "torch_allocated", "torch_reserved", "rest", "peak_used",
                  "peak_torch_allocated", "peak_torch_reserved", "total", "predicted_peak"]
_UNITS = {"bytes": 1, "MiB": 2**20, "GiB": 2**30}


def memory_report(devices=None, unit: str = "bytes"):
    """A DataFrame, one row per GPU this process sees (or one "cpu" row for the process without
    GPUs): NVML used (whole device), torch allocated / reserved (this process), the rest
    (NVML − reserved: CUDA context, cuBLAS workspaces, NCCL, other processes), peaks since the last
    ``reset_peak`` and the prediction in force. ``unit``: "bytes", "MiB" or "GiB"."""
    import pandas as pd
    from .errors import require
    require(unit in _UNITS, f"unit must be one of {', '.join(_UNITS)}, not {unit!r}.")
    s = sampler(start=False) if _default is None else _default
    devs = s.devices
    if devices is not None:
        require(isinstance(devices, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in devices),
                f"devices must be a list of cuda indices such as [0], or None, not {devices!r}.")
        known = {d.cuda_index for d in devs}
        bad = [d for d in devices if d not in known]
        require(not bad, f"No cuda:{bad[0] if bad else ''} here; this process sees {sorted(known) or 'no GPU'}.")
        devs = [d for d in devs if d.cuda_index in devices]
    est = expectation()
    main_label, main_ci = _main_device()
    torch = _torch()
    rows, index = [], []
    for d in devs:
        used = _nvml_used(d.index)
        a, r = _torch_stats(d.cuda_index)
        pa = pr = 0.0
        if cuda_in_use():
            try:
                pa = float(torch.cuda.max_memory_allocated(d.cuda_index))
                pr = float(torch.cuda.max_memory_reserved(d.cuda_index))
            except Exception:
                pass
        pu = s.peak("nvml_used", d.cuda_index) if s.running else None
        pu = max(used, pu) if pu is not None and used == used else used
        pred = float(est.total) if est is not None and d.cuda_index == main_ci else float("nan")
        rows.append(["NVML", used, a, r, used - r, pu, max(pa, a), max(pr, r), float(d.memory_total), pred])
        index.append(d.label)
    if not devs:
        rss = float(rss_bytes())
        pk = s.peak("rss") if s.running else None
        pred = float(est.total) if est is not None and main_ci is None else float("nan")
        rows.append(["RSS", rss, 0.0, 0.0, rss, max(rss, pk or 0.0), 0.0, 0.0, _ram_total(), pred])
        index.append("cpu")
    df = pd.DataFrame(rows, columns=REPORT_COLUMNS, index=pd.Index(index, name="device"))
    num = REPORT_COLUMNS[1:]
    df[num] = df[num].astype("float64") / _UNITS[unit]
    if unit == "bytes":
        df[num] = df[num].round(0)
    df.attrs["unit"] = unit
    return df


def _ram_total() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return float("nan")


def format_report(df=None) -> str:
    """The report as aligned text with human sizes (``%nvkit memory`` prints this)."""
    df = memory_report() if df is None else df
    scale = _UNITS.get(df.attrs.get("unit", "bytes"), 1)
    cols = ["used", "torch_allocated", "torch_reserved", "rest", "peak_used", "total", "predicted_peak"]
    head = ["device", "source", "used", "torch alloc", "torch reserved", "rest", "peak used", "total", "predicted"]
    lines = [head]
    for label, row in df.iterrows():
        lines.append([str(label), row["source"]] + ["-" if row[c] != row[c] else fmt_bytes(row[c] * scale) for c in cols])
    w = [max(len(r[i]) for r in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)) for r in lines]
    out.append("rest = used − torch reserved: CUDA context, cuBLAS workspaces, NCCL buffers, other processes.")
    c = last_comparison()
    if c is not None:
        out.append(f"last: {c}")
    return "\n".join(out)


# --- verified unload -----------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldTensor:
    nbytes: int
    shape: tuple
    dtype: str
    device: str
    owners: tuple[str, ...]    # where it is referenced from, when that could be found

    def __str__(self) -> str:
        who = ", ".join(self.owners) if self.owners else "owner not found (a closure, a cache, a traceback?)"
        return f"{fmt_bytes(self.nbytes)} {self.dtype}{list(self.shape)} on {self.device}: {who}"


def live_tensors(device_type: str = "cuda", limit: int = 10, namespace: dict | None = None) -> list[HeldTensor]:
    """The largest live tensors on ``device_type`` found through the garbage collector, one per
    storage, with names that hold them in ``namespace`` (default: the notebook's user namespace)
    where one can be found."""
    torch = _torch()
    if torch is None:
        return []
    storages: dict[int, tuple[int, object]] = {}
    with warnings.catch_warnings():
        # isinstance() on every gc object also touches deprecated lazy attributes (a FutureWarning
        # from torch.distributed.reduce_op was seen on the H200): this scan is not the user's code
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor) or obj.device.type != device_type:
                    continue
                key, n = _storage(obj)
            except Exception:
                continue
            if n and (key not in storages or obj.numel() > storages[key][1].numel()):
                storages[key] = (n, obj)
    top = sorted(storages.items(), key=lambda kv: -kv[1][0])[:limit]
    names = _owner_names({k for k, _ in top}, namespace)
    out = [HeldTensor(n, tuple(t.shape), str(t.dtype).replace("torch.", ""), str(t.device), tuple(names.get(k, ())))
           for k, (n, t) in top]
    del top, storages
    return out


@functools.cache
def _fake_tensor_type() -> tuple:
    """torch.compile's FakeTensor class, as an isinstance() target (looked up once: the live-tensor
    scan asks for every tensor the garbage collector holds)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except Exception:  # noqa: BLE001 - a torch without them has none
        return ()
    return (FakeTensor,)


def _is_tracing_tensor(t) -> bool:
    """A meta tensor or one of torch.compile's FakeTensors: shapes only, no memory of their own
    (and data_ptr() on a FakeTensor warns)."""
    return t.is_meta or isinstance(t, _fake_tensor_type())


def _storage(t) -> tuple[int, int]:
    """(storage address, bytes) of a tensor's memory; (0, 0) for tensors that hold none."""
    if _is_tracing_tensor(t):
        return 0, 0
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _owner_names(keys: set, namespace: dict | None) -> dict[int, list[str]]:
    """storage ptr -> names in the user namespace that reach it (a tensor, a module's parameter or
    buffer, a model output, a list/dict of tensors, IPython's Out history)."""
    torch = _torch()
    if namespace is None:
        try:
            from IPython import get_ipython
            ip = get_ipython()
            namespace = ip.user_ns if ip is not None else {}
        except Exception:
            namespace = {}
    found: dict[int, list[str]] = collections.defaultdict(list)

    def visit(name, v, depth):
        if isinstance(v, torch.Tensor):
            try:
                k = _storage(v)[0]
            except Exception:
                return
            if k in keys and name not in found[k]:
                found[k].append(name)
        elif depth > 2:
            return
        elif isinstance(v, torch.nn.Module):
            for pn, p in list(v.named_parameters()) + list(v.named_buffers()):
                visit(f"{name}.{pn}", p, 3)
        elif isinstance(v, dict) and depth < 2:
            for kk, vv in list(v.items())[:200]:
                visit(f"{name}[{kk!r}]", vv, depth + 1)
        elif isinstance(v, (list, tuple)) and depth < 2:
            for i, vv in enumerate(list(v)[:200]):
                visit(f"{name}[{i}]", vv, depth + 1)
        elif hasattr(v, "model") and isinstance(getattr(v, "model", None), torch.nn.Module):
            visit(f"{name}.model", v.model, depth + 1)  # a Session, a Trainer, a pipeline
    for name, v in list(namespace.items()):
        if name.startswith("__") or name in ("In", "exit", "quit", "get_ipython"):
            continue
        if name == "Out" or (name.startswith("_") and name.strip("_").isdigit()) or name in ("_", "__", "___"):
            visit(f"{name} (IPython output history)", v, 1 if name == "Out" else 0)
            continue
        visit(name, v, 0)
    # The loaded session holds its weights whether or not a notebook name points at it.
    current = sys.modules.get("nvkit.session")
    cur = current.session(required=False) if current is not None else None
    if cur is not None and cur.model is not None:
        visit("nvkit.session().model", cur.model, 0)
    return found


@dataclass
class UsageSnapshot:
    t: float
    nvml: dict            # cuda index -> NVML used
    allocated: dict       # cuda index -> torch allocated
    reserved: dict
    rss: int


def usage_snapshot() -> UsageSnapshot:
    from . import events
    devs = visible_gpus()
    nv, al, re_ = {}, {}, {}
    for d in devs:
        nv[d.cuda_index] = _nvml_used(d.index)
        a, r = _torch_stats(d.cuda_index)
        al[d.cuda_index], re_[d.cuda_index] = a, r
    return UsageSnapshot(events.now(), nv, al, re_, rss_bytes())


@dataclass
class UnloadReport:
    """What an unload gave back, seen by NVML, torch and the OS, and what still holds memory."""
    model_id: str
    device: str
    before: UsageSnapshot
    after: UsageSnapshot
    held: list = field(default_factory=list)   # HeldTensor, when memory stayed held

    @property
    def torch_freed(self) -> int:
        return int(sum(self.before.allocated.values()) - sum(self.after.allocated.values()))

    @property
    def reserved_freed(self) -> int:
        return int(sum(self.before.reserved.values()) - sum(self.after.reserved.values()))

    @property
    def nvml_freed(self) -> dict:
        return {i: self.before.nvml[i] - self.after.nvml.get(i, float("nan")) for i in self.before.nvml}

    @property
    def rss_freed(self) -> int:
        return int(self.before.rss - self.after.rss)

    @property
    def still_allocated(self) -> int:
        return int(sum(self.after.allocated.values()))

    @property
    def freed(self) -> int:
        """The headline number: torch's drop on CUDA, the RSS drop on CPU."""
        return max(0, self.torch_freed if self.device.startswith("cuda") else self.rss_freed)

    def __str__(self) -> str:
        lines = [f"Unloaded {self.model_id} ({self.device}):"]
        if self.device.startswith("cuda"):
            lines.append(f"  torch allocated: −{fmt_bytes(self.torch_freed)} (still {fmt_bytes(self.still_allocated)}), "
                         f"reserved: −{fmt_bytes(self.reserved_freed)}")
            for i, v in self.nvml_freed.items():
                lines.append(f"  NVML used cuda:{i}: −{fmt_bytes(v)} (now {fmt_bytes(self.after.nvml.get(i))})")
        lines.append(f"  process RSS: −{fmt_bytes(self.rss_freed)} (now {fmt_bytes(self.after.rss)})")
        if self.held:
            lines.append("  still held by live tensors:")
            lines += [f"    {h}" for h in self.held]
            lines.append("  Delete those names (del x) or clear the output history (%reset -f out), then "
                         "nvkit.memory.release().")
        return "\n".join(lines)


# Memory left allocated after an unload above this is worth explaining (small leftovers are
# cuBLAS/cuDNN handles' workspaces and RNG state).
HELD_THRESHOLD = 64 * 2**20


def verified_release(model_id: str, device: str, before: UsageSnapshot) -> UnloadReport:
    """Release, measure again, and when CUDA memory stays allocated find what holds it."""
    release()
    after = usage_snapshot()
    rep = UnloadReport(model_id, device, before, after)
    if device.startswith("cuda") and rep.still_allocated > HELD_THRESHOLD:
        rep.held = live_tensors("cuda")
    return rep


# --- the sampler's cost ----------------------------------------------------------------------------

def overhead_benchmark(model: str = "qwen3-0.6b", new_tokens: int = 256, rounds: int = 5,
                       rate_hz: float = DEFAULT_RATE_HZ) -> dict:
    """Decode tokens/s of ``model`` (a shape name or anything ``nvkit.load`` takes) with and
    without the sampler running at ``rate_hz``, alternating rounds so drift hits both alike.

    Decoding goes through the path users get by default (the fast path on CUDA, which honours
    ``min_new_tokens`` as plain ``generate`` does), so every round decodes exactly ``new_tokens``
    (``tokens``: the fewest any round produced). The rates are decode rates (the tokens after the
    first, over the time after it). ``noise`` is the spread of the rounds without the sampler
    ((max - min) / median): a ``difference`` inside it is not one the sampler caused."""
    from .errors import require
    from .session import load
    from .demo import SHAPES, shaped
    require(isinstance(new_tokens, int) and not isinstance(new_tokens, bool) and new_tokens >= 2,
            f"new_tokens must be a whole number ≥ 2 (a decode rate needs a token after the first), not {new_tokens!r}.")
    s = load(shaped(model) if model.lower() in SHAPES else model)
    prompt = "NVIDIA GPUs are " * 16
    exact = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    s.generate(prompt, **exact)  # warm-up: capture, kernels, allocator
    smp = Sampler(rate_hz=rate_hz)
    off, on, produced = [], [], []
    path = how = None
    for _ in range(rounds):
        for with_sampler in (False, True):
            if with_sampler:
                smp.start()
            s.generate(prompt, **exact)
            if with_sampler:
                smp.stop()
            st = s.last_stats
            (on if with_sampler else off).append(st.decode_tokens_per_second or float("nan"))
            produced.append(st.new_tokens)
            path, how = st.path, st.how
    s.unload()
    a, b = float(np.median(off)), float(np.median(on))
    return {"model": model, "rate_hz": rate_hz, "path": path, "how": how, "tokens": min(produced), "tok_s_without": a, "tok_s_with": b,
            "difference": (a - b) / a if a else float("nan"),
            "noise": (max(off) - min(off)) / a if a else float("nan"), **smp.overhead()}


def _main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m nvkit.memory", description=__doc__.splitlines()[0])
    p.add_argument("--overhead", action="store_true", help="decode tok/s with and without the sampler")
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE_HZ)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    if not a.overhead:
        print(format_report())
        return 0
    r = overhead_benchmark(a.model, a.tokens, a.rounds, a.rate)
    print(f"{r['model']}: {r['tok_s_without']:.1f} tok/s decode without the sampler, {r['tok_s_with']:.1f} with it at "
          f"{r['rate_hz']:g} Hz, {r['tokens']} tokens per round, on {r['how']}: {r['difference']:+.2%} (rounds spread {r['noise']:.2%}; "
          f"{r['seconds_per_sample'] * 1e6:.0f} µs per sample, {r['core_share']:.3%} of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
