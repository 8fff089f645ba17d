"""MemoryChart without a browser: every trace exists from the start, redraws carry plain lists of
at most MAX_POINTS points, nothing is redrawn while no view can see it, the browser's replies
can't raise, the y axis follows the data, the Fine-tune mode puts steps on x, and the words for
predicted vs measured read the right way round. (tests/ui measures a displayed chart's cost.)"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

import nvkit
from nvkit import events, memory
import nvkit.memory.peaks  # noqa: E402
from nvkit.errors import NvkitError

from tests.memory_fixtures import fake_gpus, no_gpus  # noqa: F401 (pytest fixtures)
from nvkit.ui import live
from nvkit.ui.memory_chart import MAX_POINTS, MemoryChart, compare_phrase


def _trace(chart, key):
    return chart.figure.data[chart.trace_index[key]]


def _hide(chart):
    chart.watch._on_view_msg(chart.watch, {"view": "v1", "visible": False}, [])


def _show(chart):
    chart.watch._on_view_msg(chart.watch, {"view": "v1", "visible": True}, [])


def test_traces_are_made_once_and_fill_from_the_shared_sampler(fake_gpus):
    chart = MemoryChart(start=False)
    names = [t.name for t in chart.figure.data]
    assert names == ["cuda:0", "cuda:0 reserved (torch)", "cuda:0 allocated (torch)",
                     "cuda:1", "cuda:1 reserved (torch)", "cuda:1 allocated (torch)",
                     "used (NVML)", "reserved (torch)", "allocated (torch)",
                     "process memory (RSS)", "predicted peak", "events"]
    # compact legend: one entry per device plus the three line styles
    shown = [t.name for t in chart.figure.data if t.showlegend is not False]
    assert "cuda:0 reserved (torch)" not in shown and "cuda:0" in shown and "reserved (torch)" in shown
    s = chart.sampler
    assert s is memory.sampler(start=False)
    for _ in range(5):
        s.sample()
    nvkit.mark("after five samples")
    assert chart.refresh()
    used = _trace(chart, ("nvml_used", 1))
    x, y = np.asarray(used.x), np.asarray(used.y)
    assert len(x) == len(y) == 5 and np.all(np.diff(x) >= 0)
    _, raw = s.series("nvml_used", 1)
    unit = 2**30 if "GiB" in chart.figure.layout.yaxis.title.text else 2**20
    assert np.allclose(y, raw / unit, atol=1e-3)
    # the axis is scaled to the data, not to the 140 GiB device: that is a note, not the scale
    top = chart.figure.layout.yaxis.range[1]
    assert np.nanmax(y) <= top < 10 * max(np.nanmax(y), 0.1)
    assert any("above this scale" in a.text for a in chart.figure.layout.annotations)
    ev = _trace(chart, ("events", None))
    assert ev.hovertext[-1] == "mark: after five samples" and ev.x[-1] == pytest.approx(events.events()[-1].t, abs=0.01)
    assert not chart.refresh()  # nothing new: no redraw
    s.sample()
    assert chart.refresh() and len(_trace(chart, ("nvml_used", 1)).x) == 6
    assert chart.points.value == "6 points"
    assert len(chart.figure.data) == len(names)  # nothing was added
    assert "nvkit-memory-chart" in chart._dom_classes
    chart.close()


def test_torch_lines_and_process_memory_follow_cuda_use(fake_gpus, monkeypatch):
    chart = MemoryChart(start=False)
    chart.sampler.sample()
    chart.refresh(force=True)
    # this process has no CUDA context: torch's lines say nothing, the process's memory does
    assert _trace(chart, ("torch_reserved", 0)).visible is False
    assert _trace(chart, ("rss", None)).visible is True
    monkeypatch.setattr(chart, "_uses_cuda", lambda: True)
    chart.sampler.sample()
    chart.refresh()
    assert _trace(chart, ("torch_reserved", 0)).visible is True
    assert _trace(chart, ("rss", None)).visible == "legendonly"
    chart.close()


def test_cpu_only_kernel_draws_the_process_memory(no_gpus):
    memory.peaks.tracker().comparisons.clear()  # earlier tests' generations would draw their own predicted peaks
    chart = MemoryChart(start=False)
    assert [t.name for t in chart.figure.data] == ["process memory (RSS)", "predicted peak", "events"]
    assert "no GPU" in chart.figure.layout.title.text
    chart.sampler.sample()
    chart.refresh(force=True)
    rss = _trace(chart, ("rss", None))
    assert rss.visible is True and len(rss.x) >= 1
    assert chart.figure.layout.yaxis.range[1] >= np.nanmax(np.asarray(rss.y))
    chart.close()


def test_predicted_peak_beside_the_measurement_in_plain_words(no_gpus):
    memory.peaks.tracker().comparisons.clear()
    chart = MemoryChart(start=False)
    est = nvkit.estimate("qwen3-tiny", device="cpu")
    memory.expect(est)
    try:
        events.record("generate-start", "chart test")
        chart.sampler.sample()
        chart.refresh()
        events.record("generate-end", "chart test")
        chart.refresh()
        pred = _trace(chart, ("predicted", None))
        assert pred.visible == "legendonly"      # beside the whole RSS it would not compare
        pred.visible = True                      # a legend click
        chart.refresh(force=True)
        ys = np.asarray(pred.y, dtype=float)
        unit = 2**30 if "GiB" in chart.figure.layout.yaxis.title.text else 2**20
        # the chart sends 4 decimals of its unit (GiB once this process's RSS nears 1 GiB, as
        # late in a whole-suite run): within half of the last one
        assert np.nanmax(ys) == pytest.approx(est.total / unit, rel=1e-3, abs=0.51e-4)
        text = chart.status.value
        assert "measured" in text and "prediction" in text and "%" not in text.split("prediction")[0]
    finally:
        memory.expect(None)
    chart.close()


def test_compare_phrase_reads_the_right_way_round():
    class C:
        what, device = "generate", "cpu"

        def __init__(self, predicted, measured):
            self.predicted, self.measured = predicted, measured

    mib = 2**20
    assert compare_phrase(C(431 * mib, 98 * mib)) == \
        "generate on cpu: measured 98.00 MiB (process memory growth), prediction 431.00 MiB: 4.4× too high"
    assert compare_phrase(C(80 * mib, 100 * mib)).endswith("20% too low")
    assert compare_phrase(C(10 * mib, 100 * mib)).endswith("10.0× too low")
    assert compare_phrase(C(105 * mib, 100 * mib)).endswith("within 5%")
    assert compare_phrase(C(None, 100 * mib)).endswith("nothing predicted")


def test_window_is_bounded_in_time_and_points(no_gpus):
    chart = MemoryChart(start=False, window_s=1)
    s = chart.sampler
    s.sample()
    s.t._data[: len(s.t)] -= 10  # pretend the first sample is 10 s old
    s.sample()
    chart.refresh(force=True)
    assert len(_trace(chart, ("rss", None)).x) == 1
    chart.close()
    # a long window at the highest rate folds into at most MAX_POINTS per line, keeping the peak
    chart = MemoryChart(start=False, window_s=600)
    s = chart.sampler
    for _ in range(3000):
        s.sample()
    n = len(s.t)
    s.t._data[:n] = np.linspace(events.now() - 590, events.now(), n)
    s.rss._data[n // 2] = 9 * 2**30
    chart.refresh(force=True)
    rss = _trace(chart, ("rss", None))
    assert len(rss.x) <= MAX_POINTS + 1
    assert np.nanmax(np.asarray(rss.y)) == pytest.approx(9.0, rel=1e-3)
    chart.close()


def test_redraws_only_when_seen_and_at_most_once_a_second(no_gpus):
    chart = nvkit.monitor(rate_hz=10, window_s=60)
    try:
        _show(chart)
        time.sleep(2.5)
        n1 = chart.updates
        assert 1 <= n1 <= 4, n1          # ≤ 1 redraw a second (plus the first)
        _hide(chart)                      # tab closed, output scrolled away: nothing is sent
        time.sleep(0.3)
        n2 = chart.updates
        time.sleep(2.0)
        assert chart.updates == n2 and chart.skipped_hidden > 0
        _show(chart)
        time.sleep(1.5)
        assert chart.updates > n2
        chart.stop()
        n3 = chart.updates
        time.sleep(1.5)
        assert chart.updates == n3
    finally:
        chart.close()


def test_arrays_travel_as_lists_and_browser_replies_cannot_raise(no_gpus, caplog):
    chart = MemoryChart(start=False)
    fig = chart.figure
    chart.sampler.sample()
    chart.refresh(force=True)
    to_json = fig.trait_metadata("_py2js_update", "to_json")
    msg = to_json({"style_data": {"x": [np.array([1.0, np.nan, 3.0])]}}, None)
    assert msg == {"style_data": {"x": [[1.0, None, 3.0]]}}  # JSON lists, no binary buffers
    # the reply plotly's handler choked on: a trace's array folded into an object by the browser
    reply = {"trace_edit_id": fig._last_trace_edit_id,
             "trace_deltas": [{"uid": fig.data[0].uid, "x": {"0": 1.0, "1": 2.0}, "marker": {"size": 6}}]}
    state = {"_js2py_traceDeltas": reply, "_js2py_layoutDelta": {"layout_edit_id": -1, "layout_delta": {}}}
    fig._handle_msg({"content": {"data": {"method": "update", "state": state, "buffer_paths": []}}, "buffers": []})
    assert not fig._trace_edit_in_process
    assert not [r for r in caplog.records if "Exception" in r.getMessage()]
    chart.close()


def test_stock_figurewidget_raises_on_that_reply():
    """What QuietFigure guards against, shown on plotly's own FigureWidget."""
    import plotly.graph_objects as go
    fig = go.FigureWidget(data=[go.Scatter(x=np.arange(3.0), y=np.arange(3.0))])
    fig.data[0].x = np.array([1.0, 2.0, 3.0])
    reply = {"trace_edit_id": fig._last_trace_edit_id,
             "trace_deltas": [{"uid": fig.data[0].uid, "x": {"0": 1.0, "1": 2.0}}]}
    with pytest.raises(ValueError, match="truth value of an array"):
        fig._js2py_traceDeltas = reply


def test_selection_hides_gpus_the_kernel_no_longer_sees(fake_gpus, monkeypatch):
    import sys
    S = sys.modules["nvkit.hardware.selection"]
    monkeypatch.setattr(S, "cuda_initialized", lambda: False)
    monkeypatch.setattr(S, "kernel_id", lambda: None)
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.setenv(k, "")  # records the original, so teardown restores it
        monkeypatch.delenv(k)
    chart = MemoryChart(start=False)
    chart.sampler.sample()
    chart.refresh(force=True)
    assert _trace(chart, ("nvml_used", 0)).visible and _trace(chart, ("nvml_used", 1)).visible
    try:
        nvkit.select_gpus([1])
        s = memory.sampler(start=False)
        assert [d.index for d in s.devices] == [1]       # the shared sampler followed the selection
        s.sample()
        chart.refresh()
        assert _trace(chart, ("nvml_used", 0)).visible is False
        assert _trace(chart, ("nvml_used", 1)).visible is True
        assert _trace(chart, ("nvml_used", 1)).name == "cuda:0 (GPU 1)"
    finally:
        chart.close()


class _Run:
    """What MemoryChart(x="step") reads of a FinetuneRun."""

    def __init__(self):
        self.t0 = events.now()
        self.history = []
        self.eval_history = []
        self.info = {"device": "cpu"}


def test_fine_tune_mode_puts_steps_on_x(no_gpus):
    chart = MemoryChart(x="step", start=False)
    assert chart.figure.layout.xaxis.title.text == "training step"
    assert [t.name for t in chart.figure.data] == ["process memory (RSS)", "predicted peak", "loss", "eval loss",
                                                   "events"]
    run = _Run()
    chart.follow(run)
    chart.stop()
    s = chart.sampler
    run.eval_history.append({"step": 0, "eval_loss": 4.0, "eval_perplexity": 54.6, "t": events.now()})
    for step in range(1, 6):
        s.sample()
        s.sample()
        run.history.append({"step": step, "loss": 3.0 / step, "t": events.now()})
        if step % 2 == 0:
            run.eval_history.append({"step": step, "eval_loss": 4.0 / step, "eval_perplexity": 1.0, "t": events.now()})
    chart.refresh()
    # the held-out loss on the loss plot, at the steps it was measured (0: before the first step)
    ev = _trace(chart, ("eval", None))
    assert list(ev.x) == [0, 2, 4] and list(ev.y) == [4.0, 2.0, 1.0] and ev.yaxis == "y2"
    loss = _trace(chart, ("loss", None))
    assert list(loss.x) == [1, 2, 3, 4, 5] and np.asarray(loss.y)[0] == pytest.approx(3.0)
    mem = _trace(chart, ("rss", None))
    assert list(mem.x) == [1, 2, 3, 4, 5] and np.all(np.asarray(mem.y) > 0)
    assert chart.points.value == "5 steps"
    assert chart.figure.layout.xaxis.dtick == 1
    with pytest.raises(NvkitError, match="x='step'"):
        MemoryChart(start=False).follow(run)
    chart.close()


def test_code_and_bad_arguments(fake_gpus):
    chart = MemoryChart(devices=[1], rate_hz=10, window_s=60, start=False)
    assert [t.name for t in chart.figure.data][0] == "cuda:1"
    assert chart.code() == "import nvkit\nchart = nvkit.monitor(devices=[1], rate_hz=10, window_s=60)\nchart"
    ns = {}
    exec(chart.code().rsplit("\nchart", 1)[0], ns)
    assert isinstance(ns["chart"], MemoryChart)
    ns["chart"].close()
    chart.code_view.toggle.value = True
    assert "nvkit.monitor(devices=[1]" in chart.code_view.html.value
    for kwargs, match in [(dict(devices=[3]), "cuda:3"), (dict(devices="0"), "devices"),
                          (dict(rate_hz=50), "rate_hz"), (dict(window_s=0), "window_s"), (dict(x="steps"), "x must")]:
        with pytest.raises(NvkitError, match=match):
            MemoryChart(start=False, **kwargs)
    chart.close()


def test_one_thread_for_every_chart(no_gpus):
    charts = [MemoryChart() for _ in range(3)]
    try:
        import threading
        names = [t.name for t in threading.enumerate()]
        assert names.count("nvkit-live") == 1 and names.count("nvkit-memory-sampler") == 1
        assert len(live.ticker) >= 3
    finally:
        for c in charts:
            c.close()
