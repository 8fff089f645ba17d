"""nvkit.panel() without a browser: only the GPUs tab is built up front (no torch, transformers or
plotly imported), each other tab on first opening; .parts and .code() work; the Memory tab is the
one live chart. (tests/ui measures the time to appear in a real browser.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit
from nvkit.ui.app import TABS, Panel
from nvkit.ui.memory_chart import MemoryChart


def test_a_fresh_panel_imports_nothing_heavy(tmp_path):
    code = ("import json, sys, time\nt = time.perf_counter()\nimport nvkit\np = nvkit.panel()\n"
            "print(json.dumps({'s': time.perf_counter() - t, 'heavy': [m for m in ('torch', 'transformers', "
            "'plotly.graph_objs._figurewidget', 'pandas', 'anywidget') if m in sys.modules],"
            " 'built': list(p.parts.built())}))")
    env = dict(os.environ, NVKIT_FAKE_GPUS="4")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["heavy"] == [] and r["built"] == ["GPUs"], r


def test_tabs_are_built_when_opened(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")
    p = Panel()
    assert list(p.parts.built()) == ["GPUs"]
    assert [p.tabs.get_title(i) for i in range(len(TABS))] == [t for t, _, _ in TABS]
    p.tabs.selected_index = 2                      # a click on "Generate"
    assert "Generate" in p.parts.built()
    gen = p.parts.built()["Generate"]
    assert p.tabs.children[2].children == (gen,)
    assert p.parts["Generate"] is gen              # built once
    mem = p.parts["Memory"]                        # asking builds it too
    assert isinstance(mem, MemoryChart) and mem.x == "time"
    code = p.code()
    assert code.index("# GPUs") < code.index("# Generate") < code.index("# Memory")
    assert "# Model" not in code                    # never opened, nothing set up there
    p.close()
    assert not mem.running


def test_each_tab_has_show_code():
    p = nvkit.panel()
    try:
        for title in ("GPUs", "Model", "Generate", "Fine-tune", "Launch", "Memory"):
            part = p.parts[title]
            part.code_view.toggle.value = True
            assert "import nvkit" in part.code_view.html.value, title
    finally:
        p.close()
