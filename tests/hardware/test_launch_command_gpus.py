"""``launch_command`` never writes a line that starts more processes than it makes GPUs visible
(tutorial 08's multi-node line pinned CUDA_VISIBLE_DEVICES=0,1,2,3 with --nproc_per_node=8)."""

import importlib

import pytest

import nvkit
from nvkit.errors import NvkitError
from nvkit.state import STATE

S = importlib.import_module("nvkit.hardware.selection")
G = importlib.import_module("nvkit.hardware.inventory")


@pytest.fixture(autouse=True)
def fake(monkeypatch, tmp_path):
    """4 fake GPUs, no CUDA variables, a private cache, CUDA not up."""
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "cache"))
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    monkeypatch.setattr(S, "_STARTUP", {S.ORDER: None, S.VISIBLE: None})
    monkeypatch.setattr(STATE, "pending_gpus", None)
    monkeypatch.setattr(S, "cuda_initialized", lambda: False)
    monkeypatch.setattr(S, "kernel_id", lambda: "k-test")
    G._fake_sources.clear()
    yield
    G._fake_sources.clear()


def test_more_processes_than_gpus_on_the_line_is_refused():
    with pytest.raises(NvkitError, match=r"nproc_per_node=8 starts one process per GPU, but 4 GPU\(s\) are on the "
                                         r"launch line \(CUDA_VISIBLE_DEVICES=0,1,2,3\)\. Use nproc_per_node=4"):
        nvkit.launch_command("train.py", nproc_per_node=8, nnodes=2)
    with pytest.raises(NvkitError, match="2 GPU"):
        nvkit.launch_command("train.py", 3, gpus=[2, 0])
    with pytest.raises(NvkitError, match="gpus=\\[\\]"):
        nvkit.launch_command("train.py", 5, launcher="accelerate")


def test_consistent_lines_pass():
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --nproc_per_node=4 --nnodes=2" in \
        nvkit.launch_command("train.py", nproc_per_node=4, nnodes=2)
    assert "--nproc_per_node=1" in nvkit.launch_command("train.py", 1, gpus=[2, 0])   # fewer is fine
    # CPU processes (gloo): no GPU on the line, any number of processes
    assert nvkit.launch_command("train.py", 8, gpus=[]).endswith("CUDA_VISIBLE_DEVICES= torchrun --nproc_per_node=8 "
                                                                  "train.py")
