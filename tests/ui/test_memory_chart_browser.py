"""The memory chart in a real JupyterLab + headless Chromium: its point count grows in the page while
another cell awaits a generation (the awaitable API keeps the kernel serving widget messages)."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_memory import _tiny_model_dir
from tests.ui.conftest import open_notebook, screenshot, wait_kernel_idle, write_notebook

POINTS = ".jp-NotebookPanel:not(.lm-mod-hidden) .nvkit-memory-points"


def _points(page) -> int:
    text = page.inner_text(POINTS)
    m = re.match(r"(\d+) points", text.strip())
    assert m, text
    return int(m.group(1))


def test_chart_grows_while_a_cell_awaits_generation(page, lab, tmp_path_factory):
    model_dir = _tiny_model_dir(tmp_path_factory)
    write_notebook(lab.root_dir, "memory_chart.ipynb", [
        "import nvkit\n"
        f"s = nvkit.load({model_dir!r}, device_map='cpu')\n"
        "chart = nvkit.monitor(rate_hz=5)\n"
        "chart",
        # marker files tell the test, without asking the busy browser, when the await is under way
        "import pathlib; pathlib.Path('gen-started').touch()\n"
        "out = await s.agenerate('NVIDIA GPUs are', max_new_tokens=4000, min_new_tokens=4000)\n"
        "pathlib.Path('gen-done.tmp').write_text(str(s.last_stats.new_tokens))\n"
        "pathlib.Path('gen-done.tmp').rename('gen-done')  # whole, never seen half-written\n"
        "print('generated', s.last_stats.new_tokens)",
    ])
    open_notebook(page, lab, "memory_chart.ipynb")
    # Run the chart cell, wait until the chart is in the page (plotly's bundle takes a while to
    # load here), then start the generation: run-all would let a short generation end unseen.
    run_cell = """(i) => { const nb = window.jupyterapp.shell.currentWidget.content;
                           nb.activeCellIndex = i;
                           // not returned: the command's promise settles only when the cell ends
                           window.jupyterapp.commands.execute('notebook:run-cell'); return true; }"""
    page.evaluate(run_cell, 0)
    page.wait_for_selector(POINTS, timeout=180_000)
    # The plotly figure itself (a ~5 MB bundle) renders well after the label: until it has, the
    # browser's main thread is too busy to answer the checks below in time.
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .js-plotly-plot .main-svg", timeout=240_000)
    wait_kernel_idle(page, timeout_ms=120_000)
    page.evaluate(run_cell, 1)
    started, done = lab.root_dir / "gen-started", lab.root_dir / "gen-done"
    deadline = time.monotonic() + 180
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not started.exists():
        shot = screenshot(page, "memory-chart-not-started")
        pytest.fail(f"the generation cell never started (page saved to {shot})")
    time.sleep(1.0)
    first = _points(page)
    time.sleep(3.0)
    second = _points(page)
    assert not done.exists(), "generation ended too soon to watch the chart; raise max_new_tokens"
    screenshot(page, "memory-chart-live")
    assert second > first, (first, second)
    deadline = time.monotonic() + 300
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert done.exists() and done.read_text() == "4000"
