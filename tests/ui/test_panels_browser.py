"""``nvkit.panel()`` in a real JupyterLab + Chromium, as a newcomer meets it: it appears within 3 s
in a fresh kernel; a model loaded in another cell shows up in the Model, Generate and Fine-tune
tabs; every tab looks finished in Light and Dark at a 1000-px-wide notebook (nothing wider than
its container, no label cut off, every dropdown with a value); the idle kernel stays under 5 % of
a core with the panel shown, on the GPUs tab and on the live Memory tab (20-s windows rather than
the issue's 60 s: a chart redraws once a second, so 20 s holds 20 redraws), and a chart in a tab
nobody looks at is not redrawn. Screenshots of each tab go to SCREENSHOTS (tests/ui/conftest.py):
panel-<tab>-<theme>.png."""

from __future__ import annotations

import time

import psutil

from tests.ui.conftest import open_notebook, wait_kernel_idle, write_notebook
from tests.ui.helpers import (console_problems, element_screenshot, kernel_stdout, layout_problems,
                              log_console_entries, notebook_width, run_cell, set_theme, wait_cell)

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden) .nvkit-panel"
SHOWN_TAB = PANEL + " .widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)"
TABS = ["GPUs", "Model", "Generate", "Fine-tune", "Launch", "Memory"]
APPEAR_S = 3.0        # the bound for a fresh kernel on this machine
IDLE_CPU = 0.05       # share of one core the kernel may use while the panel sits idle
IDLE_WINDOW_S = 20.0  # long enough for 20 GPU-row refreshes and 20 chart redraws


def _open_tab(page, title: str) -> None:
    page.locator(f"{PANEL} .lm-TabBar-tab", has_text=title).first.click()
    page.wait_for_function(
        """([sel, t]) => { const p = document.querySelector(sel);
            const cur = p && p.querySelector('.lm-TabBar-tab.lm-mod-current');
            if (!cur || !cur.innerText.includes(t)) return false;
            const body = p.querySelector('.widget-tab-contents > .lm-Widget:not(.lm-mod-hidden)');
            return !!(body && body.querySelector('.nvkit-panel-root')); }""",
        arg=[PANEL, title], timeout=60_000, polling=200)


def _kernel_cpu(pid: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    c0 = proc.cpu_times()
    time.sleep(seconds)
    c1 = proc.cpu_times()
    return (c1.user + c1.system - c0.user - c0.system) / seconds


def test_panel_appears_within_3_s_and_idles_cheaply(page, lab):
    messages = []
    page.on("console", lambda m: messages.append((m.type, m.text[:300])))
    write_notebook(lab.root_dir, "panel_fresh.ipynb", ["import nvkit\np = nvkit.panel()\np"])
    open_notebook(page, lab, "panel_fresh.ipynb")       # a fresh kernel, nothing imported yet
    t0 = time.monotonic()
    run_cell(page, 0)
    page.locator(f"{PANEL} .nvkit-gpu-row").first.wait_for(state="visible", timeout=60_000)
    appeared = time.monotonic() - t0
    print(f"panel visible {appeared:.2f} s after the cell started")
    assert appeared < APPEAR_S, f"nvkit.panel() took {appeared:.2f} s to appear (bound {APPEAR_S} s)"
    wait_kernel_idle(page)
    pid = int(kernel_stdout(page, "import os; print(os.getpid())").strip())
    idle = _kernel_cpu(pid, IDLE_WINDOW_S)
    print(f"kernel CPU with the GPUs tab shown: {idle:.1%}")
    assert idle < IDLE_CPU, f"kernel used {idle:.1%} of a core idle with the panel shown"
    assert log_console_entries(page) == []
    assert console_problems(messages) == []


def test_tabs_follow_the_session_and_look_finished(page, lab):
    messages = []
    page.on("console", lambda m: messages.append((m.type, m.text[:300])))
    write_notebook(lab.root_dir, "panel_tabs.ipynb", [
        "import nvkit\np = nvkit.panel()\np",
        # another cell, as a user would: the tabs must notice
        "s = nvkit.load('demo', device_map='cpu')\nprint(s.generate('NVIDIA GPUs are', max_new_tokens=12))",
        # every control of the fine-tune loop shown: the preview, held-out evaluation (its curve),
        # afterwards the summary, Resume/Export and the Generate tab's compare switch
        "ft = p.parts['Fine-tune']\nft.steps.value = 3\nft.batch.value = 2\nft.seq_len.value = 64\n"
        "ft.eval_source.value = 'split'\nft.eval_split.value = 0.34\nft.eval_every.value = 1\nawait ft.preview()\n"
        f"ft.output_dir.value = {str(lab.root_dir / 'panel-run')!r}\nrun = ft.start()\nawait run",
    ])
    page.set_viewport_size({"width": 1400, "height": 2300})  # tall enough for the tallest tab's screenshot
    open_notebook(page, lab, "panel_tabs.ipynb")
    notebook_width(page, 1000)
    run_cell(page, 0)
    page.locator(f"{PANEL} .nvkit-gpu-row").first.wait_for(timeout=60_000)
    wait_cell(page, 0)
    _open_tab(page, "Fine-tune")
    estimate = page.locator(f"{PANEL} .nvkit-ft-estimate")
    assert "Load a model first" in estimate.inner_text()
    run_cell(page, 1)
    wait_cell(page, 1, timeout_ms=180_000)
    page.wait_for_function(
        "(sel) => { const e = document.querySelector(sel + ' .nvkit-ft-estimate');"
        " return e && e.innerText.includes('Estimated peak'); }", arg=PANEL, timeout=30_000, polling=200)
    _open_tab(page, "Generate")
    assert "demo" in page.locator(f"{PANEL} .nvkit-generate-model").inner_text()
    _open_tab(page, "Model")
    page.wait_for_function(
        "(sel) => { const e = document.querySelector(sel + ' .nvkit-load-summary');"
        " return e && e.innerText.includes('weights'); }", arg=PANEL, timeout=30_000, polling=200)
    page.wait_for_function(  # the default state has a valid estimate (dtype 'auto' resolved)
        "(sel) => { const e = document.querySelector(sel + ' .nvkit-load-estimate');"
        " return e && e.innerText.includes('estimated before loading'); }", arg=PANEL, timeout=60_000, polling=200)
    run_cell(page, 2)
    wait_cell(page, 2, timeout_ms=300_000)
    # Generate in chat mode from the tab: a transcript, wrapped at word boundaries
    _open_tab(page, "Generate")
    page.locator(f"{PANEL} .nvkit-generate-chat input[type=checkbox]").check()
    page.locator(f"{PANEL} .nvkit-generate-prompt textarea").fill(
        "Which GPUs do the nvkit tutorials use, and what does CUDA_VISIBLE_DEVICES=2,0 do to cuda:0?")
    page.locator(f"{PANEL} button.nvkit-generate-button").click()
    page.wait_for_function("(sel) => { const e = document.querySelector(sel + ' .nvkit-generate-stats');"
                           " return e && e.innerText.includes('tok/s'); }", arg=PANEL, timeout=120_000, polling=200)
    turns = page.locator(f"{PANEL} .nvkit-generate-output .nvkit-turn")
    assert turns.count() == 2 and "CUDA_VISIBLE_DEVICES" in turns.nth(0).inner_text()
    assert page.evaluate("(sel) => { const st = getComputedStyle(document.querySelector(sel + ' .nvkit-turn'));"
                         " return [st.whiteSpace, st.wordBreak, st.overflowWrap]; }", PANEL) == \
        ["pre-wrap", "normal", "break-word"]

    problems = {}
    for dark in (False, True):
        set_theme(page, dark)
        theme = "dark" if dark else "light"
        for title in TABS:
            _open_tab(page, title)
            if title == "Memory":
                page.locator(f"{SHOWN_TAB} .js-plotly-plot .main-svg").first.wait_for(timeout=180_000)
            if title in ("Fine-tune", "Memory"):
                time.sleep(1.5)  # the chart's first redraw
            found = layout_problems(page, PANEL)
            if found:
                problems[f"{title} ({theme})"] = found
            element_screenshot(page.locator(PANEL), f"panel-{title.lower()}-{theme}")
    set_theme(page, False)
    assert not problems, problems

    # the Memory tab shown, the kernel idle: the chart is live and cheap; in another tab it is
    # not redrawn at all
    _open_tab(page, "Memory")
    wait_kernel_idle(page)
    pid = int(kernel_stdout(page, "import os; print(os.getpid())").strip())
    redraws = "print(p.parts['Memory'].updates)"
    n0 = int(kernel_stdout(page, redraws))
    idle = _kernel_cpu(pid, IDLE_WINDOW_S)
    print(f"kernel CPU with the Memory tab shown: {idle:.1%}")
    assert idle < IDLE_CPU, f"kernel used {idle:.1%} of a core idle with the memory chart shown"
    assert int(kernel_stdout(page, redraws)) > n0 + IDLE_WINDOW_S / 3   # it was live meanwhile
    _open_tab(page, "GPUs")
    time.sleep(1.5)
    n1 = int(kernel_stdout(page, redraws))
    time.sleep(4)
    assert int(kernel_stdout(page, redraws)) == n1
    assert log_console_entries(page) == []
    assert console_problems(messages) == []
