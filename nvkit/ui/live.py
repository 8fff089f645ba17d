"""What every live nvkit chart shares, so that a displayed chart costs the kernel next to nothing.

- ``QuietFigure``: plotly's FigureWidget without the parts that made displayed charts expensive.
  After each redraw plotly's browser side sends the *whole* trace state back ("trace deltas"),
  ipywidgets echoes that message to the browser again, and plotly folds it into each trace's
  defaults. With numpy arrays sent as binary buffers the browser's copy never compares equal, so
  the deltas carried every array as a ``{"0": .., "1": ..}`` object, which plotly's handler then
  tests with ``if not array`` (``ValueError: truth value of an array is ambiguous``, once per
  redraw, in the Log Console). Here arrays travel as JSON lists (so the deltas stay small), the
  reply is neither echoed nor parsed, and its handler only marks the edit as done: nothing in
  widget message handling can raise.
- ``ViewWatch``: a tiny anywidget beside each chart whose browser side reports, with an
  IntersectionObserver and the page's visibility, whether any view of the chart can be seen.
  A chart in a hidden tab, a collapsed or scrolled-away output or a background browser tab is
  not redrawn.
- ``LiveChart``: the base of the charts; one shared thread (``ticker``) redraws each chart at most
  once a second, only when it has new points and can be seen, and spaces redraws so that a chart
  takes at most ``BUDGET`` of the kernel's time: a redraw that took longer (a busy kernel, the
  GIL held by a decode loop) pushes the next one further out.
- ``every``: other periodic widget refreshes (the Fine-tune tab's progress line) run on the same
  thread instead of one thread each.
"""

from __future__ import annotations

import threading
import time
import weakref

import ipywidgets as w

MIN_INTERVAL_S = 1.0     # at most one redraw a second per chart
BUDGET = 0.01            # share of the kernel's time a chart's redraws may take
IDLE_CHECK_S = 0.25      # how often the ticker looks for new points when nothing is due


class _Ticker:
    """One daemon thread for every live widget of the process. Jobs are weakly held: a chart that
    is garbage collected simply stops being ticked."""

    def __init__(self):
        self._jobs: "weakref.WeakKeyDictionary[object, float]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def add(self, job) -> None:
        """``job.tick(now) -> next due time`` is called from the ticker thread."""
        with self._lock:
            self._jobs[job] = 0.0
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="nvkit-live", daemon=True)
                self._thread.start()
        self._wake.set()

    def remove(self, job) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    def wake(self) -> None:
        self._wake.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def _loop(self) -> None:
        while True:
            with self._lock:
                jobs = list(self._jobs.items())
            if not jobs:
                self._wake.wait(5.0)
                self._wake.clear()
                continue
            now = time.monotonic()
            soonest = now + 5.0
            for job, due in jobs:
                if due <= now:
                    try:
                        due = float(job.tick(now))
                    except Exception:  # a closed comm or a failed read: the job tries again later
                        self.errors += 1
                        due = now + 5.0
                    with self._lock:
                        if job in self._jobs:
                            self._jobs[job] = due
                soonest = min(soonest, due)
            woken = self._wake.wait(max(0.02, soonest - time.monotonic()))
            self._wake.clear()
            if woken:  # a view was shown or hidden: every job looks again (each keeps its own pace)
                t = time.monotonic()
                with self._lock:
                    for job in self._jobs:
                        self._jobs[job] = min(self._jobs[job], t)


ticker = _Ticker()


class _Every:
    def __init__(self, period_s: float, fn):
        self.period_s = float(period_s)
        self._fn = fn
        self._last = -1e9

    def tick(self, now: float) -> float:
        if now - self._last >= self.period_s * 0.9:
            self._last = now
            self._fn()
        return self._last + self.period_s


def every(period_s: float, fn, owner) -> None:
    """Call ``fn()`` about every ``period_s`` seconds from the shared thread, for as long as
    ``owner`` lives (the job is kept on ``owner._nvkit_every``; ``stop_every(owner)`` ends it)."""
    job = _Every(period_s, fn)
    jobs = owner.__dict__.setdefault("_nvkit_every", [])
    jobs.append(job)
    ticker.add(job)


def stop_every(owner) -> None:
    for job in owner.__dict__.pop("_nvkit_every", []):
        ticker.remove(job)


# --- the figure ----------------------------------------------------------------------------------

def _quiet_figure_class():
    """Built on first use: importing plotly's FigureWidget costs about a second (nbformat)."""
    global QuietFigure
    if "QuietFigure" in globals():
        return QuietFigure
    import numpy as np
    import plotly.graph_objects as go
    from plotly.basedatatypes import Undefined
    from plotly.serializers import custom_serializers
    from traitlets import Dict, List, observe

    def to_js(v, _manager=None):
        # numpy arrays as JSON lists (C-speed tolist; NaN, which JSON lacks, as null gaps)
        if isinstance(v, np.ndarray):
            out = v.tolist()
            if v.dtype.kind == "f" and np.isnan(v).any():
                out = [None if x != x else x for x in out]
            return out
        if isinstance(v, dict):
            return {k: to_js(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [to_js(x) for x in v]
        if v is Undefined:
            return "_undefined_"
        return v

    out = dict(sync=True, to_json=to_js, from_json=custom_serializers["from_json"])
    # the replies are only looked at for their edit id: no deep conversion, no echo
    reply = dict(sync=True, echo_update=False, from_json=lambda v, _m=None: v)
    back = dict(sync=True, echo_update=False, **custom_serializers)

    class QuietFigure(go.FigureWidget):  # noqa: F811 - defined once, on first use
        """A FigureWidget that sends arrays as lists and neither echoes nor parses the browser's
        replies to its redraws."""

        _widget_layout = Dict().tag(**out)
        _widget_data = List().tag(**out)
        _py2js_addTraces = Dict(allow_none=True).tag(**out)
        _py2js_restyle = Dict(allow_none=True).tag(**out)
        _py2js_relayout = Dict(allow_none=True).tag(**out)
        _py2js_update = Dict(allow_none=True).tag(**out)
        _py2js_animate = Dict(allow_none=True).tag(**out)
        _js2py_traceDeltas = Dict(allow_none=True).tag(**reply)
        _js2py_layoutDelta = Dict(allow_none=True).tag(**reply)
        # what a user does in the browser (zoom, legend clicks) is applied as plotly does it
        _js2py_restyle = Dict(allow_none=True).tag(**back)
        _js2py_relayout = Dict(allow_none=True).tag(**back)
        _js2py_update = Dict(allow_none=True).tag(**back)
        _js2py_pointsCallback = Dict(allow_none=True).tag(**back)

        @observe("_js2py_traceDeltas")
        def _handler_js2py_traceDeltas(self, change):
            # plotly folds the browser's computed defaults into each trace here; nvkit's charts
            # never read those defaults, so the edit is only marked as done.
            msg = change["new"]
            if isinstance(msg, dict) and msg.get("trace_edit_id") == self._last_trace_edit_id:
                self._trace_edit_in_process = False
                if not self._layout_edit_in_process:
                    while self._waiting_edit_callbacks:
                        self._waiting_edit_callbacks.pop()()

        @observe("_js2py_layoutDelta")
        def _handler_js2py_layoutDelta(self, change):
            msg = change["new"]
            if isinstance(msg, dict) and msg.get("layout_edit_id") == self._last_layout_edit_id:
                self._layout_edit_in_process = False
                if not self._trace_edit_in_process:
                    while self._waiting_edit_callbacks:
                        self._waiting_edit_callbacks.pop()()

    globals()["QuietFigure"] = QuietFigure
    return QuietFigure


def plotly_ready() -> None:
    """Call before making plotly objects. plotly checks every value against pandas types whenever
    pandas is in sys.modules, and a module another thread is half-way through importing (a
    trainer starting, a cell) is in sys.modules without its types. ``import`` waits for that
    import to finish, so after this call pandas is whole for every later check and redraw."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass


def figure(data, layout):
    """A ``QuietFigure`` with every trace given at once (traces added later are lost inside a
    Box: plotly#4998). ``responsive``: plotly follows the window's size (a figure first drawn
    while hidden took a 700-px default; ViewWatch fires a resize when it is shown)."""
    plotly_ready()
    fig = _quiet_figure_class()(data=data, layout=layout)
    fig._config = {"responsive": True, "displaylogo": False}
    return fig


# --- can anyone see it? -------------------------------------------------------------------------

_WATCH_ESM = r"""
function render({ model, el }) {
  const id = Math.random().toString(36).slice(2);
  let shown = false, sent = null, io = null, timer = null;
  const report = () => {
    const v = shown && document.visibilityState === "visible";
    if (v !== sent) {
      sent = v;
      try { model.send({ view: id, visible: v }); } catch (e) { /* closed */ }
      // a plotly figure drawn while hidden (a closed tab) took a default width: resize it to
      // its box now that it can be seen
      if (v) window.dispatchEvent(new Event("resize"));
    }
  };
  const start = () => {
    if (!el.isConnected) { timer = setTimeout(start, 250); return; }
    const target = el.closest(".nvkit-watched") || el.parentElement || el;
    io = new IntersectionObserver(entries => {
      for (const e of entries) shown = e.isIntersecting;
      report();
    });
    io.observe(target);
  };
  document.addEventListener("visibilitychange", report);
  start();
  return () => {
    clearTimeout(timer);
    if (io) io.disconnect();
    document.removeEventListener("visibilitychange", report);
    shown = false;
    report();
  };
}
export default { render };
"""

# Charts and panels take their colours from JupyterLab's theme variables, so they follow Light
# and Dark. plotly writes its colours inline on the SVG; these rules override them.
CHART_CSS = """
.nvkit-chart .js-plotly-plot .main-svg .xtick text, .nvkit-chart .js-plotly-plot .main-svg .ytick text,
.nvkit-chart .js-plotly-plot .main-svg .y2tick text, .nvkit-chart .js-plotly-plot .main-svg .xtitle,
.nvkit-chart .js-plotly-plot .main-svg .ytitle, .nvkit-chart .js-plotly-plot .main-svg .y2title,
.nvkit-chart .js-plotly-plot .main-svg .gtitle, .nvkit-chart .js-plotly-plot .main-svg .legendtext,
.nvkit-chart .js-plotly-plot .main-svg .legendtitletext,
.nvkit-chart .js-plotly-plot .main-svg .annotation-text { fill: var(--jp-ui-font-color1) !important; }
.nvkit-chart .js-plotly-plot .main-svg .gridlayer path,
.nvkit-chart .js-plotly-plot .main-svg .zerolinelayer path { stroke: var(--jp-border-color2) !important; }
.nvkit-chart .js-plotly-plot .main-svg .legend .bg { fill: transparent !important; }
.nvkit-chart .js-plotly-plot .modebar-btn path { fill: var(--jp-ui-font-color2) !important; }
.nvkit-chart .js-plotly-plot .modebar { background: transparent !important; }
.nvkit-chart .nvkit-watch { height: 0; overflow: hidden; }
"""


def _watch_class():
    global ViewWatch
    if "ViewWatch" in globals():
        return ViewWatch
    import anywidget

    class ViewWatch(anywidget.AnyWidget):  # noqa: F811 - defined once, on first use
        """Reports whether any browser view of the enclosing ``.nvkit-watched`` box is visible."""

        _esm = _WATCH_ESM
        _css = CHART_CSS

        def __init__(self, on_change=None):
            super().__init__()
            self.add_class("nvkit-watch")
            self._views: dict[str, bool] = {}
            self._lock = threading.Lock()
            self._on_change = on_change
            self.on_msg(self._on_view_msg)

        @property
        def reported(self) -> bool:
            """Whether any browser view has reported (headless runs never do)."""
            with self._lock:
                return bool(self._views)

        @property
        def visible(self) -> bool:
            with self._lock:
                return any(self._views.values())

        def _on_view_msg(self, _widget, content, _buffers) -> None:
            if not isinstance(content, dict) or not isinstance(content.get("view"), str):
                return
            with self._lock:
                self._views[content["view"][:32]] = bool(content.get("visible"))
                if len(self._views) > 64:  # views of a page that went away without saying so
                    for k in [k for k, v in self._views.items() if not v][:32]:
                        del self._views[k]
            if self._on_change is not None:
                try:
                    self._on_change()
                except Exception:
                    pass

    globals()["ViewWatch"] = ViewWatch
    return ViewWatch


def view_watch(on_change=None):
    return _watch_class()(on_change=on_change)


# --- the base chart ------------------------------------------------------------------------------

class LiveChart(w.VBox):
    """A FigureWidget (``.figure``), a status line and a ViewWatch, redrawn by the shared ticker.

    Subclasses implement ``collect()`` (cheap; runs even while hidden, may return True when there
    is something new to draw) and ``draw()`` (builds the lists and sends them in one update)."""

    def __init__(self, figure_widget, status_widgets=(), **kwargs):
        self.figure = figure_widget
        self.figure.add_class("nvkit-chart-figure")
        self.watch = view_watch(on_change=ticker.wake)
        super().__init__([self.figure, *status_widgets, self.watch], **kwargs)
        self.add_class("nvkit-chart")
        self.add_class("nvkit-watched")
        self.updates = 0               # redraws sent
        self.skipped_hidden = 0        # ticks with something new that nobody could see
        self.redraw_seconds = 0.0      # total wall time spent in redraws
        self.redraw_cpu_seconds = 0.0  # and the CPU time they took
        self.last_error: str | None = None
        self._failures = 0
        self._dirty = True
        self._next = 0.0
        self._running = False
        self._draw_lock = threading.RLock()

    # --- control ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._running

    def start(self):
        if not self._running:
            self._running = True
            ticker.add(self)
        return self

    def stop(self) -> None:
        """End the redraws (shared samplers and runs go on)."""
        self._running = False
        ticker.remove(self)

    # (a constructor that raised leaves a half-made widget whose __del__ still calls close())
    _running = False

    def close(self):
        self.stop()
        for x in (getattr(self, "watch", None), getattr(self, "figure", None)):
            if x is not None:
                x.close()
        super().close()

    @property
    def visible(self) -> bool:
        """Whether a browser view can see the chart; True until a view has reported (so a
        front end without anywidget still gets a live chart)."""
        return self.watch.visible or not self.watch.reported

    # --- the ticker's side -----------------------------------------------------------------------
    def tick(self, now: float) -> float:
        if not self._running:
            return now + 5.0
        with self._draw_lock:
            if self.collect():
                self._dirty = True
        if not self._dirty:
            return now + IDLE_CHECK_S
        if not self.visible:
            self.skipped_hidden += 1
            return now + IDLE_CHECK_S
        if now < self._next:
            return self._next
        self._redraw()
        return self._next

    def _redraw(self) -> bool:
        with self._draw_lock:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                drew = self.draw()
                self.last_error, self._failures = None, 0
            except Exception as e:  # the ticker tries again; a chart that keeps failing says why
                self.last_error = f"{type(e).__name__}: {e}"
                self._failures += 1
                if self._failures >= 3:
                    self.show_error(self.last_error)
                drew = False
            cost = time.perf_counter() - t0
            self.redraw_seconds += cost
            self.redraw_cpu_seconds += time.thread_time() - c0
            self._dirty = False
            self._next = time.monotonic() + max(MIN_INTERVAL_S, cost / BUDGET)
            if drew:
                self.updates += 1
            return drew

    def refresh(self, force: bool = False) -> bool:
        """Redraw now if there is anything new (``force``: in any case); True when it redrew."""
        with self._draw_lock:
            if self.collect():
                self._dirty = True
        if not (self._dirty or force):
            return False
        self._dirty = True
        return self._redraw()

    # --- for subclasses --------------------------------------------------------------------------
    def collect(self) -> bool:
        return False

    def draw(self) -> bool:
        raise NotImplementedError

    def show_error(self, text: str) -> None:
        """Say that redrawing keeps failing (the status line of a subclass)."""
