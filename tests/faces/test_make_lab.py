"""`make lab` opens a git-ignored working folder through `nvkit lab` (so running a tutorial never
writes into the tracked notebooks/), and `nvkit lab` hands JupyterLab's own options on (`make lab`
passes --port and LAB_ARGS through it; argparse used to refuse them)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from nvkit import cli

REPO = Path(__file__).resolve().parents[2]


def _make_lab_line(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-s", "-n", "-C", str(REPO), "lab", *args], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return next(ln for ln in out.splitlines() if "setup" not in ln)


def test_make_lab_runs_nvkit_lab_in_an_ignored_working_folder():
    line = _make_lab_line("PORT=9999", "LAB_ARGS=--no-browser")
    assert line.split()[:4] == [".venv/bin/nvkit", "lab", "--dir", "nvkit-tutorials"], line
    assert "--port=9999" in line.split() and "--no-browser" in line.split()
    assert "notebooks" not in line.split("--dir")[1].split()[0]
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q",
                              "nvkit-tutorials/00-start-here.ipynb"], timeout=30)
    assert ignored.returncode == 0, "nvkit-tutorials/ must be git-ignored"


@pytest.mark.parametrize("argv,passed", [
    (["--port=9999", "--allow-root"], ["--port=9999", "--allow-root"]),
    (["--port", "9999", "--no-browser"], ["--port", "9999", "--no-browser"]),
    (["--", "--port=9999"], ["--port=9999"]),
    ([], []),
])
def test_nvkit_lab_passes_jupyterlab_options_on(tmp_path, monkeypatch, argv, passed):
    started = []
    monkeypatch.setattr(cli.subprocess, "call", lambda a: started.append(a) or 0)
    assert cli.main(["lab", "--dir", str(tmp_path / "w"), *argv]) == 0
    assert started[0][-len(passed) - 1:] == [f"--notebook-dir={tmp_path / 'w'}", *passed]
    assert (tmp_path / "w" / "00-start-here.ipynb").is_file()


def test_other_commands_still_refuse_unknown_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--bogus"])
    assert e.value.code == 2 and "--bogus" in capsys.readouterr().err
