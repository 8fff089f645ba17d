"""``nvkit.panel()``: the whole kit in one widget — GPUs | Model | Generate | Fine-tune | Memory.

Each tab is the stand-alone panel of that name; this module only arranges them, so anything a
tab does is also available on its own (``nvkit.GPUSelector()``, ``nvkit.LoadPanel()``, ...).
"""

from __future__ import annotations

import ipywidgets as w

TABS = (
    ("GPUs", "nvkit.ui.gpu_selector", "GPUSelector"),
    ("Model", "nvkit.ui.load_panel", "LoadPanel"),
    ("Generate", "nvkit.ui.generate_panel", "GeneratePanel"),
    ("Fine-tune", "nvkit.ui.finetune_panel", "FinetunePanel"),
    ("Memory", "nvkit.ui.memory_chart", "MemoryChart"),
)


class Panel(w.VBox):
    """The app: one tab per step of the guide. ``.parts`` maps tab title → panel."""

    def __init__(self, **kwargs):
        import importlib

        self.parts = {}
        for title, module, cls in TABS:
            self.parts[title] = getattr(importlib.import_module(module), cls)()
        self.tabs = w.Tab(children=list(self.parts.values()), titles=list(self.parts))
        self.tabs.add_class("nvkit-tabs")
        header = w.HTML("<b>nvkit</b> · Transformers on NVIDIA GPUs — choose GPUs, load a model, generate, "
                        "fine-tune and watch memory. Each tab's <code>.code()</code> is the Python it runs.")
        super().__init__(children=[header, self.tabs], **kwargs)
        self.add_class("nvkit-panel")

    def code(self) -> str:
        """The Python for everything set up in the tabs, in tab order."""
        blocks = []
        for title, part in self.parts.items():
            src = part.code().strip()
            if src:
                blocks.append(f"# {title}\n{src}")
        return "\n\n".join(blocks) + "\n"

    def close(self):
        for part in self.parts.values():
            part.close()
        super().close()


def panel() -> Panel:
    """The whole nvkit app as a widget: GPUs | Model | Generate | Fine-tune | Memory."""
    return Panel()
