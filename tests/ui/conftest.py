"""Browser-test infrastructure: one real JupyterLab server per session, driven by Debian's chromium.

Fixtures:
  ``lab``  (session) a running ``jupyter lab`` under base URL ``/nvkit-test/`` with 4 fake GPUs;
           has ``.url`` (ends in ``/nvkit-test/``), ``.token``, ``.root_dir`` (Path), ``.port``.
           Started by ``running_lab``, which the other servers of these tests use too (gpu_lab.py,
           test_make_lab_browser.py).
  ``page`` a logged-in Playwright page (sync API) on a fresh browser context; the browser itself
           is shared by the session.
Helpers (import from ``tests.ui.conftest`` or use the fixtures of the same name):
  ``write_notebook(root_dir, name, cells)``, ``open_and_run_notebook(page, lab, name)``,
  ``screenshot(page, name)`` -> ``test-results/screenshots/<name>.png`` (``docs/screenshots`` with
  ``NVKIT_SCREENSHOTS=docs``).

Every test collected under tests/ui gets the ``ui`` marker.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("NVKIT_CHROMIUM", "/usr/bin/chromium")
BASE_URL = "/nvkit-test/"
REPO = Path(__file__).resolve().parents[2]
# The README's pictures are docs/screenshots; a test run writes its own into the ignored
# test-results/ so that `make test` leaves the checkout as it was. NVKIT_SCREENSHOTS=docs renews
# the README's.
SCREENSHOTS = REPO / ("docs" if os.environ.get("NVKIT_SCREENSHOTS") == "docs" else "test-results") / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STARTUP_TIMEOUT_S = 120


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.ui)


def _require_chromium() -> None:
    if os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return
    msg = (f"{CHROMIUM} not found: browser tests need Debian's chromium "
           "(apt-get install chromium; scripts/setup.sh does it as root)")
    if os.environ.get("CI"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    url: str          # http://127.0.0.1:<port>/nvkit-test/
    token: str
    root_dir: Path
    port: int
    proc: subprocess.Popen
    log_path: Path

    def api(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 10):
        """Call the server's REST API with the token; returns parsed JSON (or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def lab_options(token: str, port: int | None = None, root_dir: Path | None = None) -> list[str]:
    """JupyterLab's options for a test server: on 127.0.0.1 under BASE_URL with ``token``, the app
    exposed to the page, and no news/update/build popups over the page; ``--ServerApp.port`` and
    ``--ServerApp.root_dir`` where given."""
    return [
        "--no-browser", "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        *([f"--ServerApp.port={port}"] if port is not None else []),
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={BASE_URL}",
        f"--IdentityProvider.token={token}",
        *([f"--ServerApp.root_dir={root_dir}"] if root_dir is not None else []),
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]


def jupyter_lab_command(port: int, token: str, root_dir: Path) -> list[str]:
    """``jupyter lab`` (this Python's) with ``lab_options``, serving ``root_dir`` on ``port``."""
    jupyter = Path(sys.executable).with_name("jupyter")
    return [str(jupyter) if jupyter.exists() else "jupyter", "lab", *lab_options(token, port, root_dir)]


@contextlib.contextmanager
def running_lab(home: Path, root_dir: Path, *, command=None, cwd: Path | None = None,
                fake_gpus: str | None = "4", settings: dict | None = None, what: str = "jupyter lab",
                server_class: type = Lab, stop_children: bool = False):
    """Start a JupyterLab for browser tests, wait until its API answers, yield it (a ``server_class``)
    and stop it.

    ``command(port, token)`` gives the command line (default: ``jupyter_lab_command`` serving
    ``root_dir``), run in ``cwd`` (default ``root_dir``). The server sees ``NVKIT_FAKE_GPUS=fake_gpus``
    (None: not set, the machine's own GPUs) and keeps its workspaces, settings, runtime files, GPU
    choices (``NVKIT_CACHE``) and log (``jupyter.log``) under ``home``; ``settings`` maps a
    settings file under JupyterLab's settings folder (``"nvkit/plugin.jupyterlab-settings"``) to
    its content. ``what`` names the server in failures. ``stop_children``: the command is a
    launcher (``nvkit lab``) that returns once its JupyterLab child stops, so the child is stopped."""
    _require_chromium()
    port, token = _free_port(), secrets.token_hex(16)
    cmd = command(port, token) if command else jupyter_lab_command(port, token, root_dir)
    env = dict(os.environ)
    env.pop("NVKIT_FAKE_GPUS", None)
    if fake_gpus is not None:
        env["NVKIT_FAKE_GPUS"] = fake_gpus
    env.update({
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # keep workspaces/settings/runtime files of the test server out of the user's home
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        # GPU choices kept for a kernel restart go here, not into the user's ~/.cache/nvkit
        "NVKIT_CACHE": str(home / "nvkit-cache"),
    })
    # no "get notified about Jupyter news?" toast over the page and the screenshots
    settings = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                {"fetchNews": "false", "checkForUpdates": False}, **(settings or {})}
    for name, content in settings.items():
        path = home / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    log_path = home / "jupyter.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=cwd or root_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = server_class(url=f"http://127.0.0.1:{port}{BASE_URL}", token=token, root_dir=root_dir,
                          port=port, proc=proc, log_path=log_path)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{what} exited with {proc.returncode}:\n{server.log()}", pytrace=False)
            try:
                server.api("api/status", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"{what} did not answer within {STARTUP_TIMEOUT_S}s:\n{server.log()}",
                                pytrace=False)
                time.sleep(0.3)
        yield server
    finally:
        stop_lab(server, proc, log, children=stop_children)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab-home"), tmp_path_factory.mktemp("lab-root")) as server:
        yield server


@contextlib.contextmanager
def chromium():
    """Debian's Chromium, headless, under Playwright (every browser fixture starts it this way)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def logged_in_page(browser, server, height: int = 900):
    """A page of its own context, logged in to ``server`` and with JupyterLab started."""
    # no record_video_dir: video needs a downloaded ffmpeg
    context = browser.new_context(viewport={"width": 1400, "height": height})
    context.set_default_timeout(30_000)
    p = context.new_page()
    # ?token= logs in and sets the auth cookie for this context
    p.goto(f"{server.url}lab?token={server.token}&reset", wait_until="domcontentloaded")
    wait_for_app(p)
    try:
        yield p
    finally:
        context.close()


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _signal(pids: list[int], sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_lab(server, proc, log, children: bool = False) -> None:
    """Shut the server's kernels down cleanly, then the server: ``proc`` itself, or with
    ``children`` its child processes (a launcher such as ``nvkit lab`` waits on its JupyterLab
    child: stop the child, and the launcher returns)."""
    try:
        for k in server.api("api/kernels") or []:
            server.api(f"api/kernels/{k['id']}", method="DELETE")
    except Exception:
        pass
    if children:
        _signal(_children(proc.pid), signal.SIGTERM)
    else:
        proc.terminate()
    try:
        proc.wait(timeout=30 if children else 20)
    except subprocess.TimeoutExpired:
        if children:
            _signal(_children(proc.pid), signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=10)
    log.close()


@pytest.fixture(scope="session")
def browser(lab):
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, lab):
    with logged_in_page(browser, lab) as p:
        yield p


def wait_for_app(page, timeout_ms: int = 60_000) -> None:
    """Wait until JupyterLab has started (shell attached, app exposed, restored)."""
    page.wait_for_selector("#jp-main-dock-panel", timeout=timeout_ms)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined",
                           timeout=timeout_ms)
    page.evaluate("async () => { await window.jupyterapp.started; await window.jupyterapp.restored; }")


# ---- helpers ------------------------------------------------------------------------------------

def write_notebook(root_dir: Path, name: str, cells: list) -> Path:
    """Write a notebook of ``cells`` under ``root_dir``. A cell is a source string (code) or a
    ``("markdown"|"code", source)`` tuple. Returns the path."""
    nb_cells = []
    for c in cells:
        kind, src = ("code", c) if isinstance(c, str) else c
        cell = {"cell_type": kind, "metadata": {}, "source": src}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        nb_cells.append(cell)
    nb = {
        "cells": nb_cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                           "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = Path(root_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1))
    return path


def wait_kernel_idle(page, timeout_ms: int = 120_000) -> None:
    """Wait until the current notebook's kernel is connected and idle."""
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            const s = w && w.sessionContext;
            return !!(s && s.session && s.session.kernel && !s.pendingInput
                      && s.session.kernel.connectionStatus === 'connected'
                      && s.session.kernel.status === 'idle');
        }""",
        timeout=timeout_ms, polling=250,
    )


def open_notebook(page, lab, name: str) -> None:
    """Open ``name`` (relative to the server root) as the only tab and wait until it is the
    current widget, its cells are shown and its kernel is idle."""
    # ?reset: start from an empty workspace, so tabs of earlier tests don't come back
    page.goto(f"{lab.url}lab/tree/{name}?reset", wait_until="domcontentloaded")
    wait_for_app(page)
    page.wait_for_function(
        """name => {
            const w = window.jupyterapp.shell.currentWidget;
            return !!(w && w.context && w.context.path === name && w.content
                      && w.content.widgets.length > 0 && w.node.querySelector('.jp-Cell'));
        }""", arg=name, timeout=60_000, polling=250)
    wait_kernel_idle(page)


def run_all_cells(page, timeout_ms: int = 180_000) -> None:
    """Run every cell of the current notebook and wait until the kernel is idle again and no cell
    is pending (``[*]``)."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            if (!w || !w.content) return false;
            const k = w.sessionContext.session && w.sessionContext.session.kernel;
            if (!k || k.status !== 'idle') return false;
            const prompts = [...w.node.querySelectorAll('.jp-InputArea-prompt')];
            return prompts.every(p => !p.textContent.includes('*'));
        }""",
        timeout=timeout_ms, polling=250,
    )


def open_and_run_notebook(page, lab, name: str, timeout_ms: int = 180_000) -> None:
    """Open ``lab/tree/<name>``, wait for an idle kernel, run all cells, wait until done."""
    open_notebook(page, lab, name)
    run_all_cells(page, timeout_ms=timeout_ms)


def screenshot_path(name: str) -> Path:
    """SCREENSHOTS/<name>.png (docs/screenshots, which the README shows, only with
    NVKIT_SCREENSHOTS=docs), its folder made."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / (name if name.endswith(".png") else f"{name}.png")


def screenshot(page, name: str, **kwargs) -> Path:
    """Save a PNG of the page to ``screenshot_path(name)`` and return its path."""
    path = screenshot_path(name)
    page.screenshot(path=str(path), **kwargs)
    return path


def cell_errors(page) -> list[str]:
    """Texts of error outputs in the current notebook (tracebacks), for assertion messages."""
    return page.evaluate(
        """() => [...document.querySelectorAll(
                '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], '
                + '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]')]
              .map(e => e.innerText.slice(0, 2000))"""
    )


# fixtures that hand out the helpers, for tests that prefer injection over imports
@pytest.fixture(name="write_notebook")
def _write_notebook_fixture():
    return write_notebook


@pytest.fixture(name="open_and_run_notebook")
def _open_and_run_fixture():
    return open_and_run_notebook


@pytest.fixture(name="screenshot")
def _screenshot_fixture():
    return screenshot
