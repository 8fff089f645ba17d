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
from pathlib import Path

import pytest

from tests.ui.conftest import Lab, logged_in_page, running_lab


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
    home = tmp_path_factory.mktemp("gpu-lab-home")
    inventory = home / "gpus.json"
    inventory.write_text(json.dumps([{"memory_used": 2**30}, {"memory_used": 2**30}]))
    # poll the GPUs twice a second, so the test does not wait on the default 2 s
    poll = {"nvkit/plugin.jupyterlab-settings": {"refreshRate": 500}}
    with running_lab(home, tmp_path_factory.mktemp("gpu-lab-root"), fake_gpus=f"@{inventory}", settings=poll,
                     server_class=GpuLab) as server:
        server.inventory_path = inventory
        yield server


@pytest.fixture
def gpu_page(browser, gpu_lab):
    with logged_in_page(browser, gpu_lab, height=860) as p:
        yield p
