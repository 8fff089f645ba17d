"""Helpers for the panel and chart browser tests: run code in the notebook's kernel, run one cell
without waiting for it, read the Log Console, switch the theme, check a panel's layout, and save
element screenshots where ``screenshot_path`` says (tests/ui/conftest.py)."""

from __future__ import annotations

import time

from tests.ui.conftest import screenshot_path

# Run code in the notebook's own kernel and return its stdout (not through a cell, so the notebook
# stays as the user sees it).
KERNEL_STDOUT = """async (code) => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    let out = '';
    const future = kernel.requestExecute({code, store_history: false});
    future.onIOPub = (msg) => {
        if (msg.header.msg_type === 'stream') out += msg.content.text;
        if (msg.header.msg_type === 'error') out += 'ERROR ' + msg.content.ename + ': ' + msg.content.evalue;
    };
    await future.done;
    return out;
}"""

RUN_CELL = """(i) => { const nb = window.jupyterapp.shell.currentWidget.content;
    nb.activeCellIndex = i;
    // not returned: the command's promise settles only when the cell ends
    window.jupyterapp.commands.execute('notebook:run-cell'); return true; }"""

CELL_DONE = """(i) => { const nb = window.jupyterapp.shell.currentWidget.content;
    const c = nb.widgets[i];
    const p = c && c.node.querySelector('.jp-InputArea-prompt');
    return !!(p && /\\[\\d+\\]/.test(p.textContent)); }"""

# Layout problems inside the panel matched by a selector: an element sticking out of the panel
# (or the panel out of its output area), text cut off by its box (ellipsis, clipped overflow),
# a dropdown showing no value or a value wider than itself. plotly's own SVG is left out.
LAYOUT_PROBLEMS = r"""(sel) => {
    const root = document.querySelector(sel);
    if (!root) return ['no element ' + sel];
    const out = [];
    const desc = el => {
        const cls = [...el.classList].filter(c => c.startsWith('nvkit') || c.startsWith('widget')).join('.');
        return el.tagName.toLowerCase() + (cls ? '.' + cls : '') + ' "' + (el.innerText || el.value || '').trim().slice(0, 40) + '"';
    };
    const area = root.closest('.jp-OutputArea-output') || root.parentElement;
    const ar = area.getBoundingClientRect(), rr = root.getBoundingClientRect();
    if (rr.right > ar.right + 1) out.push(`panel wider than its output area: ${rr.right} > ${ar.right}`);
    const shown = el => { for (let e = el; e && e !== root; e = e.parentElement) {
        const st = getComputedStyle(e); if (st.display === 'none' || st.visibility === 'hidden') return false; }
        return true; };
    for (const el of root.querySelectorAll('*')) {
        if (el.closest('.js-plotly-plot') || el.closest('details:not([open])') && el.tagName !== 'SUMMARY'
            && !el.closest('summary')) continue;
        if (!shown(el)) continue;
        const r = el.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;
        if (r.right > rr.right + 1 || r.left < rr.left - 1)
            out.push(`wider than the panel: ${desc(el)} (${Math.round(r.left)}..${Math.round(r.right)} vs ${Math.round(rr.left)}..${Math.round(rr.right)})`);
        const st = getComputedStyle(el);
        if (el.tagName !== 'TEXTAREA' && el.tagName !== 'INPUT' && el.clientWidth > 0
            && el.scrollWidth > el.clientWidth + 1 && ['hidden', 'clip', 'auto', 'scroll'].includes(st.overflowX))
            out.push(`cut off: ${desc(el)} (${el.scrollWidth} > ${el.clientWidth})`);
    }
    const ctx = document.createElement('canvas').getContext('2d');
    for (const s of root.querySelectorAll('select')) {
        if (!shown(s)) continue;
        if (s.selectedIndex < 0 || !s.options[s.selectedIndex] || !s.options[s.selectedIndex].text.trim()) {
            out.push(`dropdown without a value: ${desc(s.parentElement)}`); continue; }
        const st = getComputedStyle(s);
        ctx.font = `${st.fontWeight} ${st.fontSize} ${st.fontFamily}`;
        const need = ctx.measureText(s.options[s.selectedIndex].text).width + 24;  // + the arrow
        if (need > s.clientWidth + 1) out.push(`dropdown value cut off: "${s.options[s.selectedIndex].text}" (${Math.round(need)} > ${s.clientWidth})`);
    }
    return out;
}"""


def kernel_stdout(page, code: str) -> str:
    return page.evaluate(KERNEL_STDOUT, code)


def run_cell(page, i: int) -> None:
    """Start cell ``i`` and return at once."""
    page.evaluate(RUN_CELL, i)


def wait_cell(page, i: int, timeout_ms: int = 120_000) -> None:
    page.wait_for_function(CELL_DONE, arg=i, timeout=timeout_ms, polling=200)


def log_console_entries(page) -> list[str]:
    """The texts of the Log Console's entries for the current notebook (opens it)."""
    page.evaluate("() => window.jupyterapp.commands.execute('logconsole:open', {insertMode: 'split-bottom'})")
    page.wait_for_selector(".jp-LogConsole", timeout=10_000)
    time.sleep(0.5)
    return page.evaluate("() => [...document.querySelectorAll('.jp-LogConsole .jp-OutputArea-child')]"
                         ".map(e => e.innerText.slice(0, 2000))")


def set_theme(page, dark: bool) -> None:
    name = "JupyterLab Dark" if dark else "JupyterLab Light"
    page.evaluate("(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", name)
    page.wait_for_function("(d) => document.body.dataset.jpThemeLight === (d ? 'false' : 'true')",
                           arg=dark, timeout=20_000)
    time.sleep(0.5)  # the theme's stylesheet applies after the attribute flips


def notebook_width(page, width: int) -> None:
    """Resize the window so that the notebook is ``width`` px wide."""
    now = page.evaluate("() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)')"
                        ".getBoundingClientRect().width")
    vp = page.viewport_size
    page.set_viewport_size({"width": int(vp["width"] + width - now), "height": vp["height"]})
    page.wait_for_function("(w) => Math.abs(document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)')"
                           ".getBoundingClientRect().width - w) < 2", arg=width, timeout=10_000)


def layout_problems(page, selector: str) -> list[str]:
    return page.evaluate(LAYOUT_PROBLEMS, selector)


def element_screenshot(locator, name: str):
    path = screenshot_path(name)
    locator.screenshot(path=str(path))
    return path


def console_problems(messages: list) -> list:
    """Browser console messages that are errors or warnings."""
    return [m for m in messages if m[0] in ("error", "warning")]
