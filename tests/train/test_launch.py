"""nvkit.launch: the run folder and command, and a real 1-process torchrun run with gloo on CPU."""

from __future__ import annotations

import json
import os
import shlex

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train.launch import LaunchRun, launch  # noqa: E402
from tests import demo_model  # noqa: E402

DATA = ["NVIDIA GPUs are fast.", "The H200 has 141 GB of memory."] * 8


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return demo_model.path()


def test_written_run_and_command(path, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")   # the host's NCCL settings travel on the line
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    run = launch({"model": path, "data": DATA, "max_steps": 3, "seq_len": 64}, nproc_per_node=2, gpus=[],
                 run_dir=str(tmp_path / "r"), start=False)
    assert isinstance(run, LaunchRun) and run.proc is None
    words = shlex.split(run.command)
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in words and "NCCL_NVLS_ENABLE=0" in words
    assert "CUDA_VISIBLE_DEVICES=" in words  # CPU only: nothing visible
    assert not any(w.startswith("NCCL_DEBUG=") for w in words)  # only what this process has
    assert "torchrun" in words and "--nproc_per_node=2" in words and "--standalone" in words
    # the worker is nvkit's module; the run folder is its one argument (no generated Python)
    assert words[-3:] == ["--module", "nvkit.train.worker", str(tmp_path / "r")]
    assert not list((tmp_path / "r").glob("*.py"))
    sh = (tmp_path / "r" / "launch.sh").read_text()
    assert run.command in sh and os.access(tmp_path / "r" / "launch.sh", os.X_OK)
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["strategy"] == "ddp" and cfg["device"] == "cpu" and cfg["max_steps"] == 3 and "data" not in cfg
    rows = (tmp_path / "r" / "data.jsonl").read_text().splitlines()
    assert rows and '"input_ids"' in rows[0] and '"labels"' in rows[0]


def test_multinode_command(path, tmp_path):
    run = launch({"model": path, "data": DATA, "max_steps": 3, "seq_len": 64}, nproc_per_node=8, gpus=[],
                 nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500", run_dir=str(tmp_path / "m"), start=False)
    for piece in ("--nnodes=2", "--node_rank=1", "--rdzv_backend=c10d", "--rdzv_endpoint=10.0.0.1:29500"):
        assert piece in run.command
    assert "--standalone" not in run.command


@pytest.mark.parametrize("kwargs, match", [
    (dict(strategy="zero4"), "strategy"),
    (dict(nproc_per_node=0), "nproc_per_node"),
    (dict(nnodes=2), "rdzv_endpoint"),
    (dict(nnodes=2, rdzv_endpoint="h:1"), "node_rank"),
    (dict(strategy="fsdp"), "fsdp"),
    (dict(turbo=True), "Unknown launch setting"),
    (dict(max_steps=0), "max_steps"),
    (dict(learning_rate=5), "learning_rate"),
    (dict(quantization="int3"), "quantization"),
])
def test_bad_launch_settings(path, tmp_path, kwargs, match):
    with pytest.raises(NvkitError, match=match):
        launch({"model": path, "data": DATA, "max_steps": 2}, gpus=[], run_dir=str(tmp_path / "x"), start=False,
               **kwargs)


def test_bad_launch_data(path, tmp_path):
    with pytest.raises(NvkitError, match="needs data"):
        launch({"model": path}, gpus=[], run_dir=str(tmp_path / "x"), start=False)
    with pytest.raises(NvkitError, match="keys"):
        launch({"model": path, "data": [{"q": 1}]}, gpus=[], run_dir=str(tmp_path / "x"), start=False)
    with pytest.raises(NvkitError):
        launch("not a dict", gpus=[], start=False)


def test_cpu_torchrun_gloo_run(path, tmp_path):
    run = launch({"model": path, "data": DATA, "max_steps": 3, "batch_size": 4, "seq_len": 64}, gpus=[],
                 run_dir=str(tmp_path / "g"))
    run.result(timeout=400)
    assert run.returncode == 0, run.text(40)
    assert run.ranks == [0]
    logs = [r for r in run.history if r.get("event") == "log"]
    steps = [r for r in run.history if r.get("event") == "step"]
    assert [r["step"] for r in logs] == [1, 2, 3] and all(r["loss"] > 0 for r in logs)
    assert all(r["tokens_per_s"] > 0 and r["memory"] > 0 for r in steps)
    assert run.progress == {"step": 3, "total": 3}
    assert os.path.isfile(os.path.join(run.adapter_dir, "adapter_config.json"))
    assert os.path.isdir(tmp_path / "g" / "logs")  # per-rank logs from --tee/--log_dir
    s = nvkit.load(path)
    s.load_adapter(run.adapter_dir)  # the launched run's adapter fits the model
    s.unload()


def test_cpu_torchrun_stop(path, tmp_path):
    run = launch({"model": path, "data": DATA * 8, "max_steps": 500, "batch_size": 2, "seq_len": 64}, gpus=[],
                 run_dir=str(tmp_path / "s"))
    import time
    deadline = time.monotonic() + 300
    while not any(r.get("event") == "step" for r in run.history) and time.monotonic() < deadline and not run.done:
        time.sleep(0.1)
    run.stop()
    run.result(timeout=300)
    assert run.stopped and run.returncode == 0, run.text(40)
    assert any(r.get("event") == "stopping" for r in run.history)
    last = max(r["step"] for r in run.history if r.get("event") == "step")
    assert last < 500
    assert os.path.isfile(os.path.join(run.adapter_dir, "adapter_model.safetensors"))


def _fake_group(tmp_path, body: str) -> LaunchRun:
    """A LaunchRun around a stand-in for torchrun: a Python process printing rank lines."""
    import sys
    code = "import json, sys, time\n" \
           "def say(**kw): print(json.dumps({'nvkit': 1, 'world': 2, 't': time.time(), **kw}), flush=True)\n" + body
    run = LaunchRun("fake torchrun", [sys.executable, "-c", code], dict(os.environ), str(tmp_path), total_steps=1)
    run.EXIT_GRACE = 1.0
    return run.start()


def test_group_that_hangs_after_every_rank_is_done_is_ended(tmp_path):
    """Seen in CI: both ranks finished and saved, then one hung for good in the process group's
    teardown; the notebook's `await run` waited forever. Now the run ends EXIT_GRACE s later."""
    run = _fake_group(tmp_path, "say(rank=0, event='saved'); say(rank=0, event='done', step=1)\n"
                                "say(rank=1, event='done', step=1)\ntime.sleep(600)\n")
    run.result(timeout=60)  # no NvkitError: the work was done
    assert run.ended_after_done and run.returncode != 0 and run.done


def test_group_with_a_rank_not_done_is_left_alone(tmp_path):
    run = _fake_group(tmp_path, "say(rank=0, event='done', step=1)\ntime.sleep(3)\nsys.exit(3)\n")
    with pytest.raises(NvkitError, match="exit 3"):
        run.result(timeout=60)
    assert not run.ended_after_done


def test_two_rank_ddp_on_cpu(path, tmp_path):
    """Two gloo ranks: the fused loss goes through the DDP wrapper (its hooks sync the gradients),
    both ranks log the same reduced loss, and rank 0 alone saves the adapter."""
    run = launch({"model": path, "data": DATA, "max_steps": 2, "batch_size": 4, "seq_len": 64}, nproc_per_node=2,
                 gpus=[], run_dir=str(tmp_path / "ddp"))
    run.result(timeout=600)  # NvkitError unless every rank finished (a slow teardown is ended by nvkit)
    assert run.returncode == 0 or run.ended_after_done, run.text(40)
    assert run.ranks == [0, 1]
    logs = {(r["rank"], r["step"]): r["loss"] for r in run.history if r.get("event") == "log"}
    assert sorted(logs) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert logs[(0, 2)] == pytest.approx(logs[(1, 2)], rel=1e-4)
    assert [r["rank"] for r in run.history if r.get("event") == "saved"] == [0]
    assert os.path.isfile(os.path.join(run.adapter_dir, "adapter_model.safetensors"))
    assert not [n for n in os.listdir(tmp_path / "ddp") if n.startswith(".")]  # no temporary folders left


def test_worker_refuses_a_folder_without_config(tmp_path):
    import subprocess
    import sys
    for args in ([], [str(tmp_path)], ["--help"]):
        p = subprocess.run([sys.executable, "-m", "nvkit.train.worker", *args], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and "nvkit.train.worker RUN_DIR" in p.stderr
