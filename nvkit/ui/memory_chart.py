"""``nvkit.monitor()`` → ``MemoryChart``: GPU memory over time, live while a cell awaits work.

Per GPU: NVML used (whole device), torch reserved and allocated (this process), the device total as
a ceiling, the predicted peak of the estimate in force beside them, and the events (load, unload,
generate, training steps, marks) as markers with their text on hover. Without GPUs: process RSS.

The plotly FigureWidget is created once, with every trace, in the constructor (traces added later
are lost inside a Box: plotly#4998); a background thread only replaces x/y with float64 arrays from
the shared sampler's ring buffers inside ``batch_update()``, at most 5 times a second.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from .. import events
from ..memory import peaks, sampling
from ..memory.usage import pick_devices
from ..units import fmt_bytes
from ..errors import NvkitError, require

GiB = float(2**30)
MAX_UPDATES_HZ = 5.0
_COLORS = ["#76b900", "#1f77b4", "#ff7f0e", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf"]
_KIND_SYMBOL = {"mark": "star", "oom": "x", "unload": "triangle-down", "load": "triangle-up"}


class MemoryChart(w.VBox):
    """The live memory chart; ``.figure`` is the plotly FigureWidget, ``.stop()`` ends its updates."""

    def __init__(self, devices=None, rate_hz: float = sampling.DEFAULT_RATE_HZ, window_s: float = 300.0,
                 start: bool = True):
        require(isinstance(window_s, (int, float)) and not isinstance(window_s, bool) and 1 <= window_s <= 86400,
                f"window_s must be between 1 and 86400 seconds, not {window_s!r}.")
        self.sampler = sampling.sampler(rate_hz=rate_hz, window_s=window_s, start=start)
        shown = pick_devices(self.sampler.devices, devices, "chart")
        self.devices = shown
        self.rate_hz = float(rate_hz)
        self.window_s = float(window_s)
        self._devices_arg = None if devices is None else list(devices)

        traces: list = []
        # trace index map: (series, cuda_index) -> position in fig.data; all created here, once.
        self.trace_index: dict[tuple, int] = {}
        for k, d in enumerate(shown):
            c = _COLORS[k % len(_COLORS)]
            self._add(traces, ("nvml_used", d.cuda_index), f"{d.label} NVML used", dict(color=c, width=2))
            self._add(traces, ("torch_reserved", d.cuda_index), f"{d.label} torch reserved", dict(color=c, width=1.5, dash="dash"))
            self._add(traces, ("torch_allocated", d.cuda_index), f"{d.label} torch allocated", dict(color=c, width=1.5, dash="dot"))
            self._add(traces, ("total", d.cuda_index), f"{d.label} total", dict(color=c, width=1, dash="longdash"), opacity=0.5)
            self._add(traces, ("predicted", d.cuda_index), f"{d.label} predicted peak", dict(color="#d62728", width=2, dash="dashdot"))
        if not shown:
            self._add(traces, ("rss", None), "process RSS", dict(color=_COLORS[0], width=2))
            self._add(traces, ("predicted", None), "predicted peak", dict(color="#d62728", width=2, dash="dashdot"))
        traces.append(go.Scatter(x=np.zeros(0), y=np.zeros(0), mode="markers", name="events",
                                 marker=dict(size=10, color="#444", symbol="diamond"),
                                 hovertext=[], hoverinfo="text+x"))
        self.trace_index[("events", None)] = len(traces) - 1
        # one constructor call with every trace: cheaper than add_trace one by one, and nothing is
        # ever added later (it would be lost inside the VBox)
        fig = go.FigureWidget(data=traces, layout=dict(
            height=360, margin=dict(l=60, r=20, t=40, b=40),
            title=dict(text="GPU memory" if shown else "Process memory (no GPU)", x=0.01),
            xaxis=dict(title="seconds since nvkit started"), yaxis=dict(title="GiB", rangemode="tozero"),
            legend=dict(orientation="h", y=-0.25), hovermode="closest", uirevision="nvkit"))
        self.figure = fig
        self.status = w.HTML("")
        self.status.add_class("nvkit-memory-status")
        self.points = w.HTML("0 points")
        self.points.add_class("nvkit-memory-points")
        fig.add_class("nvkit-memory-figure")
        super().__init__([fig, w.HBox([self.points, self.status])])
        self.add_class("nvkit-memory-chart")
        self._seen = (-1, -1, -1)
        self.updates = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refresh()
        if start:
            self.start()

    def _add(self, traces: list, key, name, line, opacity=1.0):
        traces.append(go.Scatter(x=np.zeros(0), y=np.zeros(0), mode="lines", name=name, line=line, opacity=opacity))
        self.trace_index[key] = len(traces) - 1

    # --- updating ---------------------------------------------------------------------------------
    def start(self) -> "MemoryChart":
        if self._thread is not None and self._thread.is_alive():
            return self
        self.sampler.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="nvkit-memory-chart", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the chart's updates (the shared sampler keeps running for other charts)."""
        if not hasattr(self, "_stop"):  # the constructor raised before the thread existed
            return
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(2)
        self._thread = None

    def close(self):
        self.stop()
        super().close()

    def _loop(self) -> None:
        period = 1.0 / min(MAX_UPDATES_HZ, self.rate_hz)
        while not self._stop.wait(period):
            try:
                self.refresh()
            except Exception:  # a closed comm or a transient read must not kill the thread
                pass

    def refresh(self, force: bool = False) -> bool:
        """Redraw from the sampler if anything changed; returns True when it redrew."""
        s = sampling.sampler(start=False)
        if s is not self.sampler:  # the shared sampler was replaced (bigger window)
            self.sampler = s
        evs = events.events()
        comps = peaks.comparisons(frame=False)
        exp = peaks.expectation()
        state = (s.version, len(evs) and evs[-1].t, len(comps), id(exp))
        if state == self._seen and not force:
            return False
        self._seen = state
        t_all = s.t.values()
        if len(t_all):
            t_end = float(t_all[-1])
        else:
            t_end = events.now()
        t_min = t_end - self.window_s
        data = {}
        n_points = 0
        for d in self.devices:
            for name in sampling.SERIES:
                try:
                    t, y = s.series(name, d.cuda_index)
                except NvkitError:
                    t, y = np.zeros(0), np.zeros(0)
                keep = t >= t_min
                data[(name, d.cuda_index)] = (t[keep], y[keep] / GiB)
                n_points = max(n_points, int(keep.sum()))
            t0 = float(t_all[0]) if len(t_all) else t_end
            ceil = float(d.memory_total) / GiB
            data[("total", d.cuda_index)] = (np.array([max(t0, t_min), t_end], dtype=np.float64),
                                             np.array([ceil, ceil], dtype=np.float64))
            data[("predicted", d.cuda_index)] = self._predicted(d.label, comps, exp, t_min, t_end)
        if not self.devices:
            t, y = s.series("rss")
            keep = t >= t_min
            data[("rss", None)] = (t[keep], y[keep] / GiB)
            n_points = int(keep.sum())
            data[("predicted", None)] = self._predicted("cpu", comps, exp, t_min, t_end)
        ev = [e for e in evs if e.t >= t_min]
        ev_x = np.array([e.t for e in ev], dtype=np.float64)
        ev_text = [html.escape(f"{e.kind}: {e.text}"[:300]) for e in ev]
        ev_sym = [_KIND_SYMBOL.get(e.kind, "diamond") for e in ev]
        with self.figure.batch_update():
            for key, (x, y) in data.items():
                tr = self.figure.data[self.trace_index[key]]
                tr.x = np.asarray(x, dtype=np.float64)
                tr.y = np.asarray(y, dtype=np.float64)
            tr = self.figure.data[self.trace_index[("events", None)]]
            tr.x = ev_x
            tr.y = np.zeros(len(ev), dtype=np.float64)
            tr.hovertext = ev_text
            tr.marker.symbol = ev_sym
        self.updates += 1
        self.points.value = f"{n_points} points"
        last = comps[-1] if comps else None
        if last is not None:
            self.status.value = f" · {html.escape(str(last))}"
        elif exp is not None:
            self.status.value = f" · predicted peak {html.escape(fmt_bytes(exp.total))}"
        return True

    def _predicted(self, label: str, comps, exp, t_min: float, t_end: float):
        """Predicted-peak segments: one per recorded comparison on this device, plus the
        expectation in force from the last start until now."""
        xs, ys = [], []
        for c in comps:
            if c.device != label or c.predicted is None or c.t_end < t_min:
                continue
            xs += [c.t_start, c.t_end, np.nan]
            ys += [c.predicted / GiB] * 2 + [np.nan]
        if exp is not None:
            busy_since = peaks.open_since()
            if busy_since is not None:
                xs += [busy_since, t_end, np.nan]
                ys += [exp.total / GiB] * 2 + [np.nan]
        return np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64)

    # --- code -------------------------------------------------------------------------------------
    def code(self) -> str:
        args = []
        if self._devices_arg is not None:
            args.append(f"devices={self._devices_arg!r}")
        if self.rate_hz != sampling.DEFAULT_RATE_HZ:
            args.append(f"rate_hz={self.rate_hz:g}")
        if self.window_s != 300.0:
            args.append(f"window_s={self.window_s:g}")
        return f"import nvkit\nchart = nvkit.monitor({', '.join(args)})\nchart"


def monitor(devices=None, rate_hz: float = sampling.DEFAULT_RATE_HZ, window_s: float = 300.0) -> MemoryChart:
    """A live memory chart of the GPUs this process sees (``devices``: cuda indices; None = all),
    sampled ``rate_hz`` times a second (≤ 20; redrawn ≤ 5 times a second) over the last
    ``window_s`` seconds. Display it, then ``await`` work in a later cell to watch it move."""
    return MemoryChart(devices=devices, rate_hz=rate_hz, window_s=window_s)
