"""``nvkit.panel()``: the whole kit in one widget — GPUs | Model | Generate | Fine-tune | Launch | Memory.

Each tab is the stand-alone panel of that name; this module only arranges them, so anything a
tab does is also available on its own (``nvkit.GPUSelector()``, ``nvkit.LoadPanel()``, ...).

Only the GPUs tab is built when the panel appears (it reads NVML and nothing else); each other
tab is built the first time it is opened, or when ``.parts[title]`` asks for it. So the panel is
on screen in about a second in a fresh kernel, and plotly (a ~5 MB widget bundle per chart),
torch and transformers are imported only when a tab needs them.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping

import ipywidgets as w

from .common import root, style

TABS = (
    ("GPUs", "nvkit.ui.gpu_selector", "GPUSelector"),
    ("Model", "nvkit.ui.load_panel", "LoadPanel"),
    ("Generate", "nvkit.ui.generate_panel", "GeneratePanel"),
    ("Fine-tune", "nvkit.ui.finetune_panel", "FinetunePanel"),
    ("Launch", "nvkit.ui.launch_panel", "LaunchPanel"),
    ("Memory", "nvkit.ui.memory_chart", "MemoryChart"),
)


class _Parts(Mapping):
    """Tab title → panel, building a tab the first time it is asked for."""

    def __init__(self, app: "Panel"):
        self._app = app

    def __getitem__(self, title):
        return self._app._build(title)

    def __iter__(self):
        return iter(t for t, _, _ in TABS)

    def __len__(self):
        return len(TABS)

    def built(self) -> dict:
        """The tabs built so far (nothing is built by asking this)."""
        return dict(self._app._built)


class Panel(w.VBox):
    """The app: one tab per step of the guide. ``.parts`` maps tab title → panel (built on
    first use)."""

    def __init__(self, **kwargs):
        self._built: dict = {}
        self._lock = threading.RLock()
        self._slots = {}
        for title, _, _ in TABS:
            slot = w.VBox([w.HTML(f"<span class='nvkit-muted'>Opening the {title} tab…</span>")])
            slot.add_class("nvkit-tab-slot")
            self._slots[title] = slot
        self.parts = _Parts(self)
        self.tabs = w.Tab(children=list(self._slots.values()), titles=[t for t, _, _ in TABS])
        self.tabs.add_class("nvkit-tabs")
        self._build(TABS[0][0])
        self.tabs.observe(self._on_tab, "selected_index")
        header = w.HTML("<b>nvkit</b> · Transformers on NVIDIA GPUs — choose GPUs, load a model, generate, "
                        "fine-tune (here or over several GPUs) and watch memory. Each tab's <i>Show code</i> is the Python it runs.")
        super().__init__(children=[style(), header, self.tabs], **kwargs)
        self.add_class("nvkit-panel")
        root(self)

    def _on_tab(self, change) -> None:
        i = change["new"]
        if isinstance(i, int) and 0 <= i < len(TABS):
            self._build(TABS[i][0])

    def _build(self, title: str):
        with self._lock:
            part = self._built.get(title)
            if part is not None:
                return part
            spec = next((t for t in TABS if t[0] == title), None)
            if spec is None:
                raise KeyError(title)
            _, module, cls = spec
            try:
                part = getattr(importlib.import_module(module), cls)()
            except Exception as e:  # the tab says what went wrong; the other tabs still work
                import html
                self._slots[title].children = [w.HTML(
                    f"<span class='nvkit-error'>The {title} tab could not be opened: "
                    f"{html.escape(f'{type(e).__name__}: {e}')}</span>")]
                raise
            self._built[title] = part
            self._slots[title].children = [part]
            return part

    def code(self) -> str:
        """The Python for everything set up in the tabs opened so far, in tab order."""
        blocks = []
        for title, _, _ in TABS:
            part = self._built.get(title)
            if part is None:
                continue
            src = part.code().strip()
            if src:
                blocks.append(f"# {title}\n{src}")
        return "\n\n".join(blocks) + "\n"

    def close(self):
        for part in list(self._built.values()):
            part.close()
        super().close()


def panel() -> Panel:
    """The whole nvkit app as a widget: GPUs | Model | Generate | Fine-tune | Launch | Memory."""
    return Panel()
