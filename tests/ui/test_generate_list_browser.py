"""The Generate panel's list mode in real JupyterLab + Chromium: tick "Prompt list", one prompt per
line, Generate, the answers arrive in a table (escaped, in the prompts' order); a .jsonl file
loaded through the file button fills the list; "Same text alone or in a list" runs the list with
``deterministic=True`` (on the CPU each prompt alone), the stats line saying so."""

from tests import demo_model  # noqa: E402
from tests.ui.conftest import open_and_run_notebook, screenshot, write_notebook


def test_a_prompt_list_fills_the_table(lab, page, tmp_path):
    path = demo_model.path()
    write_notebook(lab.root_dir, "generate_list.ipynb", [
        f"import os; os.environ['HF_HUB_OFFLINE'] = '1'\nimport nvkit\ns = nvkit.load({path!r}, device_map='cpu', dtype='float32')",
        "from nvkit.ui.generate_panel import GeneratePanel\np = GeneratePanel()\np.max_new_tokens.value = 12\np",
    ])
    open_and_run_notebook(page, lab, "generate_list.ipynb")
    page.locator(".nvkit-generate-list input[type=checkbox]").check()
    page.locator(".nvkit-generate-file").wait_for(state="visible", timeout=30_000)
    page.locator(".nvkit-generate-prompt textarea").fill("NVIDIA GPUs are\n<b>Hello</b> there\nA")
    page.locator(".nvkit-generate-button").click()
    page.wait_for_function("() => { const e = document.querySelector('.nvkit-generate-stats');"
                           " return e && e.innerText.startsWith('3/3 prompts'); }", timeout=120_000)
    rows = page.locator(".nvkit-generate-results table tr")
    assert rows.count() == 4
    cells = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(1, 4)]
    assert cells == ["NVIDIA GPUs are", "<b>Hello</b> there", "A"]  # shown as text, in order
    assert page.locator(".nvkit-generate-results b").count() == 0
    assert all(rows.nth(i).locator("td").nth(2).inner_text().strip() for i in range(1, 4))
    screenshot(page, "generate-panel-list")
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"prompt": "CUDA graphs replay"}\n"Tokens per second"\n', encoding="utf-8")
    with page.expect_file_chooser() as chooser:  # the widget's file input is not in the page: click its button
        page.locator(".nvkit-generate-file").click()
    chooser.value.set_files(str(f))
    page.wait_for_function("() => { const e = document.querySelector('.nvkit-generate-status');"
                           " return e && e.innerText.includes('Loaded 2 prompts from prompts.jsonl'); }",
                           timeout=30_000)
    assert page.locator(".nvkit-generate-prompt textarea").input_value() == "CUDA graphs replay\nTokens per second"
    page.locator(".nvkit-generate-deterministic input[type=checkbox]").check()
    page.locator(".nvkit-generate-button").click()
    page.wait_for_function("() => { const e = document.querySelector('.nvkit-generate-stats');"
                           " return e && e.innerText.startsWith('2/2 prompts'); }", timeout=120_000)
    assert "each prompt runs alone on plain generate" in page.locator(".nvkit-generate-stats").inner_text()
    assert page.locator(".nvkit-generate-results table tr").count() == 3
