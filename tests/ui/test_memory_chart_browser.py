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


def _cell_running(page, i: int) -> bool:
    """Cell ``i`` is executing: the kernel is busy, cell ``i`` has no output yet and every earlier
    cell has one (the chart)."""
    return page.evaluate(
        """(i) => {
            const w = window.jupyterapp.shell.currentWidget;
            const k = w && w.sessionContext.session && w.sessionContext.session.kernel;
            if (!k || k.status !== 'busy') return false;
            const cells = [...w.node.querySelectorAll('.jp-CodeCell')];
            if (cells.length <= i) return false;
            const outs = cells.map(c => c.querySelectorAll('.jp-OutputArea-output').length);
            return outs.slice(0, i).every(n => n > 0) && outs[i] === 0;
        }""", i)


def test_chart_grows_while_a_cell_awaits_generation(page, lab, tmp_path_factory):
    model_dir = _tiny_model_dir(tmp_path_factory)
    write_notebook(lab.root_dir, "memory_chart.ipynb", [
        "import nvkit\n"
        f"s = nvkit.load({model_dir!r}, device_map='cpu')\n"
        "chart = nvkit.monitor(rate_hz=5)\n"
        "chart",
        "out = await s.agenerate('NVIDIA GPUs are', max_new_tokens=4000, min_new_tokens=4000)\n"
        "print('generated', s.last_stats.new_tokens)",
    ])
    open_notebook(page, lab, "memory_chart.ipynb")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_selector(POINTS, timeout=120_000)
    deadline = time.monotonic() + 120
    while not _cell_running(page, 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not _cell_running(page, 1):
        shot = screenshot(page, "memory-chart-not-started")
        pytest.fail(f"the generation cell never started (page saved to {shot})")
    first = _points(page)
    time.sleep(2.5)
    assert _cell_running(page, 1), "generation ended too soon to watch the chart; raise max_new_tokens"
    second = _points(page)
    screenshot(page, "memory-chart-live")
    assert second > first, (first, second)
    wait_kernel_idle(page, timeout_ms=300_000)
    assert "generated 4000" in page.inner_text(".jp-NotebookPanel:not(.lm-mod-hidden)")
