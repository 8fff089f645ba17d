"""MemoryChart: every trace exists from the start, and updates land in fig.data[i].x / .y."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

import nvkit.memory.peaks
import nvkit
from nvkit import events, memory
from nvkit.errors import NvkitError

from tests.memory_fixtures import fake_gpus, no_gpus  # noqa: F401 (pytest fixtures)
from nvkit.ui.memory_chart import MemoryChart


def _trace(chart, key):
    return chart.figure.data[chart.trace_index[key]]


def test_all_traces_are_created_once_and_fill_with_samples(fake_gpus):
    chart = MemoryChart(start=False)
    names = [t.name for t in chart.figure.data]
    assert names == ["cuda:0 NVML used", "cuda:0 torch reserved", "cuda:0 torch allocated", "cuda:0 total",
                     "cuda:0 predicted peak", "cuda:1 NVML used", "cuda:1 torch reserved",
                     "cuda:1 torch allocated", "cuda:1 total", "cuda:1 predicted peak", "events"]
    s = chart.sampler
    for _ in range(5):
        s.sample()
    nvkit.mark("after five samples")
    assert chart.refresh()
    used = _trace(chart, ("nvml_used", 1))
    x, y = np.asarray(used.x), np.asarray(used.y)
    assert len(x) == len(y) == 5 and x.dtype == np.float64
    assert np.all(np.diff(x) >= 0)
    _, raw = s.series("nvml_used", 1)
    assert np.allclose(y, raw / 2**30)
    ceil = _trace(chart, ("total", 0))
    assert list(ceil.y) == [143771 / 1024] * 2
    ev = _trace(chart, ("events", None))
    assert ev.hovertext[-1] == "mark: after five samples" and ev.x[-1] == pytest.approx(events.events()[-1].t)
    assert not chart.refresh()  # nothing new: no redraw
    s.sample()
    assert chart.refresh() and len(_trace(chart, ("nvml_used", 1)).x) == 6
    assert chart.points.value == "6 points"
    assert len(chart.figure.data) == len(names)  # nothing was added
    assert "nvkit-memory-chart" in chart._dom_classes


def test_predicted_peak_drawn_beside_the_measurement(no_gpus):
    memory.peaks.tracker().comparisons.clear()  # earlier tests' generations would draw their own predicted peaks
    chart = MemoryChart(start=False)
    assert [t.name for t in chart.figure.data] == ["process RSS", "predicted peak", "events"]
    est = nvkit.estimate("qwen3-tiny", device="cpu")
    memory.expect(est)
    try:
        events.record("generate-start", "chart test")
        chart.sampler.sample()
        chart.refresh()
        pred = _trace(chart, ("predicted", None))
        assert np.nanmax(np.asarray(pred.y)) == pytest.approx(est.total / 2**30)
        events.record("generate-end", "chart test")
        chart.refresh()
        pred = _trace(chart, ("predicted", None))
        ys = np.asarray(pred.y)
        assert np.nanmax(ys) == pytest.approx(est.total / 2**30)
        assert "predicted" in chart.status.value and "measured" in chart.status.value
    finally:
        memory.expect(None)


def test_window_drops_old_points(no_gpus):
    chart = MemoryChart(start=False, window_s=1)
    s = chart.sampler
    s.sample()
    s.t._data[: len(s.t)] -= 10  # pretend the first sample is 10 s old
    s.sample()
    chart.refresh(force=True)
    assert len(_trace(chart, ("rss", None)).x) == 1


def test_live_updates_from_the_thread(no_gpus):
    import time
    chart = nvkit.monitor(rate_hz=10, window_s=60)
    try:
        time.sleep(1.0)
        n1 = len(_trace(chart, ("rss", None)).x)
        time.sleep(1.0)
        n2 = len(_trace(chart, ("rss", None)).x)
        assert 2 <= n1 < n2
        assert chart.updates <= 2 * 5 + 2  # ≤ 5 redraws a second
    finally:
        chart.stop()


def test_code_and_bad_arguments(fake_gpus):
    chart = MemoryChart(devices=[1], rate_hz=10, window_s=60, start=False)
    assert [t.name for t in chart.figure.data][0] == "cuda:1 NVML used"
    assert chart.code() == "import nvkit\nchart = nvkit.monitor(devices=[1], rate_hz=10, window_s=60)\nchart"
    ns = {}
    exec(chart.code().replace("\nchart\n", "\n").rsplit("\nchart", 1)[0], ns)
    assert isinstance(ns["chart"], MemoryChart)
    ns["chart"].stop()
    for kwargs, match in [(dict(devices=[3]), "cuda:3"), (dict(devices="0"), "devices"),
                          (dict(rate_hz=50), "rate_hz"), (dict(window_s=0), "window_s")]:
        with pytest.raises(NvkitError, match=match):
            MemoryChart(start=False, **kwargs)
