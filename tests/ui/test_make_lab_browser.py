"""The first minutes after `make lab`, in a JupyterLab started by the Makefile's own command line
(`make -n lab` prints it; the working folder is a temporary one here instead of the checkout's
nvkit-tutorials/) with jupytext's contents manager active, as the test extra installs it, and a
real headless Chromium:

- a Launcher card opens the tutorial in the working folder and it runs; the tracked notebooks/
  stay as they were, and the outputs land in the copy;
- a card clicked in a folder whose jupytext.toml pairs notebooks with src/ copies both files (the
  copy used to crash jupytext there: the cells went in with their source as lists of lines);
- a copy that fails shows a dialog with the reason, and leaves nothing behind: the next click
  copies instead of saying "already copied".
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ui.conftest import (REPO, Lab, lab_options, logged_in_page, run_all_cells, running_lab, screenshot,
                               wait_kernel_idle)

FIRST = "00-start-here.ipynb"
PAIRING = 'formats = "ipynb,src//py:percent"\n'


def tracked_notebooks() -> dict[str, str]:
    """Every file under the checkout's notebooks/ with a hash of its bytes."""
    root = REPO / "notebooks"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".ipynb_checkpoints" not in p.parts}


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


def make_lab_command(workdir: Path, port: int, lab_args: list[str]) -> list[str]:
    """The command `make lab` runs after its setup step, as the Makefile writes it (`make -n`
    prints without running anything)."""
    out = subprocess.run(
        ["make", "-s", "-n", "-C", str(REPO), "lab", f"WORKDIR={workdir}", f"PORT={port}",
         "LAB_ARGS=" + " ".join(shlex.quote(a) for a in lab_args)],
        capture_output=True, text=True, check=True, timeout=60).stdout
    lines = [ln for ln in out.splitlines() if " lab " in f" {ln} " and "setup" not in ln]
    assert len(lines) == 1, out
    return shlex.split(lines[0])


@pytest.fixture(scope="module")
def notebooks_before():
    return tracked_notebooks()


@pytest.fixture(scope="module")
def make_lab(tmp_path_factory, notebooks_before):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    workdir = tmp_path_factory.mktemp("make-lab") / "nvkit-tutorials"

    def command(port, token):
        cmd = make_lab_command(workdir, port, lab_options(token))
        assert cmd[0].endswith("/nvkit") and cmd[1:4] == ["lab", "--dir", str(workdir)], cmd
        return cmd

    # fake_gpus=None: what a user's `make lab` sees, the machine itself
    with running_lab(tmp_path_factory.mktemp("make-lab-home"), workdir, command=command, cwd=REPO,
                     fake_gpus=None, what="make lab's JupyterLab", stop_children=True) as server:
        yield server


@pytest.fixture
def lab_page(browser, make_lab):
    # the suite's one browser: Playwright's sync API runs one instance per process
    with logged_in_page(browser, make_lab) as p:
        yield p


# ---- helpers ------------------------------------------------------------------------------------

def go_to_folder(page, path: str) -> None:
    """Show ``path`` in the file browser (the Launcher copies into the folder shown there)."""
    page.evaluate("async p => { await window.jupyterapp.commands.execute('filebrowser:go-to-path', "
                  "{path: p, dontShowBrowser: true}); }", f"/{path}")
    page.wait_for_function(
        "p => [...document.querySelectorAll('.jp-FileBrowser .jp-BreadCrumbs')]"
        ".some(el => el.textContent.includes(p))", arg=path)


def click_card(page, lab: Lab, name: str) -> None:
    """Click the Launcher card of tutorial ``name`` (a new Launcher, so the card is on screen)."""
    title = next(t["title"] for t in lab.api("nvkit/api/tutorials")["tutorials"] if t["name"] == name)
    # awaited, but not returned: the launcher widget does not serialize
    page.evaluate("async () => { await window.jupyterapp.commands.execute('launcher:create'); }")
    card = page.locator(".jp-Launcher-section", has_text="nvkit tutorials").locator(
        ".jp-LauncherCard", has_text=title).filter(visible=True).first
    card.wait_for()
    card.click()


def wait_open(page, path: str, timeout_ms: int = 60_000) -> None:
    try:
        page.wait_for_function(
            """p => { const w = window.jupyterapp.shell.currentWidget;
                      return !!(w && w.context && w.context.path === p && w.content
                                && w.content.widgets.length > 0); }""",
            arg=path, timeout=timeout_ms, polling=250)
    except Exception:
        dialog = page.locator(".jp-Dialog")
        shown = dialog.inner_text() if dialog.count() else "no dialog"
        current = page.evaluate("() => window.jupyterapp.shell.currentWidget?.context?.path ?? null")
        raise AssertionError(f"{path} did not open (front: {current}; {shown})") from None


def error_outputs(page) -> list[str]:
    """Tracebacks in the current notebook's outputs."""
    return page.evaluate(
        """() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')]
              .map(e => e.innerText.slice(0, 2000))""")


def run_first_code_cell(page) -> None:
    page.evaluate("""async () => {
        const w = window.jupyterapp.shell.currentWidget;
        const nb = w.content;
        nb.activeCellIndex = nb.widgets.findIndex(c => c.model.type === 'code');
        await window.jupyterapp.commands.execute('notebook:run-cell');
    }""")
    wait_kernel_idle(page)
    page.wait_for_function(
        """() => { const nb = window.jupyterapp.shell.currentWidget.content;
                   const c = nb.widgets.find(c => c.model.type === 'code');
                   return /\\[\\d+\\]/.test(c.node.querySelector('.jp-InputArea-prompt').textContent); }""",
        timeout=120_000, polling=250)


def save(page) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty",
                           timeout=30_000, polling=250)


# ---- tests --------------------------------------------------------------------------------------

def test_make_lab_opens_a_working_folder_with_the_tutorials(make_lab):
    shipped = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
    assert shipped and sorted(p.name for p in make_lab.root_dir.glob("*.ipynb")) == shipped
    # the server's root is the working folder, not the tracked tutorials
    assert make_lab.api("api/contents")["content"] and \
        {c["name"] for c in make_lab.api("api/contents")["content"]} >= set(shipped)
    assert not (make_lab.root_dir / "jupytext.toml").exists()


def test_a_launcher_card_opens_the_tutorial_and_it_runs(make_lab, lab_page, notebooks_before):
    page, lab = lab_page, make_lab
    click_card(page, lab, FIRST)
    # the copy `make lab` made is still the tutorial as shipped: it opens without a question
    wait_open(page, FIRST)
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()
    wait_kernel_idle(page)
    run_all_cells(page, timeout_ms=300_000)
    assert not error_outputs(page), error_outputs(page)
    screenshot(page, "make-lab-first-tutorial")
    save(page)
    # the outputs are in the copy in the working folder, the tracked notebooks/ as they were
    copy = json.loads((lab.root_dir / FIRST).read_text())
    assert any(c.get("outputs") for c in copy["cells"] if c["cell_type"] == "code")
    assert tracked_notebooks() == notebooks_before
    # the working folder's copies are not paired with text files (notebooks/jupytext.toml is
    # outside the served root): no src/ appears next to them
    assert not (lab.root_dir / "src").exists()


def test_a_copy_into_a_jupytext_paired_folder(make_lab, lab_page, notebooks_before):
    page, lab = lab_page, make_lab
    folder = lab.root_dir / "paired"
    folder.mkdir()
    (folder / "jupytext.toml").write_text(PAIRING)
    go_to_folder(page, "paired")
    click_card(page, lab, FIRST)
    wait_open(page, f"paired/{FIRST}")
    assert (folder / FIRST).is_file()
    assert "import os" in (folder / "src" / "00-start-here.py").read_text()  # jupytext's pair
    wait_kernel_idle(page)
    run_first_code_cell(page)
    assert not error_outputs(page), error_outputs(page)
    assert tracked_notebooks() == notebooks_before


def test_a_failed_copy_shows_why_and_leaves_nothing(make_lab, lab_page, notebooks_before):
    page, lab = lab_page, make_lab
    folder = lab.root_dir / "broken"
    folder.mkdir()
    (folder / "jupytext.toml").write_text(PAIRING)
    (folder / "src").write_text("a file where the pairing wants a folder")
    before = tree(lab.root_dir)
    go_to_folder(page, "broken")
    click_card(page, lab, FIRST)
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    text = dialog.inner_text()
    assert "Could not copy the tutorial" in text, text
    assert f"broken/{FIRST}" in text and "src" in text, text       # the reason, with the path
    screenshot(page, "make-lab-copy-failed")
    dialog.get_by_role("button").last.click()
    dialog.wait_for(state="detached")
    assert tree(lab.root_dir) == before                    # no .ipynb, no checkpoint left
    assert (folder / "src").read_text() == "a file where the pairing wants a folder"
    current = page.evaluate("() => window.jupyterapp.shell.currentWidget?.context?.path ?? null")
    assert current != f"broken/{FIRST}"

    # with the cause gone, the next click copies (nothing half-made says "already copied")
    (folder / "src").unlink()
    click_card(page, lab, FIRST)
    wait_open(page, f"broken/{FIRST}")
    assert page.locator(".jp-Dialog").count() == 0
    assert (folder / "src" / "00-start-here.py").is_file()
    assert tracked_notebooks() == notebooks_before
