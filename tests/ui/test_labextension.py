"""The nvkit JupyterLab extension in a real JupyterLab (base URL /nvkit-test/, 4 fake GPUs) and a
real headless Chromium: status bar, sidebar, launcher tutorials, notebook commands."""

from __future__ import annotations

import json
import re

from tests.ui.conftest import cell_errors, open_notebook, screenshot, write_notebook

STATUS = "#jp-main-statusbar [data-nvkit=statusbar]"
SIDEBAR = "#nvkit-gpus"


def gib(n: int) -> str:
    v = n / 1024**3
    return f"{v:.0f}" if v >= 1000 else f"{v:.1f}"


def test_status_bar_sidebar_and_launcher(lab, page):
    data = lab.api("nvkit/api/gpus")
    assert data["count"] == 4
    total = gib(sum(g["memory_total"] for g in data["gpus"]))

    # status bar: used / total over the 4 fake GPUs, read through the base-URL'd endpoint
    item = page.locator(STATUS)
    item.wait_for()
    page.wait_for_function(
        "sel => /GiB/.test(document.querySelector(sel)?.textContent || '')", arg=STATUS)
    text = item.inner_text()
    assert re.fullmatch(rf"4 GPUs: [\d.]+ / {re.escape(total)} GiB", text), text
    assert "NVIDIA H200" in item.get_attribute("title")

    # sidebar: one card per GPU with a bar, a history line and its processes
    item.click()
    sidebar = page.locator(SIDEBAR)
    sidebar.wait_for(state="visible")
    cards = sidebar.locator(".nvkit-Gpu")
    cards.nth(3).wait_for()
    assert cards.count() == 4
    for i, g in enumerate(data["gpus"]):
        card = cards.nth(i)
        assert card.locator(".nvkit-Gpu-title").inner_text() == f"GPU {g['index']} · {g['name']}"
        assert f"/ {gib(g['memory_total'])} GiB" in card.locator(".nvkit-Gpu-memory").inner_text()
        width = card.locator(".nvkit-Gpu-barFill").evaluate("e => e.style.width")
        assert width.endswith("%"), width
        assert card.locator(".nvkit-Gpu-history polyline").count() == 1
        assert card.locator(".nvkit-Gpu-processes li").count() >= 1
    for label in ("Insert panel", "Memory monitor", "Restart with selection", "Refresh"):
        assert sidebar.get_by_role("button", name=label).is_visible()

    # launcher: the shipped tutorials, by their first heading
    tutorials = lab.api("nvkit/api/tutorials")["tutorials"]
    assert tutorials, "no tutorials shipped"
    section = page.locator(".jp-Launcher-section", has_text="nvkit tutorials")
    section.wait_for()
    for t in tutorials:
        assert section.locator(".jp-LauncherCard", has_text=t["title"]).count() == 1, t
    screenshot(page, "labextension-sidebar-launcher")

    # a launcher card copies the tutorial into the working directory and opens it ...
    first = tutorials[0]
    section.locator(".jp-LauncherCard", has_text=first["title"]).click()
    page.wait_for_function(
        "name => window.jupyterapp.shell.currentWidget?.context?.path === name", arg=first["name"])
    copied = lab.root_dir / first["name"]
    assert copied.is_file()
    # ... and a second click asks instead of overwriting the user's copy
    nb = json.loads(copied.read_text())
    nb["cells"].insert(0, {"cell_type": "markdown", "id": "mine", "metadata": {},
                           "source": "my notes"})
    copied.write_text(json.dumps(nb))
    page.evaluate("() => window.jupyterapp.commands.execute('launcher:create')")
    page.locator(".jp-Launcher-section", has_text="nvkit tutorials").locator(
        ".jp-LauncherCard", has_text=first["title"]).filter(visible=True).first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert "already copied" in dialog.inner_text()
    dialog.get_by_role("button", name="Cancel").click()
    assert json.loads(copied.read_text())["cells"][0]["source"] == "my notes"


def test_insert_nvkit_panel_renders(lab, page):
    write_notebook(lab.root_dir, "insert-panel.ipynb", [""])
    open_notebook(page, lab, "insert-panel.ipynb")
    page.evaluate("() => window.jupyterapp.commands.execute('nvkit:open-gpus')")
    page.evaluate("() => window.jupyterapp.commands.execute('nvkit:insert-panel')")
    sources = ("() => window.jupyterapp.shell.currentWidget.content.widgets"
               ".map(c => c.model.sharedModel.getSource())")
    try:
        page.wait_for_function(f"() => ({sources})().includes('import nvkit\\nnvkit.panel()')")
    except Exception:
        raise AssertionError(f"no panel cell inserted: {page.evaluate(sources)}") from None
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    # the cell's output is the nvkit app widget (its top widget carries the nvkit-panel class);
    # stop waiting as soon as the panel shows or the cell has finished without it
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            if (w.node.querySelector('.jp-OutputArea-output .nvkit-panel')) return true;
            const k = w.sessionContext.session?.kernel;
            const busy = [...w.node.querySelectorAll('.jp-InputArea-prompt')]
                .some(p => p.textContent.includes('*'));
            return !!k && k.status === 'idle' && !busy
                && w.node.querySelectorAll('.jp-OutputArea-output').length > 0;
        }""", timeout=120_000, polling=250)
    assert panel.locator(".jp-OutputArea-output .nvkit-panel").count() >= 1, \
        f"no nvkit panel rendered; errors: {cell_errors(page)}"
    assert not cell_errors(page), cell_errors(page)
    src = page.evaluate(sources)
    assert src == ["import nvkit\nnvkit.panel()"]      # the empty cell was reused
    page.wait_for_timeout(500)                          # let the widget finish its layout
    screenshot(page, "labextension")


def test_restart_with_gpu_selection(lab, page):
    write_notebook(lab.root_dir, "restart.ipynb", ["x = 1"])
    open_notebook(page, lab, "restart.ipynb")
    page.evaluate("() => { window.jupyterapp.commands.execute('nvkit:restart-with-selection'); }")
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert "GPU selection" in dialog.inner_text()
    dialog.get_by_role("button", name="Restart").click()
    toast = page.locator(".Toastify__toast", has_text="Kernel restarted")
    toast.first.wait_for(timeout=60_000)
    assert "failed" not in toast.first.inner_text()


def test_without_gpus_it_says_why(lab, browser):
    """No GPU or driver: the status bar and the sidebar say so (the answer is stubbed in the
    browser; the server's side of it is tested in tests/server)."""
    reason = "No NVIDIA driver: libnvidia-ml.so.1 not found (is this a GPU machine?)"
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    try:
        page = context.new_page()
        page.route("**/nvkit-test/nvkit/api/gpus*", lambda route: route.fulfill(
            status=200, content_type="application/json",
            body=json.dumps({"gpus": [], "count": 0, "reason": reason})))
        page.goto(f"{lab.url}lab?token={lab.token}&reset", wait_until="domcontentloaded")
        item = page.locator(STATUS)
        item.wait_for()
        page.wait_for_function("sel => document.querySelector(sel)?.textContent === 'No GPU'",
                               arg=STATUS)
        assert reason in item.get_attribute("title")
        item.click()
        empty = page.locator(f"{SIDEBAR} .nvkit-Sidebar-empty")
        empty.wait_for()
        assert empty.inner_text() == reason
        assert page.locator(f"{SIDEBAR} .nvkit-Gpu").count() == 0
        # the commands are registered (palette and notebook toolbar use them)
        for cmd in ("nvkit:insert-panel", "nvkit:restart-with-selection",
                    "nvkit:open-memory-monitor"):
            assert page.evaluate("c => window.jupyterapp.commands.hasCommand(c)", cmd), cmd
    finally:
        context.close()


def test_a_copied_tutorial_shows_its_screenshot(lab, page):
    """Tutorial 09's sidebar screenshot is inside the notebook, so it shows wherever the Launcher
    copied the notebook to (a file next to it would not come along)."""
    (lab.root_dir / "copies").mkdir(exist_ok=True)
    copied = lab.api("nvkit/api/tutorials/09-gpu-memory.ipynb", method="POST", body={"dir": "copies"})
    open_notebook(page, lab, copied["path"])
    # cells far down render only when scrolled to (JupyterLab's windowed notebook)
    page.evaluate("""async () => {
        const nb = window.jupyterapp.shell.currentWidget.content;
        const i = nb.widgets.findIndex(c => (c.model.sharedModel.getSource() || '').includes('data:image/png'));
        nb.activeCellIndex = i;
        await nb.scrollToItem(i);
    }""")
    img = page.locator(".jp-MarkdownCell img[alt^='The NVIDIA GPUs sidebar']")
    img.wait_for(timeout=30_000)
    page.wait_for_function("el => el.complete && el.naturalWidth >= 400", arg=img.element_handle(), timeout=30_000)
