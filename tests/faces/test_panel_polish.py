"""Small things a new user sees in the panels: GPU rows whose columns line up, Stop buttons that
look disabled while they are, a labelled data box on the Launch tab, and a Model tab that says
so when the model is unloaded from a cell."""

import importlib
import json

import pytest

import nvkit
from tests import demo_model

G = importlib.import_module("nvkit.hardware.inventory")


@pytest.fixture
def unloaded():
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()
    yield
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()


def test_gpu_rows_share_fixed_column_widths(monkeypatch, tmp_path):
    # two GPUs whose names, architectures and readings differ in length
    monkeypatch.setenv("NVKIT_FAKE_GPUS", json.dumps([
        {"name": "NVIDIA H200", "utilization": 3},
        {"name": "NVIDIA GeForce RTX 4090", "capability": "8.9", "utilization": 100, "memory_total": 24 * 2**30}]))
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "cache"))
    G._fake_sources.clear()
    from nvkit.ui import gpu_selector
    sel = gpu_selector.GPUSelector(refresh_interval=None)
    try:
        rows = [r.box.children for r in sel._rows.values()]
        assert len(rows) == 2 and len(rows[0]) == len(rows[1])
        for column in zip(*rows):
            widths = {c.layout.width for c in column}
            # one width per column, set, and not one that follows the content
            assert len(widths) == 1 and None not in widths and "auto" not in widths, widths
        util = [r.util.value for r in sel._rows.values()]
        assert util == ["util 3%", "util 100%"]
        # the text never wraps onto a second line, and digits have one width
        css = gpu_selector.ROW_CSS
        assert "white-space: nowrap" in css and "tabular-nums" in css
        assert any(css in getattr(c, "value", "") for c in sel.children)
    finally:
        sel.close()
        G._fake_sources.clear()


def test_a_stop_button_is_red_only_while_it_can_be_clicked():
    import ipywidgets as w
    from nvkit.ui.finetune_panel import FinetunePanel
    from nvkit.ui.launch_panel import LaunchPanel
    for panel in (FinetunePanel(), LaunchPanel()):
        try:
            assert panel.stop_btn.disabled and panel.stop_btn.button_style == ""
            panel.stop_btn.disabled = False   # what a started run does
            assert panel.stop_btn.button_style == "danger"
            panel.stop_btn.disabled = True    # and its end
            assert panel.stop_btn.button_style == ""
        finally:
            panel.close()
    from nvkit.ui.common import danger_while_enabled
    b = danger_while_enabled(w.Button(description="Stop all", disabled=False))
    assert b.button_style == "danger"


def test_the_launch_tab_data_box_has_a_label():
    from nvkit.ui.launch_panel import LaunchPanel
    p = LaunchPanel()
    try:
        assert p.examples.description == "training data" and "one example per line" in p.examples.tooltip
    finally:
        p.close()


def test_the_model_tab_follows_an_unload_from_a_cell(unloaded):
    from nvkit.ui.load_panel import LoadPanel
    panel = LoadPanel(model=demo_model.path(), device="cpu")
    s = nvkit.load(demo_model.path(), device_map="cpu")
    assert "was loaded (outside this panel)" in panel.status.value and panel.summary.value
    s.unload()    # as tutorial 00 does
    assert panel.summary.value == ""
    assert "was unloaded; no model is loaded" in panel.status.value and "was loaded" not in panel.status.value
    # the panel's own Unload still says what it freed
    s = nvkit.load(demo_model.path(), device_map="cpu")
    panel.unload()
    assert panel.status.value.startswith("unloaded ") and "RSS" in panel.status.value
