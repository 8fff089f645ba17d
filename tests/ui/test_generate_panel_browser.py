"""The Generate panel in real JupyterLab + Chromium: type a prompt, click Generate, the text grows
while the kernel streams, Stop ends it."""

import time

from tests import demo_model  # noqa: E402
from tests.ui.conftest import open_and_run_notebook, screenshot, write_notebook


def _output_len(page) -> int:
    return page.evaluate("() => { const e = document.querySelector('.nvkit-generate-output');"
                         " return e ? e.innerText.length : -1; }")


def test_type_generate_stream_and_stop(lab, page):
    path = demo_model.path()
    write_notebook(lab.root_dir, "generate_panel.ipynb", [
        f"import os; os.environ['HF_HUB_OFFLINE'] = '1'\nimport nvkit\ns = nvkit.load({path!r}, device_map='cpu', dtype='float32')\n"
        # the demo model ends its sentences with EOS; without it the run lasts long enough to Stop
        "s.model.generation_config.eos_token_id = None",
        "from nvkit.ui.generate_panel import GeneratePanel\np = GeneratePanel()\np.max_new_tokens.value = 20000\np",
    ])
    open_and_run_notebook(page, lab, "generate_panel.ipynb")
    prompt = page.locator(".nvkit-generate-prompt textarea")
    prompt.wait_for(timeout=60_000)
    prompt.fill("Hello there")
    page.locator(".nvkit-generate-button").click()
    page.wait_for_function("() => { const e = document.querySelector('.nvkit-generate-output');"
                           " return e && e.innerText.length > 'Hello there'.length; }", timeout=60_000)
    first = _output_len(page)
    time.sleep(1.5)
    second = _output_len(page)
    assert second > first, (first, second)  # text arrives progressively, not at the end
    screenshot(page, "generate-panel-streaming")
    page.locator(".nvkit-stop-button").click()
    page.wait_for_function("() => { const e = document.querySelector('.nvkit-generate-stats');"
                           " return e && e.innerText.includes('stopped'); }", timeout=30_000)
    stopped_at = _output_len(page)
    time.sleep(1.0)
    assert _output_len(page) == stopped_at  # nothing more after Stop
    assert page.locator(".nvkit-generate-button button, button.nvkit-generate-button").first.is_enabled()
