"""Pieces every panel uses: following nvkit's events without keeping a closed panel alive, the
stylesheet that makes panels follow JupyterLab's theme, the "Show code" toggle, and one-line
reasons with the full text a click away.
"""

from __future__ import annotations

import asyncio
import html
import re
import threading
import weakref

import ipywidgets as w

from .. import events
from ..state import STATE

# --- events, held weakly -----------------------------------------------------------------------------

_listeners: list = []            # weakref.WeakMethod of panel methods
_listeners_lock = threading.Lock()
_hooked = False


def _dispatch(ev) -> None:
    with _listeners_lock:
        alive = [(r, r()) for r in _listeners]
        _listeners[:] = [r for r, fn in alive if fn is not None]
        fns = [fn for _, fn in alive if fn is not None]
    for fn in fns:
        try:
            fn(ev)
        except Exception:  # a closed panel must not break the work that recorded the event
            pass


def on_events(method) -> None:
    """Call the bound ``method(event)`` for every nvkit event (load, unload, generate, training
    steps, ...) for as long as its object lives; it runs in the thread that recorded the event,
    so it must only set widget values or flags."""
    global _hooked
    with _listeners_lock:
        _listeners.append(weakref.WeakMethod(method))
        if not _hooked:
            events.subscribe(_dispatch)
            _hooked = True


def off_events(method) -> None:
    with _listeners_lock:
        _listeners[:] = [r for r in _listeners if r() is not None and r() != method]


def current_session():
    """The loaded session, or None (a session whose model was unloaded counts as none). Cheap: it
    reads the kernel state, so no panel imports torch just to ask."""
    s = STATE.session
    return s if s is not None and getattr(s, "model", None) is not None else None


def soon(fn) -> None:
    """Run ``fn()`` in the main thread once the kernel is free (after the running cell or widget
    message), or now when there is no event loop (a script). For work that imports torch or
    transformers: importing them in a worker while a cell imports them too fails half-way
    ("cannot import name ... from transformers")."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None or threading.current_thread() is not threading.main_thread():
        fn()
        return
    loop.call_soon(fn)


# --- looks -------------------------------------------------------------------------------------------

# Colours come from JupyterLab's theme variables, so every panel follows Light and Dark.
PANEL_CSS = """
.nvkit-panel-root { max-width: 100%; box-sizing: border-box; }
.nvkit-panel-root .nvkit-muted { color: var(--jp-ui-font-color2); font-size: 90%; }
.nvkit-panel-root .nvkit-warn { color: var(--jp-warn-color0, #a60); }
.nvkit-panel-root .nvkit-error { color: var(--jp-error-color1, #c00); }
.nvkit-panel-root .nvkit-ok { color: var(--jp-success-color1, green); }
.nvkit-panel-root details.nvkit-why { display: inline; color: var(--jp-ui-font-color2); font-size: 90%; }
.nvkit-panel-root details.nvkit-why summary { display: inline; cursor: pointer; }
.nvkit-panel-root details.nvkit-why[open] { display: block; white-space: normal; overflow-wrap: anywhere; }
.nvkit-panel-root .nvkit-code pre { margin: 2px 0; padding: 6px; white-space: pre-wrap; overflow-wrap: anywhere;
  background: var(--jp-layout-color2); color: var(--jp-content-font-color1);
  font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); }
.nvkit-panel-root .nvkit-text { margin: 0; white-space: pre-wrap; word-break: normal; overflow-wrap: break-word;
  font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size); color: var(--jp-content-font-color1); }
.nvkit-panel-root .nvkit-turn { margin: 2px 0 6px 0; padding: 4px 8px; border-radius: 4px; white-space: pre-wrap;
  word-break: normal; overflow-wrap: break-word; color: var(--jp-content-font-color1); }
.nvkit-panel-root .nvkit-turn-user { background: var(--jp-layout-color2); margin-left: 15%; }
.nvkit-panel-root .nvkit-turn-assistant { background: var(--jp-layout-color1);
  border: 1px solid var(--jp-border-color2); margin-right: 15%; }
.nvkit-panel-root .nvkit-turn-system { color: var(--jp-ui-font-color2); font-style: italic; }
.nvkit-panel-root .nvkit-role { font-size: 80%; color: var(--jp-ui-font-color2); display: block; }
.nvkit-panel-root .widget-html-content { overflow-wrap: break-word; }
.nvkit-panel-root .widget-hbox.nvkit-wrap { flex-wrap: wrap; }
.nvkit-panel-root .nvkit-table td { padding: 1px 8px 1px 0; }
.nvkit-panel-root .widget-toggle-button, .nvkit-panel-root .widget-button { width: auto; min-width: 0; }
"""


def style() -> w.HTML:
    """A hidden widget carrying the panels' stylesheet (an HTML widget's <style> applies to the
    page, and each stand-alone panel brings its own copy)."""
    h = w.HTML(f"<style>{PANEL_CSS}</style>", layout=w.Layout(height="0px", margin="0", padding="0"))
    h.add_class("nvkit-style")
    return h


def root(box: w.Box) -> None:
    box.add_class("nvkit-panel-root")


def wrap_row(children, **layout) -> w.HBox:
    """An HBox whose children flow onto the next line rather than past the panel's edge."""
    row = w.HBox(list(children), layout=w.Layout(flex_flow="row wrap", align_items="center", **layout))
    row.add_class("nvkit-wrap")
    return row


def first_sentence(text: str, limit: int = 70) -> str:
    """The start of ``text``, up to its first clause, cut at a word before ``limit`` characters."""
    text = " ".join(str(text).split())
    head = re.split(r"(?<=[.;:])\s|\s\(", text, maxsplit=1)[0].rstrip(".;:")
    if len(head) > limit:
        head = head[:limit].rsplit(" ", 1)[0] + " …"
    return head


def why_html(text: str, limit: int = 70, prefix: str = "") -> str:
    """One line of reason (``prefix`` + its first clause); when there is more, the whole text
    folds out behind "why" (and is the tooltip)."""
    short = prefix + first_sentence(text, limit)
    full = prefix + " ".join(str(text).split())
    esc_full = html.escape(full, quote=True)
    if short.rstrip(" …") == full.rstrip("."):
        return f"<span class='nvkit-muted' title='{esc_full}'>{html.escape(short)}</span>"
    return (f"<details class='nvkit-why' title='{esc_full}'><summary>{html.escape(short)} "
            f"<u>why</u></summary>{html.escape(full)}</details>")


class CodeToggle(w.VBox):
    """A "Show code" toggle and, when on, the panel's ``.code()`` (refreshed as values change)."""

    def __init__(self, source):
        self._source = source
        self.toggle = w.ToggleButton(value=False, description="Show code", icon="code",
                                     tooltip="the Python this tab runs, to copy into a cell",
                                     layout=w.Layout(width="auto", align_self="flex-start"))
        self.toggle.add_class("nvkit-show-code")
        self.html = w.HTML("", layout=w.Layout(display="none", width="100%"))
        self.html.add_class("nvkit-code")
        self.toggle.observe(lambda _ch: self.refresh(), "value")
        super().__init__([self.toggle, self.html], layout=w.Layout(width="100%"))

    def refresh(self) -> None:
        if not self.toggle.value:
            if self.html.layout.display != "none":
                self.html.layout.display = "none"
            return
        try:
            src = self._source()
        except Exception as e:  # the code of a half-filled form: say what is missing
            src = f"# {type(e).__name__}: {e}"
        value = f"<pre>{html.escape(src)}</pre>"
        if self.html.value != value:
            self.html.value = value
        self.html.layout.display = None


def danger_while_enabled(button: w.Button) -> w.Button:
    """A Stop button is red ("danger") only while it can be clicked: disabled, a red button still
    reads as an action waiting, so it takes the plain style of the other disabled buttons."""

    def follow(_change=None) -> None:
        wanted = "" if button.disabled else "danger"
        if button.button_style != wanted:
            button.button_style = wanted

    button.observe(follow, "disabled")
    follow()
    return button


def observe_values(widgets, fn) -> None:
    for x in widgets:
        x.observe(lambda _ch: fn(), "value")
