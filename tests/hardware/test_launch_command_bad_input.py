"""``launch_command`` with values that cannot make a launch line, on 4 fake GPUs: NvkitError saying
what is wrong and what to write, and the demo session generating as before."""

import pytest

from nvkit.hardware.selection import launch_command
from tests.refusals import refused


@pytest.fixture(autouse=True)
def fake(fake_gpus, tmp_path):
    fake_gpus("k-bad-input", cache=tmp_path / "cache")


CASES = [
    (dict(script=""), ["needs the script", "launch_command('train.py')"]),
    (dict(script="   "), ["needs the script"]),
    (dict(script=None), ["needs the script"]),
    (dict(script=5), ["needs the script"]),
    (dict(script="t.py", nproc_per_node=0), ["nproc_per_node", "positive integer"]),
    (dict(script="t.py", nproc_per_node=-2), ["nproc_per_node", "positive integer"]),
    (dict(script="t.py", nproc_per_node="2"), ["nproc_per_node", "positive integer"]),
    (dict(script="t.py", nproc_per_node=True), ["nproc_per_node", "positive integer"]),
    (dict(script="t.py", nproc_per_node=1.5), ["nproc_per_node", "positive integer"]),
    (dict(script="t.py", launcher="mpirun"), ["'torchrun' or 'accelerate'"]),
    (dict(script="t.py", launcher=""), ["'torchrun' or 'accelerate'"]),
    (dict(script="t.py", launcher=None), ["'torchrun' or 'accelerate'"]),
    (dict(script="t.py", gpus=[9]), ["GPU 9 does not exist", "Valid GPUs"]),
    (dict(script="t.py", gpus="x"), ["neither a GPU index nor a GPU UUID"]),
    (dict(script="t.py", gpus=[0, 0]), ["listed twice"]),
    (dict(script="t.py", args=5), ["args must be a list", "args=['--epochs', '3']"]),
    (dict(script="t.py", args="--epochs 3"), ["args must be a list"]),
    (dict(script="t.py", args=[None]), ["args must be a list"]),
    (dict(script="t.py", master_port=object()), ["value of master_port"]),
    (dict(script="t.py", **{"bad key": 1}), ["not a launcher option name", "master_port=29501"]),
    (dict(script="t.py", **{"x;rm": 1}), ["not a launcher option name"]),
]


def _case_id(kwargs: dict) -> str:
    # an object's repr holds its address, which differs between pytest-xdist's workers
    return repr({k: v if isinstance(v, (str, int, float, list, type(None))) else f"<{type(v).__name__}>"
                 for k, v in kwargs.items()})


@pytest.mark.parametrize("kwargs, words", CASES, ids=[_case_id(c[0]) for c in CASES])
def test_launch_command_refuses(survivor, kwargs, words):
    refused(lambda: launch_command(**kwargs), *words, survivor=survivor)


def test_good_values_still_make_the_line(survivor):
    line = launch_command("t.py", 2, gpus=[2, 0], args=["--epochs", 3], master_port=29501)
    assert line.startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 torchrun --nproc_per_node=2")
    assert line.argv[-3:] == ["t.py", "--epochs", "3"] and "--master_port=29501" in line.argv
    survivor.check()
