"""The Fine-tune panel in a real JupyterLab + Chromium: Start, the loss chart grows, Stop works."""

from __future__ import annotations

import json

from tests import demo_model  # noqa: E402
from tests.ui.conftest import cell_errors, open_and_run_notebook, write_notebook
from tests.ui.helpers import element_screenshot

# the loss line of the Fine-tune chart (steps on x), as plotly drew it in the page
CHART_POINTS = """() => {
    const el = document.querySelector('.nvkit-ft-chart .js-plotly-plot');
    const loss = el && el.data && el.data.find(t => t.name === 'loss');
    return loss && loss.x ? loss.x.length : -1;
}"""


def test_finetune_panel_start_chart_stop(page, lab, tmp_path_factory):
    path = demo_model.path()
    cells = [
        "import os\nos.environ['HF_HUB_OFFLINE'] = '1'\nimport torch\ntorch.set_num_threads(2)\nimport nvkit\n"
        f"s = nvkit.load({json.dumps(path)})",
        "p = nvkit.FinetunePanel()\n"
        "p.examples.value = '\\n'.join(['The H200 has 141 GB of fast memory.'] * 64)\n"
        "p.steps.value = 2000\np.batch.value = 4\np.seq_len.value = 64\n"
        f"p.output_dir.value = {json.dumps(str(lab.root_dir / 'ft-run'))}\n"
        "p",
    ]
    write_notebook(lab.root_dir, "finetune_panel.ipynb", cells)
    page.set_viewport_size({"width": 1200, "height": 1600})  # the whole panel in its screenshots
    open_and_run_notebook(page, lab, "finetune_panel.ipynb")
    assert not cell_errors(page), cell_errors(page)
    start = page.locator("button.nvkit-ft-start")
    start.wait_for(timeout=60_000)
    start.click()
    # the cell has returned, so the click is served while training runs in its worker
    page.wait_for_function(f"() => ({CHART_POINTS})() >= 3", timeout=180_000, polling=250)
    n1 = page.evaluate(CHART_POINTS)
    page.wait_for_function(f"() => ({CHART_POINTS})() > {n1}", timeout=120_000, polling=250)
    assert "step" in page.locator(".nvkit-ft-progress-label").inner_text()
    element_screenshot(page.locator(".nvkit-finetune-panel"), "finetune-panel-running")
    page.locator("button.nvkit-ft-stop").click()
    page.wait_for_function(
        "() => { const e = document.querySelector('.nvkit-ft-status'); return e && e.innerText.includes('Stopped'); }",
        timeout=120_000, polling=250)
    summary = page.locator(".nvkit-ft-summary").inner_text()
    assert "adapter" in summary and "ft-run" in summary
    assert (lab.root_dir / "ft-run" / "adapter" / "adapter_config.json").is_file()
    assert page.locator("button.nvkit-ft-start").is_enabled()
    element_screenshot(page.locator(".nvkit-finetune-panel"), "finetune-panel-stopped")
