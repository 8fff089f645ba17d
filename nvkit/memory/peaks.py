"""Predicted vs measured: each load, generation and fine-tune opens a peak window (its start
event) and closes it (its end event); the estimate in force (``expect()``, or the one nvkit makes
for each generation and run) is stored beside the measured peak (``comparisons()``).

The tracker listens to ``nvkit.events`` from the first time anything asks for it (loading a model
does), and takes the loaded session from the kernel state or the "load" event, never by importing
the session module (which sits above this one).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

from .. import events
from ..errors import require
from ..state import STATE
from ..units import fmt_bytes
from .usage import cuda_in_use, fast_rss, release, reset_rss_peak, rss_peak, torch_module


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


class Tracker:
    """Listens to the event log: a start event opens a peak window, its end event measures the
    peak and stores it beside the prediction in force. One per kernel (``tracker()``)."""

    def __init__(self) -> None:
        self.comparisons: collections.deque = collections.deque(maxlen=200)
        self.explicit = None        # set by expect()
        self.auto = None            # the one nvkit made for the running operation
        self.open: dict = {}        # what -> start time
        self.open_rss: dict = {}    # what -> process RSS when it started (CPU comparisons count the growth)
        self.open_hwm: dict = {}    # what -> True once the kernel's peak-RSS record restarted with it
        self.lock = threading.Lock()
        events.subscribe(self.on_event)

    def close(self) -> None:
        events.unsubscribe(self.on_event)

    def on_event(self, ev) -> None:
        if ev.kind in _START_KINDS:
            reset_peak()
            with self.lock:
                self.open[_START_KINDS[ev.kind]] = ev.t
                self.open_rss[_START_KINDS[ev.kind]] = fast_rss()
                self.open_hwm[_START_KINDS[ev.kind]] = False
            smp = STATE.sampler
            if smp is not None and smp.running:
                smp.sample()  # a point right at the start, however the rate falls
            return
        what = _END_KINDS.get(ev.kind)
        if what is None:
            return
        with self.lock:
            t0 = self.open.pop(what, ev.t)
            rss0 = self.open_rss.pop(what, None)
            hwm = self.open_hwm.pop(what, False)
        if what == "load":  # after a load the weights are the prediction: config-only, as before the load
            s = ev.subject if ev.subject is not None else loaded_session()
            if s is not None:
                expect_for(s, seq_len=1)
        record_peak(what, t_start=t0, rss_start=rss0, hwm=hwm)


def tracker() -> Tracker:
    """The kernel's tracker, listening from the first call on (``nvkit.load`` makes this call)."""
    with STATE.lock:
        if STATE.peaks is None:
            STATE.peaks = Tracker()
        return STATE.peaks


def expect(estimate, what: str | None = None):
    """Set the prediction the next load/generate/fine-tune is compared with (and that the chart
    draws as "predicted peak"); ``None`` clears it. Returns the estimate."""
    from .estimate import Estimate
    require(estimate is None or isinstance(estimate, Estimate),
            f"expect() takes an nvkit.Estimate (from nvkit.estimate(...)) or None, not {type(estimate).__name__}.")
    t = tracker()
    with t.lock:
        t.explicit = estimate
    return estimate


def expectation():
    """The prediction in force: the one set with ``expect``, else the one nvkit made itself for
    the running operation (from the prompt count and lengths, or the run's settings)."""
    t = tracker()
    with t.lock:
        return t.explicit or t.auto


def expect_for(session, **kw):
    """Make ``nvkit.estimate`` of the loaded ``session`` (its config, dtype, quantization and
    device, plus ``kw``) the automatic expectation, and return it (None when none could be made).
    Best effort: a prediction is a bonus and never breaks the load, generation or run it
    describes."""
    try:
        from .estimate import for_session
        est = for_session(session, **kw)
    except Exception:  # noqa: BLE001 - see above
        est = None
    t = tracker()
    with t.lock:
        t.auto = est
    return est


def expect_generation(session, texts, gen: dict) -> None:
    """Predict the peak of a generation about to run (called by the session, best effort)."""
    try:
        tok = session.tokenizer
        prompt = max((len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts), default=1)
    except Exception:  # noqa: BLE001 - see expect_for
        t = tracker()
        with t.lock:
            t.auto = None
        return
    new = int(gen.get("max_new_tokens", 50))
    expect_for(session, batch_size=len(texts), seq_len=prompt + new, prompt_len=max(prompt, 1))


def expect_finetune(session, batch_size: int, seq_len: int, lora_r: int, gradient_checkpointing: bool) -> None:
    """Predict the peak of the LoRA run ``nvkit.finetune`` is about to start (best effort)."""
    expect_for(session, mode="lora", batch_size=batch_size, seq_len=seq_len, lora_r=lora_r,
               gradient_checkpointing=gradient_checkpointing, path="nvkit")


def cpu_work_starts(what: str = "train") -> None:
    """The work of the open ``what`` window begins now, on the CPU: what the process took on
    before it (the training libraries' imports, the adapter and the trainer being built) is not
    the working memory an estimate describes, so the window's baseline moves here. Freed memory
    is given back first (the growth then starts from what is live), and the peak record restarts
    (the kernel's VmHWM where it can, the sampler's). Called by the worker running that work."""
    release()
    hwm = reset_rss_peak()
    smp = STATE.sampler
    if smp is not None:
        smp.reset_peaks()
    t = tracker()
    with t.lock:
        if what in t.open:
            t.open_rss[what] = fast_rss()
            t.open_hwm[what] = hwm


def reset_peak() -> None:
    """Start a new peak window: torch's peak stats on every device and the shared sampler's."""
    torch = torch_module()
    if cuda_in_use():
        for d in range(torch.cuda.device_count()):
            try:
                torch.cuda.reset_peak_memory_stats(d)
            except Exception:  # noqa: BLE001 - a device that went away has no peak to reset
                pass
    if STATE.sampler is not None:
        STATE.sampler.reset_peaks()


def loaded_session():
    """The current session when a model is loaded in it, else None."""
    s = STATE.session
    return s if s is not None and getattr(s, "model", None) is not None else None


def main_device() -> tuple[str, int | None]:
    """("cuda:i", i) of the loaded model's device, else of cuda:0 when CUDA is up, else ("cpu", None)."""
    s = loaded_session()
    if s is not None:
        d = s.device
        return (f"cuda:{d.index or 0}", d.index or 0) if d.type == "cuda" else ("cpu", None)
    return ("cuda:0", 0) if cuda_in_use() else ("cpu", None)


def cpu_measured(what: str, rss_start: int | None, hwm: bool = False) -> int:
    """The CPU counterpart of a GPU peak: how much the process RSS grew during the operation (the
    kernel's peak record when ``hwm`` says it restarted with the operation, the sampler's peak when
    it ran, else now), plus the weights already resident when the operation did not load them
    (after a fine-tune: with its adapter). The whole RSS would count Python, torch and every
    import (≈ 1 GB against a 7 MB demo model), which no estimate of the model describes."""
    now = fast_rss()
    if rss_start is None:
        return now
    peak = now
    if hwm:
        recorded = rss_peak()
        if recorded is not None:
            peak = max(peak, recorded)
    smp = STATE.sampler
    if smp is not None and smp.running:
        p = smp.peak("rss")
        if p is not None and p == p:
            peak = max(peak, int(p))
    grown = max(0, peak - int(rss_start))
    s = loaded_session() if what != "load" else None
    if s is not None:
        try:
            grown += int(s.model.get_memory_footprint())
        except Exception:  # noqa: BLE001 - a model without the method: the growth alone
            pass
    return grown


def record_peak(what: str, t_start: float | None = None, estimate=None, rss_start: int | None = None,
                hwm: bool = False) -> Comparison:
    """Measure the peak since the last ``reset_peak`` and store it beside ``estimate`` (default:
    the expectation in force). ``comparisons()`` lists them. On CPU the measurement is the RSS
    growth since ``rss_start`` plus the resident weights (``cpu_measured``)."""
    est = estimate if estimate is not None else expectation()
    label, ci = main_device()
    torch = torch_module()
    if ci is not None and cuda_in_use():
        alloc = int(torch.cuda.max_memory_allocated(ci))
        reserved = int(torch.cuda.max_memory_reserved(ci))
    else:
        alloc = reserved = cpu_measured(what, rss_start, hwm)
    nvml = None
    s = STATE.sampler
    if s is not None and ci is not None and ("nvml_used", ci) in s.buffers:
        s.sample()
        p = s.peak("nvml_used", ci)
        nvml = None if p is None or p != p else int(p)
    c = Comparison(what, t_start if t_start is not None else events.now(), events.now(), label,
                   None if est is None else int(est.total), alloc, reserved, nvml, est)
    t = tracker()
    with t.lock:
        t.comparisons.append(c)
    return c


def comparisons(frame: bool = True):
    """Predicted vs measured, one row per load / generate / fine-tune (newest last)."""
    t = tracker()
    with t.lock:
        rows = list(t.comparisons)
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
    t = tracker()
    with t.lock:
        return min(t.open.values()) if t.open else None


def last_comparison() -> Comparison | None:
    t = tracker()
    with t.lock:
        return t.comparisons[-1] if t.comparisons else None
