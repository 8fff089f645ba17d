"""Issue 35, the files a launch writes: never through a link planted in a reused run folder, a
launch.sh that sh runs (``exec env K=V cmd``), variable names that cannot smuggle shell words, and
a data file nested too deep to parse is an NvkitError naming it. Each test fails on the code before."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train import data as D  # noqa: E402
from nvkit.train.launch import LaunchRun, launch, launch_line  # noqa: E402

DATA = ["NVIDIA GPUs are fast.", "The H200 has 141 GB of memory."] * 4
RUN_FILES = ("launch.sh", "data.jsonl", "config.json", "accelerate.yaml")


def test_reused_run_folder_replaces_planted_links_never_writes_through(path, tmp_path):
    d = tmp_path / "run"
    launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], run_dir=str(d), launcher="accelerate",
           start=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in RUN_FILES:
        victim = outside / name
        victim.write_text(f"the user's {name}")
        victim.chmod(0o600)
        (d / name).unlink()
        (d / name).symlink_to(victim)
    launch({"model": path, "data": DATA, "max_steps": 2}, gpus=[], run_dir=str(d), launcher="accelerate",
           start=False)
    for name in RUN_FILES:
        assert (outside / name).read_text() == f"the user's {name}"
        assert stat.S_IMODE((outside / name).stat().st_mode) == 0o600  # launch.sh's target not made 0755
        assert not (d / name).is_symlink() and (d / name).is_file()
    assert json.loads((d / "config.json").read_text())["max_steps"] == 2
    assert stat.S_IMODE((d / "launch.sh").stat().st_mode) == 0o755
    assert not [n for n in os.listdir(d) if n.startswith(".")]  # no temporary file left


def test_reused_run_folder_with_user_files_in_its_adapter_is_refused_before_training(path, tmp_path):
    from nvkit.model.saving import save_atomic
    d = tmp_path / "run"
    launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], run_dir=str(d), start=False)
    save_atomic(lambda folder: open(os.path.join(folder, "adapter_config.json"), "w").close(), str(d / "adapter"))
    (d / "adapter" / "MY_NOTES.txt").write_text("mine")
    before = (d / "config.json").read_text()
    with pytest.raises(NvkitError, match="MY_NOTES.txt"):
        launch({"model": path, "data": DATA, "max_steps": 2}, gpus=[], run_dir=str(d), start=False)
    assert (d / "adapter" / "MY_NOTES.txt").read_text() == "mine" and (d / "config.json").read_text() == before


def test_stop_file_is_not_written_through_a_link(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("mine")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "STOP").symlink_to(victim)
    run = LaunchRun("sleep", [sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), str(run_dir),
                    total_steps=1).start()
    try:
        run.stop(grace=0.5)
        assert victim.read_text() == "mine"
        assert not (run_dir / "STOP").is_symlink() and (run_dir / "STOP").read_text() == "stop\n"
    finally:
        run.result(timeout=60)  # stopped: the group gets SIGTERM after the grace


def test_written_launch_sh_runs_under_sh_and_trains(path, tmp_path, monkeypatch):
    """The script as a user runs it: `sh launch.sh`, nvkit's Python first on PATH (where torchrun is)."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # a passed-on variable goes through `env` as well
    d = tmp_path / "sh-run"
    run = launch({"model": path, "data": DATA, "max_steps": 1, "batch_size": 4, "seq_len": 64}, gpus=[],
                 run_dir=str(d), start=False)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["sh", str(d / "launch.sh")], capture_output=True, text=True, timeout=500, env=env,
                       cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "not found" not in out
    logs = [json.loads(line.split(":", 1)[1]) for line in p.stdout.splitlines()
            if ']:{"nvkit"' in line and '"event": "log"' in line]
    assert logs and logs[0]["step"] == 1 and logs[0]["loss"] > 0
    assert (d / "adapter" / "adapter_model.safetensors").is_file()
    script = (d / "launch.sh").read_text()
    assert "\nexec env CUDA_DEVICE_ORDER=PCI_BUS_ID " in script and run.command in script


def test_the_shell_line_is_a_valid_command_line(path, tmp_path, monkeypatch):
    """What run.command and the Launch panel show stays `K=V ... cmd` (no `exec`, so no `env`)."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0 lo")  # a value with a space stays one word
    line = launch_line(2, gpus=[], run_dir=str(tmp_path / "a b"))
    assert subprocess.run(["sh", "-n", "-c", line]).returncode == 0
    words = shlex.split(line)
    assert words[:3] == ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=", "NCCL_SOCKET_IFNAME=eth0 lo"]
    # and it sets the variables when run as a plain command line
    echo = line.split(" torchrun ", 1)[0] + " sh -c 'echo \"$NCCL_SOCKET_IFNAME\"'"
    assert subprocess.run(["sh", "-c", echo], capture_output=True, text=True).stdout == "eth0 lo\n"


@pytest.mark.parametrize("name", ["NCCL_X;touch f;Y", "NCCL_A B", "NCCL_$(touch f)", "NCCL_X\ntouch f"])
def test_a_hostile_variable_name_is_refused(path, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, "1")
    d = tmp_path / "run"
    with pytest.raises(NvkitError, match="cannot go on a launch line") as e:
        launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], run_dir=str(d), start=False)
    assert repr(name) in str(e.value)
    with pytest.raises(NvkitError, match="cannot go on a launch line"):
        launch_line(1, gpus=[])
    assert not d.exists()  # refused before anything was written
    assert not (tmp_path / "f").exists()
    assert os.listdir(tmp_path) == []


def test_a_json_data_file_nested_too_deep_is_an_nvkit_error(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(NvkitError, match="deep.json.*nested too deeply"):
        D.read(str(deep))
    lines = tmp_path / "deep.jsonl"
    lines.write_text('"fine"\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(NvkitError, match="deep.jsonl, line 2.*nested too deeply"):
        D.read(str(lines))
    with pytest.raises(NvkitError, match="Line 2.*nested too deeply"):
        D.parse_examples("plain text\n" + "[" * 200_000 + "]" * 200_000)
