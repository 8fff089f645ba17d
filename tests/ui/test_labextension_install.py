"""The installed package registers both halves of the extension with Jupyter, and JupyterLab
starts with it (jupyterlab.browser_check)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

JUPYTER = str(Path(sys.executable).with_name("jupyter"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(*args, timeout=180, env=None):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "NO_COLOR": "1", **(env or {})})
    return p.returncode, ANSI.sub("", p.stdout + p.stderr)


def test_labextension_is_enabled_and_ok():
    rc, out = run(JUPYTER, "labextension", "list")
    assert rc == 0, out
    assert re.search(r"^\s*nvkit v\S+ enabled\s+OK", out, re.M), out


def test_server_extension_is_enabled_and_ok():
    rc, out = run(JUPYTER, "server", "extension", "list")
    assert rc == 0, out
    assert re.search(r"^\s*nvkit enabled\s*$", out, re.M), out
    assert re.search(r"^\s*nvkit \S+ OK", out, re.M), out


def test_browser_check(tmp_path):
    args = [sys.executable, "-m", "jupyterlab.browser_check", "--no-browser-test",
            f"--ServerApp.root_dir={tmp_path}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    rc, out = run(*args, timeout=300, env={"JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
                                           "NVKIT_FAKE_GPUS": "4"})
    assert rc == 0, out[-4000:]
    assert "nvkit" in out                     # the server extension was loaded
