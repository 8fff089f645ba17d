"""FinetunePanel without a browser: Start runs nvkit.finetune, the chart fills, Stop works, errors show."""

from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train.data import parse_examples as _parse_inline
from nvkit.ui.finetune_panel import FinetunePanel  # noqa: E402
from tests.finetune_helpers import model_path  # noqa: E402


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return model_path(tmp_path_factory)


def _wait(cond, timeout=180):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_parse_inline():
    rows = _parse_inline('plain text\n\n{"prompt": "a", "response": "b"}\n"quoted"\n')
    assert rows == ["plain text", {"prompt": "a", "response": "b"}, "quoted"]
    with pytest.raises(NvkitError, match="JSON"):
        _parse_inline('{"prompt": ')
    with pytest.raises(NvkitError, match="No examples"):
        _parse_inline("  \n ")


def test_panel_without_model_says_so():
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()
    p = FinetunePanel()
    assert "Load a model" in p.estimate.value
    assert p.start() is None and "No model" in p.status.value
    assert not p.start_btn.disabled and p.stop_btn.disabled
    # no chart (and no plotly bundle) before a run
    assert p.chart is None and p.figure is None
    for cls in ("nvkit-ft-start", "nvkit-ft-stop", "nvkit-ft-progress"):
        assert any(cls in wdg._dom_classes for wdg in (p.start_btn, p.stop_btn, p.progress))
    assert "nvkit-ft-chart" in p.chart_box._dom_classes
    p.close()


def test_estimate_follows_a_load_in_another_cell(path):
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()
    p = FinetunePanel()
    assert "Load a model" in p.estimate.value
    s = nvkit.load(path)            # anywhere: a cell, the magic, the Model tab
    try:
        assert "Estimated peak for this run" in p.estimate.value
    finally:
        s.unload()
    assert "Load a model" in p.estimate.value
    p.close()


def test_panel_start_chart_stop_summary(path, tmp_path):
    s = nvkit.load(path)
    p = FinetunePanel()
    p.examples.value = "\n".join(["The H200 has 141 GB of fast memory."] * 32)
    p.steps.value = 300
    p.batch.value = 4
    p.seq_len.value = 64
    p.output_dir.value = str(tmp_path / "run")
    code = p.code()
    assert "nvkit.finetune(nvkit.session(), data," in code and "max_steps=300" in code
    compile(code.replace("await run", "run.result()"), "<panel code>", "exec")
    run = p.start()
    assert run is not None and p.run is run
    assert p.start_btn.disabled and not p.stop_btn.disabled
    assert p.start() is None and "in progress" in p.status.value  # a second Start is refused
    # one chart, on the shared sampler and the shared live thread: no thread of the panel's own
    import threading
    assert not [t for t in threading.enumerate() if t.name == "nvkit-ft-panel"]
    chart = p.chart
    assert chart.x == "step" and chart.run is run
    loss = chart.figure.data[chart.trace_index[("loss", None)]]
    mem = chart.figure.data[chart.trace_index[("rss", None)]]
    _wait(lambda: (loss.x is not None and len(loss.x) >= 2) or run.done)
    assert len(loss.x) >= 2 and len(mem.x) == len(loss.x) and list(loss.x)[:2] == [1, 2]
    _wait(lambda: p.progress.value > 0)
    assert "step" in p.progress_label.value
    p.stop_btn.click()
    run.result(timeout=120)
    _wait(lambda: not p.start_btn.disabled)
    assert run.stopped and run.step < 300
    assert "Stopped" in p.status.value
    assert "adapter" in p.summary.value and "tokens/s" in p.summary.value
    assert os.path.isdir(run.adapter_dir)
    p.close()
    s.unload()


def test_panel_bad_data_shows_error(path):
    s = nvkit.load(path)
    p = FinetunePanel()
    p.examples.value = '{"question": "a", "answer": "b"}'
    assert p.start() is None
    assert "keys" in p.status.value and not p.start_btn.disabled
    p.source.value = "file"
    assert p.examples.layout.display == "none" and p.path.layout.display is None
    assert p.start() is None and "Choose a data file" in p.status.value
    p.path.value = "/no/such/file.jsonl"
    assert p.start() is None and "not found" in p.status.value
    assert "data = '/no/such/file.jsonl'" in p.code()
    assert s.generate("The H200", max_new_tokens=3)
    p.close()
    s.unload()
