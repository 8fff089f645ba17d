"""``launch_command`` never writes a line that starts more processes than it makes GPUs visible
(tutorial 08's multi-node line pinned CUDA_VISIBLE_DEVICES=0,1,2,3 with --nproc_per_node=8)."""

import pytest

import nvkit
from nvkit.errors import NvkitError


@pytest.fixture(autouse=True)
def fake(fake_gpus, tmp_path):
    """4 fake GPUs, no CUDA variables, a private cache, CUDA not up."""
    fake_gpus("k-test", cache=tmp_path / "cache")


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
