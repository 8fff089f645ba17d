"""What the README tells a new user holds: the panel's tabs in their order, and the fake inventory's
forms, with its example file and the cell that puts a kernel on a fake GPU (so that the sidebar's
per-kernel view shows without a GPU)."""

import os
import re
import shutil
from pathlib import Path

from nvkit.hardware import inventory

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
GiB = 2**30


def test_the_tour_names_every_tab_in_order():
    from nvkit.ui.app import TABS
    line = next(ln for ln in README.splitlines() if ln.startswith("nvkit.panel()"))
    assert " | ".join(t for t, _, _ in TABS) in line, line
    for title, _, _ in TABS:                       # and each tab has its bullet in the tour
        assert f"- **{title}** —" in README, title


def test_the_fake_inventory_forms(monkeypatch, tmp_path):
    example = REPO / "docs" / "fake-gpus.json"
    assert "(docs/fake-gpus.json)" in README
    copy = tmp_path / "gpus.json"
    shutil.copy(example, copy)
    for shown, spec, count in (("4", "4", 4), ("/abs/path/gpus.json", str(copy), 2),
                               ("@/abs/path/gpus.json", f"@{copy}", 2)):
        assert f"`NVKIT_FAKE_GPUS={shown}`" in README, shown
        monkeypatch.setenv("NVKIT_FAKE_GPUS", spec)
        assert len(inventory.gpus()) == count
    # the example's second GPU carries a process that is no kernel here
    monkeypatch.setenv("NVKIT_FAKE_GPUS", str(copy))
    assert [p.pid for p in inventory.gpus()[1].processes] == [4000001]


def test_the_readme_cell_puts_this_process_on_a_fake_gpu(monkeypatch, tmp_path):
    copy = tmp_path / "gpus.json"
    shutil.copy(REPO / "docs" / "fake-gpus.json", copy)
    monkeypatch.setenv("NVKIT_FAKE_GPUS", f"@{copy}")
    assert inventory.fake_gpus_of() == []
    cells = re.findall(r"```python\n(.*?)```", README, re.S)
    cell = next(c for c in cells if 'os.environ["NVKIT_FAKE_GPUS"]' in c)
    exec(compile(cell, "README.md", "exec"), {})
    mine = [g.index for g in inventory.gpus() for p in g.processes if p.pid == os.getpid()]
    assert mine == [0]
    assert [g.index for g in inventory.fake_gpus_of()] == [0]
    used = next(p.used_memory for p in inventory.gpus()[0].processes if p.pid == os.getpid())
    assert used == 12 * GiB and "12 GiB" in cell
