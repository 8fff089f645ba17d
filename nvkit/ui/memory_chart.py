"""``nvkit.monitor()`` → ``MemoryChart``: memory over time, or over the steps of a fine-tune, live.

One chart serves ``nvkit.monitor()``, the panel's Memory tab and the Fine-tune tab
(``MemoryChart(x="step")`` + ``.follow(run)``), all reading the shared sampler
(``nvkit.memory.sampler()``), so there is one sampling thread however many charts.

What it draws, per GPU this kernel sees (after a selection): NVML used (whole device) and, once
this process uses CUDA, PyTorch's reserved and allocated; the device total as a line when it is
near the data (the y axis is scaled to the data, not to 141 GB). The process's memory (RSS) is
drawn whenever this process does not use CUDA (a CPU-only kernel, a CPU torch); otherwise it is
one click away in the legend. The predicted peak of the estimate in force is drawn beside the
GPU's memory (on the CPU the status line compares it with the process's memory growth, since
the whole RSS holds Python and every import), and events (load, generate, training steps, marks) are markers with their text on
hover. The legend is compact: one entry per device (it toggles that device's three lines) and
one per line style.

Redraws go through ``LiveChart`` (nvkit/ui/live.py): at most once a second, only when there are
new points and a view can see the chart, as plain lists of at most ``MAX_POINTS`` points per line
(older samples are folded into per-interval peaks).
"""

from __future__ import annotations

import html
import math
import warnings

import ipywidgets as w
import numpy as np

from .. import events
from .. import memory
from ..units import fmt_bytes
from ..errors import NvkitError, require
from .common import CodeToggle, off_events, on_events, root, style
from .live import LiveChart, figure, plotly_ready, ticker

MAX_POINTS = 300                 # per line: a 5-minute window at one point a second
MAX_STEPS = 2000                 # training steps kept before every other one is dropped
MiB, GiB = float(2**20), float(2**30)
DEFAULT_WINDOW_S = 300.0
_COLORS = ["#76b900", "#1f77b4", "#ff7f0e", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22"]
_RSS_COLOR = "#e377c2"
_PRED_COLOR = "#d62728"
_LOSS_COLOR = "#ff7f0e"
_EVAL_COLOR = "#17becf"
_DASH = {"nvml_used": "solid", "torch_reserved": "dash", "torch_allocated": "dot"}
_SERIES_NAME = {"nvml_used": "used (NVML)", "torch_reserved": "reserved (torch)",
                "torch_allocated": "allocated (torch)"}
_ORDER = ("nvml_used", "torch_reserved", "torch_allocated")   # legend and drawing order
_KIND_SYMBOL = {"mark": "star", "oom": "x", "unload": "triangle-down", "load": "triangle-up"}


# --- words and numbers -----------------------------------------------------------------------------

def compare_phrase(c) -> str:
    """A comparison (``nvkit.memory.comparisons(frame=False)``) in words, measured first:
    "generate on cpu: measured 98 MiB, prediction 431 MiB: 4.4× too high"."""
    where = f"{c.what} on {c.device}"
    measured = fmt_bytes(c.measured)
    if c.device == "cpu":
        measured += " (process memory growth)"
    if c.predicted is None:
        return f"{where}: measured {measured}, nothing predicted"
    head = f"{where}: measured {measured}, prediction {fmt_bytes(c.predicted)}"
    if not c.measured:
        return head
    ratio = c.predicted / c.measured
    if 0.9 <= ratio <= 1.1:
        verdict = f"within {abs(ratio - 1):.0%}"
    elif ratio > 1:
        verdict = f"{ratio:.1f}× too high" if ratio >= 2 else f"{ratio - 1:.0%} too high"
    else:
        verdict = f"{1 / ratio:.1f}× too low" if ratio <= 0.5 else f"{1 - ratio:.0%} too low"
    return f"{head}: {verdict}"


def _nice_ceil(v: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 5, 7.5 × 10^k at or above ``v`` (axis tops that rarely move)."""
    if not v > 0 or not math.isfinite(v):
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.5, 2, 3, 5, 7.5, 10):
        if m * e >= v * (1 - 1e-9):
            return m * e
    return 10 * e


def _fold(t: np.ndarray, y: np.ndarray, res: float) -> tuple[np.ndarray, np.ndarray]:
    """At most one point per ``res`` seconds: the peak of each interval, at its last time (a
    memory chart must not hide a peak by averaging it away)."""
    if len(t) <= MAX_POINTS or res <= 0:
        return t, y
    b = np.floor(t / res)
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    ends = np.r_[starts[1:], len(t)] - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        peaks = np.fmax.reduceat(y, starts)
    return t[ends], peaks


def _rounded(a, digits: int) -> np.ndarray:
    """float64, rounded: what the browser needs, and shorter JSON (live.py sends arrays as lists)."""
    return np.round(np.asarray(a, dtype=np.float64), digits)


# --- the chart -------------------------------------------------------------------------------------

class MemoryChart(LiveChart):
    """The live memory chart; ``.figure`` is the plotly FigureWidget, ``.stop()`` ends its updates.

    ``x="time"`` (``nvkit.monitor()``): the last ``window_s`` seconds of the shared sampler.
    ``x="step"``: the steps of a fine-tune (``.follow(run)``), the training loss and the held-out
    (eval) loss above, on the same step axis, and the peak memory of each step below."""

    def __init__(self, devices=None, rate_hz: float = memory.DEFAULT_RATE_HZ, window_s: float = DEFAULT_WINDOW_S,
                 start: bool = True, x: str = "time"):
        require(isinstance(window_s, (int, float)) and not isinstance(window_s, bool) and 1 <= window_s <= 86400,
                f"window_s must be between 1 and 86400 seconds, not {window_s!r}.")
        require(x in ("time", "step"), f"x must be 'time' or 'step', not {x!r}.")
        plotly_ready()
        self.sampler = memory.sampler(rate_hz=rate_hz, window_s=window_s, start=start)
        shown = memory.pick_devices(self.sampler.devices, devices, "chart")
        self.devices = shown
        self.rate_hz = float(rate_hz)
        self.window_s = float(window_s)
        self.x = x
        self.run = None
        self._devices_arg = None if devices is None else list(devices)

        traces: list = []
        self.trace_index: dict[tuple, int] = {}   # (series, nvidia-smi index or None) -> position

        def add(key, **kw):
            import plotly.graph_objects as go
            kw.setdefault("x", [])
            kw.setdefault("y", [])
            traces.append(go.Scatter(**kw))
            self.trace_index[key] = len(traces) - 1

        for k, d in enumerate(shown):
            c = _COLORS[k % len(_COLORS)]
            for name in _ORDER:
                first = name == "nvml_used"
                add((name, d.index), mode="lines", name=d.label if first else f"{d.label} {_SERIES_NAME[name]}",
                    legendgroup=f"gpu{d.index}", showlegend=first,
                    line=dict(color=c, width=2 if first else 1.5, dash=_DASH[name]))
        if shown:  # style keys: what solid, dashed and dotted mean, once for every device
            for name in _ORDER:
                # one point below the axis: plotly leaves traces without data out of the legend
                add(("key", name), x=[0.0], y=[-1.0], mode="lines", name=_SERIES_NAME[name], legendgroup=f"key-{name}",
                    line=dict(color="#888", width=1.5, dash=_DASH[name]), hoverinfo="skip")
        add(("rss", None), mode="lines", name="process memory (RSS)",
            line=dict(color=_COLORS[0] if not shown else _RSS_COLOR, width=2))
        add(("predicted", None), mode="lines", name="predicted peak",
            line=dict(color=_PRED_COLOR, width=2, dash="dashdot"))
        if x == "step":
            add(("loss", None), mode="lines+markers", name="loss", yaxis="y2",
                line=dict(color=_LOSS_COLOR, width=2), marker=dict(size=4))
            # the run's evaluations (before the first step, every eval_every steps, at the end)
            add(("eval", None), mode="lines+markers", name="eval loss", yaxis="y2",
                line=dict(color=_EVAL_COLOR, width=2, dash="dash"), marker=dict(size=7, symbol="diamond"))
        add(("events", None), mode="markers", name="events", showlegend=False,
            marker=dict(size=9, color="#888", symbol="diamond"), hovertext=[], hoverinfo="text+x")

        layout = dict(
            height=380 if x == "step" else 340, margin=dict(l=72, r=20, t=36, b=40), template="plotly_white",
            paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
            title=dict(text=self._title(), x=0.01, font=dict(size=14)),
            xaxis=dict(title=dict(text="training step" if x == "step" else "seconds since nvkit started")),
            yaxis=dict(title=dict(text="memory (GiB)"), range=[0, 1], autorange=False),
            legend=dict(orientation="h", y=-0.2, x=0, font=dict(size=11)),
            hovermode="closest", uirevision="nvkit", showlegend=True)
        if x == "step":
            layout["yaxis"]["domain"] = [0, 0.56]
            layout["yaxis2"] = dict(domain=[0.64, 1], anchor="x", title=dict(text="loss"), rangemode="tozero")
            layout["xaxis"]["anchor"] = "y"
        fig = figure(traces, layout)
        fig.add_class("nvkit-memory-figure")
        self.points = w.HTML("0 points")
        self.points.add_class("nvkit-memory-points")
        self.status = w.HTML("")
        self.status.add_class("nvkit-memory-status")
        below = [w.HBox([self.points, self.status], layout=w.Layout(flex_flow="row wrap"))]
        self.code_view = None
        if x == "time":
            self.code_view = CodeToggle(self.code)
            below.append(self.code_view)
        super().__init__(fig, below)
        self.children = (style(), *self.children)
        self.add_class("nvkit-memory-chart")
        root(self)

        self._sent: dict = {}          # what the browser has: trace data and layout pieces
        self._seen = None
        # step mode: one entry per logged step
        self._steps: list = []
        self._loss: list = []
        self._step_mem: dict = {}
        self._seen_steps = 0
        self._t_prev = None
        self._eval_steps: list = []
        self._eval_loss: list = []
        on_events(self._on_event)
        self.refresh(force=True)
        if start:
            self.start()

    def _title(self) -> str:
        if self.x == "step":
            return "Fine-tune: loss and peak memory per step"
        return "GPU memory" if self.devices else "Process memory (no GPU in this kernel)"

    # --- following the session -------------------------------------------------------------------
    def _on_event(self, ev) -> None:
        # the recording thread only flags; the ticker does the work
        self._dirty = True
        if ev.kind == "select":
            self._seen = None
        if ev.kind in ("load", "unload", "select", "train-end", "generate-end"):
            ticker.wake()

    def follow(self, run) -> "MemoryChart":
        """Draw ``run`` (a ``nvkit.FinetuneRun``) from its first step (``x="step"`` charts)."""
        require(self.x == "step", "follow(run) needs a chart made with x='step'.")
        with self._draw_lock:
            self.run = run
            self._steps, self._loss, self._step_mem = [], [], {}
            self._seen_steps = 0
            self._t_prev = getattr(run, "t0", None)
            self._eval_steps, self._eval_loss = [], []
            self._dirty = True
        self.start()
        ticker.wake()
        return self

    # --- reading the sampler ---------------------------------------------------------------------
    def _sampler(self):
        s = memory.sampler(start=False)
        if s is not self.sampler:  # replaced: a longer window, or a new GPU selection
            self.sampler = s
        return s

    def _gpu_map(self, s) -> dict:
        """nvidia-smi index -> the sampler's Device, for the devices this chart draws that the
        kernel still sees."""
        by_index = {d.index: d for d in s.devices}
        return {d.index: by_index[d.index] for d in self.devices if d.index in by_index}

    def _uses_cuda(self) -> bool:
        return memory.cuda_in_use()

    def collect(self) -> bool:
        if self.x == "time":
            s = self._sampler()
            evs = events.events()
            state = (id(s), s.version, len(evs) and evs[-1].t, len(memory.comparisons(frame=False)),
                     id(memory.expectation()), self._uses_cuda())
            if state == self._seen:
                return False
            self._seen = state
            return True
        return self._collect_steps()

    def _collect_steps(self) -> bool:
        run = self.run
        if run is None:
            return False
        evals = self._collect_evals(run)
        hist = run.history
        n = len(hist)
        if n <= self._seen_steps:
            return evals
        new = hist[self._seen_steps:n]
        self._seen_steps = n
        s = self._sampler()
        ts = s.t.values()
        series = {("rss", None): s.rss.values()}
        for phys, d in self._gpu_map(s).items():
            for name in memory.SERIES:
                series[(name, phys)] = s.buffers[(name, d.cuda_index)].values()
        for rec in new:
            t = float(rec.get("t", events.now()))
            lo = int(np.searchsorted(ts, self._t_prev if self._t_prev is not None else t - 1.0, "right"))
            hi = int(np.searchsorted(ts, t, "right"))
            for key, y in series.items():
                if hi > lo:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)
                        v = float(np.nanmax(y[lo:hi]))
                else:
                    v = float(y[hi - 1]) if 0 < hi <= len(y) else float("nan")
                # a line that appears later (another device) starts with gaps, so every list
                # stays as long as the steps
                self._step_mem.setdefault(key, [float("nan")] * len(self._steps)).append(v)
            self._steps.append(int(rec.get("step", len(self._steps) + 1)))
            loss = rec.get("loss")
            self._loss.append(float(loss) if loss is not None else float("nan"))
            self._t_prev = t
        if len(self._steps) > MAX_STEPS:  # bounded: thin the older half, keep the last step
            keep = list(range(0, len(self._steps) - 1, 2)) + [len(self._steps) - 1]
            self._steps = [self._steps[i] for i in keep]
            self._loss = [self._loss[i] for i in keep]
            self._step_mem = {k: [v[i] for i in keep] for k, v in self._step_mem.items()}
        return True

    def _collect_evals(self, run) -> bool:
        """The run's evaluations (``run.eval_history``: step, eval_loss, ...) not drawn yet."""
        hist = getattr(run, "eval_history", None) or []
        if len(hist) <= len(self._eval_steps):
            return False
        for rec in hist[len(self._eval_steps):]:
            loss = rec.get("eval_loss")
            self._eval_steps.append(int(rec.get("step", 0)))
            self._eval_loss.append(float(loss) if loss is not None else float("nan"))
        return True

    # --- drawing ---------------------------------------------------------------------------------
    def draw(self) -> bool:
        s = self._sampler()
        gpus = self._gpu_map(s)
        cuda = self._uses_cuda()
        if self.x == "step":
            run_dev = str((self.run.info or {}).get("device", "cpu")) if self.run is not None else "cpu"
            if run_dev.startswith("cuda"):
                ci = int(run_dev.split(":")[1]) if ":" in run_dev else 0
                gpus = {p: d for p, d in gpus.items() if d.cuda_index == ci}
            else:
                gpus = {}
        data, n_points = self._series(s, gpus)
        show_torch = cuda
        show_rss = not gpus or not cuda
        visible = {}
        for d in self.devices:
            on = d.index in gpus
            visible[("nvml_used", d.index)] = on
            visible[("torch_reserved", d.index)] = on and show_torch
            visible[("torch_allocated", d.index)] = on and show_torch
        if self.devices:
            visible[("key", "nvml_used")] = bool(gpus)
            visible[("key", "torch_reserved")] = bool(gpus) and show_torch
            visible[("key", "torch_allocated")] = bool(gpus) and show_torch
        visible[("rss", None)] = True if show_rss else "legendonly"

        comps = memory.comparisons(frame=False)
        exp = memory.expectation()
        x_lo, x_hi = self._x_span(s)
        if self.x == "time":
            data[("predicted", None)] = self._predicted(comps, exp, x_lo, x_hi)
            ev = [e for e in events.events() if e.t >= x_lo]
            data[("events", None)] = (np.array([e.t for e in ev], dtype=np.float64), np.zeros(len(ev)))
            ev_text = [html.escape(f"{e.kind}: {e.text}"[:300]) for e in ev]
            ev_sym = [_KIND_SYMBOL.get(e.kind, "diamond") for e in ev]
        else:
            data[("predicted", None)] = self._predicted_steps(comps, exp)
            data[("events", None)] = (np.zeros(0), np.zeros(0))
            ev_text, ev_sym = [], []
        # a prediction is of the model's memory: beside a GPU's reserved memory it compares, beside
        # the whole process's RSS (Python, torch, every import) it does not; there the status line
        # compares it with the RSS growth, and the line is one legend click away
        visible[("predicted", None)] = True if gpus and cuda else "legendonly"

        # y axis: scaled to what is drawn, the device total shown when it is near
        peak = 0.0
        for key, (_, y) in data.items():
            if key[0] in ("events", "loss", "eval", "key") or visible.get(key) is not True or not len(y):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                m = float(np.nanmax(y))
            if m == m:
                peak = max(peak, m)
        totals = [float(d.memory_total) for d in self.devices if d.index in gpus]
        near = [t for t in totals if t <= 1.6 * peak] if peak > 0 else []
        top_bytes = max([peak * 1.15] + [t * 1.04 for t in near]) or 64 * MiB
        unit, uname = (GiB, "GiB") if top_bytes >= GiB else (MiB, "MiB")
        top = _nice_ceil(top_bytes / unit)
        far = sorted(set(totals) - set(near))

        with self.figure.batch_update():
            for key, v in visible.items():
                i = self.trace_index.get(key)
                if i is not None and self._sent.get(("visible", key)) != v:
                    self.figure.data[i].visible = v
                    self._sent[("visible", key)] = v
            if self.x == "step":
                data[("loss", None)] = (np.asarray(self._steps, dtype=np.float64), np.asarray(self._loss))
                data[("eval", None)] = (np.asarray(self._eval_steps, dtype=np.float64),
                                        np.asarray(self._eval_loss, dtype=np.float64))
            for key, (x, y) in data.items():
                i = self.trace_index.get(key)
                if i is None:
                    continue
                tr = self.figure.data[i]
                if tr.visible is False:
                    continue  # sent when it is shown again (a legendonly line keeps its data, so
                    #           that its legend entry exists and a click shows it at once)
                xs = _rounded(x, 2)
                per_unit = key[0] not in ("events", "loss", "eval")
                ys = _rounded(np.asarray(y) / (unit if per_unit else 1.0), 4 if per_unit else 5)
                old = self._sent.get(("data", key))
                if old is None or not (np.array_equal(old[0], xs, equal_nan=True)
                                       and np.array_equal(old[1], ys, equal_nan=True)):
                    tr.x, tr.y = xs, ys
                    self._sent[("data", key)] = (xs, ys)
            if self.devices:  # the style keys' point sits below the axis at the newest x
                x_key = [round(float(self._steps[-1]) if self.x == "step" and self._steps else x_hi, 2)]
                if self._sent.get("key_x") != x_key:
                    for name in _ORDER:
                        self.figure.data[self.trace_index[("key", name)]].x = x_key
                    self._sent["key_x"] = x_key
            if self.x == "step":
                dtick = 1 if len(self._steps) <= 12 else None
                if self._sent.get("dtick", 0) != dtick:
                    self.figure.layout.xaxis.dtick = dtick
                    self._sent["dtick"] = dtick
            if self._sent.get("events") != (ev_text, ev_sym):
                tr = self.figure.data[self.trace_index[("events", None)]]
                tr.hovertext = ev_text
                tr.marker.symbol = ev_sym
                self._sent["events"] = (ev_text, ev_sym)
            labels = {d.index: gpus[d.index].label for d in self.devices if d.index in gpus}
            if self._sent.get("labels") != labels:
                for phys, label in labels.items():
                    self.figure.data[self.trace_index[("nvml_used", phys)]].name = label
                self._sent["labels"] = labels
            if self._sent.get("unit") != uname:
                self.figure.layout.yaxis.title.text = f"memory ({uname})"
                tmpl = f"%{{y:.3f}} {uname}<extra>%{{fullData.name}}</extra>"
                for key, i in self.trace_index.items():
                    if key[0] in memory.SERIES or key[0] in ("rss", "predicted"):
                        self.figure.data[i].hovertemplate = tmpl
                self._sent["unit"] = uname
            if self._sent.get("top") != top:
                self.figure.layout.yaxis.range = [0, top]
                self._sent["top"] = top
            lines = self._total_lines(gpus, near, unit, uname, far)
            if self._sent.get("lines") != lines:
                self.figure.layout.shapes = lines[0]
                self.figure.layout.annotations = lines[1]
                self._sent["lines"] = lines
            title = self._title()
            if self._sent.get("title") != title:
                self.figure.layout.title.text = title
                self._sent["title"] = title
        self._status(comps, exp, n_points)
        return True

    def _x_span(self, s) -> tuple[float, float]:
        t_all = s.t.values()
        t_end = float(t_all[-1]) if len(t_all) else events.now()
        return t_end - self.window_s, t_end

    def _series(self, s, gpus: dict) -> tuple[dict, int]:
        """(x, y bytes) per drawn line, folded to at most MAX_POINTS points."""
        data: dict = {}
        n_points = 0
        if self.x == "step":
            xs = np.asarray(self._steps, dtype=np.float64)
            for key, ys in self._step_mem.items():
                if key[0] == "rss" or key[1] in gpus:
                    data[key] = (xs, np.asarray(ys, dtype=np.float64))
            return data, len(xs)
        t_min, _ = self._x_span(s)
        res = self.window_s / MAX_POINTS
        for phys, d in gpus.items():
            for name in memory.SERIES:
                try:
                    t, y = s.series(name, d.cuda_index)
                except NvkitError:
                    t, y = np.zeros(0), np.zeros(0)
                keep = t >= t_min
                data[(name, phys)] = _fold(t[keep], y[keep], res)
                n_points = max(n_points, int(keep.sum()))
        t, y = s.series("rss")
        keep = t >= t_min
        data[("rss", None)] = _fold(t[keep], y[keep], res)
        n_points = max(n_points, int(keep.sum()))
        return data, n_points

    def _total_lines(self, gpus: dict, near: list, unit: float, uname: str, far: list):
        shapes, notes = [], []
        for k, d in enumerate(self.devices):
            if d.index not in gpus:
                continue
            total = float(d.memory_total)
            if total in near:
                shapes.append(dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=total / unit, y1=total / unit,
                                   line=dict(color=_COLORS[k % len(_COLORS)], width=1, dash="longdash")))
        if near:
            notes.append(dict(xref="paper", yref="y", x=1, y=max(near) / unit, xanchor="right", yanchor="bottom",
                              text=f"device total {fmt_bytes(max(near))}", showarrow=False,
                              font=dict(size=11)))
        if far:
            what = fmt_bytes(far[0]) if len(far) == 1 else f"{fmt_bytes(far[0])}–{fmt_bytes(far[-1])}"
            notes.append(dict(xref="paper", yref="paper", x=1, y=1.0, xanchor="right", yanchor="bottom",
                              text=f"device total {what}, above this scale", showarrow=False, font=dict(size=11)))
        return shapes, notes

    def _predicted(self, comps, exp, t_min: float, t_end: float):
        """Predicted-peak segments: one per recorded comparison, plus the expectation in force
        from the start of the running operation until now."""
        xs, ys = [], []
        for c in comps:
            if c.predicted is None or c.t_end < t_min:
                continue
            xs += [c.t_start, c.t_end, np.nan]
            ys += [float(c.predicted)] * 2 + [np.nan]
        if exp is not None:
            busy_since = memory.open_since()
            if busy_since is not None:
                xs += [busy_since, t_end, np.nan]
                ys += [float(exp.total)] * 2 + [np.nan]
        return np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64)

    def _predicted_steps(self, comps, exp):
        """This run's prediction over its steps: the one recorded with its measurement once it
        ended, the one in force while it runs."""
        t0 = getattr(self.run, "t0", None)
        mine = [c for c in comps if c.what == "train" and t0 is not None and c.t_start >= t0 - 1.0]
        predicted = mine[-1].predicted if mine else (exp.total if exp is not None else None)
        if predicted is None or not self._steps:
            return np.zeros(0), np.zeros(0)
        return (np.array([self._steps[0], self._steps[-1]], dtype=np.float64),
                np.array([float(predicted)] * 2, dtype=np.float64))

    def _status(self, comps, exp, n_points: int) -> None:
        if self.x == "step":
            self.points.value = f"{len(self._steps)} steps"
        else:
            self.points.value = f"{n_points} points"
        if self.x == "step":  # this run's own comparison, not the kernel's latest
            t0 = getattr(self.run, "t0", None)
            comps = [c for c in comps if c.what == "train" and t0 is not None and c.t_start >= t0 - 1.0]
        last = comps[-1] if comps else None
        if last is not None:
            text = " · " + html.escape(compare_phrase(last))
        elif exp is not None:
            text = f" · predicted peak {html.escape(fmt_bytes(exp.total))}"
        else:
            text = ""
        if self.status.value != text:
            self.status.value = text

    def show_error(self, text: str) -> None:
        self.status.value = f" · <span class='nvkit-warn'>not redrawing: {html.escape(text[:200])}</span>"

    # --- code -------------------------------------------------------------------------------------
    def code(self) -> str:
        if self.x == "step":
            return ("import nvkit\nchart = nvkit.MemoryChart(x='step')\nchart.follow(run)  "
                    "# run = nvkit.finetune(...)\nchart")
        args = []
        if self._devices_arg is not None:
            args.append(f"devices={self._devices_arg!r}")
        if self.rate_hz != memory.DEFAULT_RATE_HZ:
            args.append(f"rate_hz={self.rate_hz:g}")
        if self.window_s != DEFAULT_WINDOW_S:
            args.append(f"window_s={self.window_s:g}")
        return f"import nvkit\nchart = nvkit.monitor({', '.join(args)})\nchart"

    def close(self):
        off_events(self._on_event)
        super().close()


def monitor(devices=None, rate_hz: float = memory.DEFAULT_RATE_HZ, window_s: float = DEFAULT_WINDOW_S) -> MemoryChart:
    """A live memory chart of the GPUs this process sees (``devices``: cuda indices; None = all),
    sampled ``rate_hz`` times a second (≤ 20; redrawn at most once a second, only while it can
    be seen) over the last ``window_s`` seconds. Display it, then ``await`` work in a later cell
    to watch it move."""
    return MemoryChart(devices=devices, rate_hz=rate_hz, window_s=window_s)
