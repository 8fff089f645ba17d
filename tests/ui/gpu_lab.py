"""A JupyterLab of its own whose fake GPUs a test can change while it runs.

The shared ``lab`` (conftest.py) starts with ``NVKIT_FAKE_GPUS=4``; this one with
``NVKIT_FAKE_GPUS=@<file>``, which the server and its kernels re-read when the file changes, so a
test can put running kernels' pids (or container-style pids) on fake GPUs.

Fixtures: ``gpu_lab`` (module scope; a ``conftest.Lab`` plus ``.inventory(gpus)`` and
``.kernel_pid(kernel_id)``), ``gpu_page`` (a logged-in page on it, from the shared browser).
Import both into a test module to use them.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from tests.ui.conftest import BASE_URL, STARTUP_TIMEOUT_S, Lab, _free_port, _require_chromium, logged_in_page, stop_lab


class GpuLab(Lab):
    inventory_path: Path

    def inventory(self, gpus: list[dict]) -> None:
        """Replace the fake GPUs (atomically: the server never reads half a file)."""
        tmp = self.inventory_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(gpus))
        os.replace(tmp, self.inventory_path)

    def kernel_pid(self, kernel_id: str) -> int:
        """The pid of a kernel of this server: the process started with its connection file."""
        needle = f"kernel-{kernel_id}.json".encode()
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if needle in (d / "cmdline").read_bytes():
                        return int(d.name)
                except OSError:
                    continue
        raise AssertionError(f"no process runs kernel {kernel_id}")

    def sessions(self) -> dict[str, str]:
        """notebook path -> kernel id, from the Jupyter API."""
        return {s["path"]: s["kernel"]["id"] for s in self.api("api/sessions") if s.get("kernel")}


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory):
    _require_chromium()
    root = tmp_path_factory.mktemp("gpu-lab-root")
    home = tmp_path_factory.mktemp("gpu-lab-home")
    log_path = home / "jupyter.log"
    inventory = home / "gpus.json"
    inventory.write_text(json.dumps([{"memory_used": 2**30}, {"memory_used": 2**30}]))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update({
        "NVKIT_FAKE_GPUS": f"@{inventory}",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    })
    notif = home / "settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # poll the GPUs twice a second, so the test does not wait on the default 2 s
    nvkit_settings = home / "settings" / "nvkit"
    nvkit_settings.mkdir(parents=True)
    (nvkit_settings / "plugin.jupyterlab-settings").write_text(json.dumps({"refreshRate": 500}))
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [
        str(jupyter) if jupyter.exists() else "jupyter", "lab", "--no-browser", "--allow-root",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={BASE_URL}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = GpuLab(url=f"http://127.0.0.1:{port}{BASE_URL}", token=token, root_dir=root, port=port,
                    proc=proc, log_path=log_path)
    server.inventory_path = inventory
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            log.close()
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{server.log()}", pytrace=False)
        try:
            server.api("api/status", timeout=2)
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                proc.terminate()
                log.close()
                pytest.fail(f"jupyter lab did not answer within {STARTUP_TIMEOUT_S}s:\n{server.log()}",
                            pytrace=False)
            time.sleep(0.3)
    try:
        yield server
    finally:
        stop_lab(server, proc, log)


@pytest.fixture
def gpu_page(browser, gpu_lab):
    with logged_in_page(browser, gpu_lab, height=860) as p:
        yield p
