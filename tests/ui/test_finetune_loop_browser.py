"""The fine-tune loop on the panels in a real JupyterLab + Chromium, as a user clicks it: Preview
shows the rows as the model sees them, a short run with held-out evaluation draws the eval curve
on the chart, "Compare with base" in the Generate panel shows base and tuned side by side, Export
writes a checkpoint; both panels, with every new control shown, look finished at a 1000-px-wide
notebook in Light and Dark. Screenshots (SCREENSHOTS in tests/ui/conftest.py): finetune-panel-loop-<theme>.png and
generate-panel-compare-<theme>.png."""

from __future__ import annotations

import json

from tests import demo_model  # noqa: E402
from tests.ui.conftest import cell_errors, open_and_run_notebook, write_notebook
from tests.ui.helpers import console_problems, element_screenshot, layout_problems, notebook_width, set_theme

FT = ".nvkit-finetune-panel"
GEN = ".nvkit-generate-panel"
QA = [{"prompt": f"Which GPU holds shard {i}?", "response": f"GPU {i % 4} holds shard {i}."} for i in range(16)]

# the eval line of the Fine-tune chart, as plotly drew it in the page
EVAL_STEPS = """() => {
    const el = document.querySelector('.nvkit-ft-chart .js-plotly-plot');
    const ev = el && el.data && el.data.find(t => t.name === 'eval loss');
    return ev && ev.x ? Array.from(ev.x) : null;
}"""


def _wait_text(page, selector: str, text: str, timeout_ms: int = 120_000) -> None:
    page.wait_for_function("([sel, t]) => { const e = document.querySelector(sel);"
                           " return !!(e && e.innerText.includes(t)); }",
                           arg=[selector, text], timeout=timeout_ms, polling=250)


def test_preview_run_with_eval_compare_export(page, lab, tmp_path_factory):
    messages = []
    page.on("console", lambda m: messages.append((m.type, m.text[:300])))
    path = demo_model.path()
    out = lab.root_dir / "loop-run"
    cells = [
        "import os\nos.environ['HF_HUB_OFFLINE'] = '1'\nimport torch\ntorch.set_num_threads(2)\nimport nvkit\n"
        f"s = nvkit.load({json.dumps(path)})",
        "ft = nvkit.FinetunePanel()\n"
        f"ft.examples.value = {json.dumps(chr(10).join(json.dumps(r) for r in QA))}\n"
        "ft.steps.value = 6\nft.batch.value = 4\nft.seq_len.value = 64\n"
        f"ft.output_dir.value = {json.dumps(str(out))}\n"
        "ft.eval_source.value = 'split'\nft.eval_split.value = 0.25\nft.eval_every.value = 2\nft",
        "gen = nvkit.GeneratePanel()\ngen.prompt.value = 'NVIDIA GPUs are'\ngen.max_new_tokens.value = 16\ngen",
    ]
    write_notebook(lab.root_dir, "finetune_loop.ipynb", cells)
    page.set_viewport_size({"width": 1400, "height": 1800})
    open_and_run_notebook(page, lab, "finetune_loop.ipynb")
    assert not cell_errors(page), cell_errors(page)
    notebook_width(page, 1000)
    # no adapter yet: no compare switch
    assert not page.locator(f"{GEN} .nvkit-generate-compare").is_visible()

    # Preview: the rows as the model will see them, the loss-carrying tokens marked
    page.locator("button.nvkit-ft-preview-btn").click()
    _wait_text(page, ".nvkit-ft-preview", " per epoch", 60_000)
    assert page.locator(".nvkit-ft-preview mark").count() >= 5
    assert "Which GPU holds shard 0?" in page.locator(".nvkit-ft-preview").inner_text()

    # a short run with held-out evaluation: the eval curve is drawn at steps 0, 2, 4, 6
    page.locator("button.nvkit-ft-start").click()
    _wait_text(page, ".nvkit-ft-status", "Done.", 300_000)
    page.wait_for_function(f"() => {{ const x = ({EVAL_STEPS})(); return !!x && x.length === 4; }}",
                           timeout=60_000, polling=250)
    assert page.evaluate(EVAL_STEPS) == [0, 2, 4, 6]
    summary = page.locator(".nvkit-ft-summary").inner_text()
    assert "eval loss" in summary and "before →" in summary
    assert "compile" in page.locator(".nvkit-ft-status").inner_text()

    # Compare with base: the switch appeared with the run's adapter
    switch = page.locator(f"{GEN} .nvkit-generate-compare input[type=checkbox]")
    switch.wait_for(state="visible", timeout=30_000)
    switch.check()
    page.locator(f"{GEN} button.nvkit-generate-button").click()
    _wait_text(page, f"{GEN} .nvkit-generate-stats", "tuned", 120_000)
    assert page.locator(f"{GEN} .nvkit-compare-base").count() == 1
    assert page.locator(f"{GEN} .nvkit-compare-tuned").count() == 1
    assert "base (adapter off)" in page.locator(f"{GEN} .nvkit-generate-output").inner_text()

    # Export into the suggested folder
    assert page.locator(".nvkit-ft-export-dir input").input_value() == str(out / "export")
    page.locator("button.nvkit-ft-export").click()
    _wait_text(page, ".nvkit-ft-export-status", "Exported the merged model", 300_000)
    assert (out / "export" / "config.json").is_file() and (out / "export" / "README.md").is_file()

    problems = {}
    for dark in (False, True):
        set_theme(page, dark)
        theme = "dark" if dark else "light"
        for sel, name in ((FT, "finetune-panel-loop"), (GEN, "generate-panel-compare")):
            found = layout_problems(page, sel)
            if found:
                problems[f"{name} ({theme})"] = found
            element_screenshot(page.locator(sel), f"{name}-{theme}")
    set_theme(page, False)
    assert not problems, problems
    assert console_problems(messages) == []
