"""``select_gpus`` with choices that are not GPU choices, on 4 fake GPUs: NvkitError naming the valid
GPUs, the CUDA variables unchanged, and the demo session generating as before."""

import importlib
import os

import pytest

import nvkit
from tests.refusals import refused

S = importlib.import_module("nvkit.hardware.selection")


@pytest.fixture(autouse=True)
def fake(fake_gpus, tmp_path):
    fake_gpus("k-bad-input", cache=tmp_path / "cache", visible="2,0", order="PCI_BUS_ID")


CHOICES = [
    ([0.5], "0.5 is neither a GPU index nor a GPU UUID"),
    ([-1], "GPU -1 does not exist"),
    ([4], "GPU 4 does not exist"),
    ("9", "GPU 9 does not exist"),
    ("x", "'x' is neither a GPU index nor a GPU UUID"),
    ("-2", "'-2' is neither"),
    ("1,x", "'x' is neither"),
    (" , ", "names no GPU"),
    ([True], "True is neither"),
    ([None], "None is neither"),
    (["GPU-00000000-0000-0000-0000-000000000000"], "no GPU has the UUID"),
    ([0, 0], "GPU 0 is listed twice"),
    ("1 1", "GPU 1 is listed twice"),
    ({0: 1}, "is not a GPU choice"),
    ({"a"}, "is not a GPU choice"),
    (b"0", "is not a GPU choice"),
    (3.0, "is not a GPU choice"),
]


@pytest.mark.parametrize("choice, words", CHOICES, ids=[repr(c) for c, _ in CHOICES])
def test_select_gpus_refuses(survivor, choice, words):
    msg = refused(lambda: nvkit.select_gpus(choice), words, survivor=survivor)
    if "is not a GPU choice" not in msg:
        assert "Valid GPUs: 0 (" in msg and "3 (" in msg
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,0" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert nvkit.selection().pending is None


def test_the_preview_refuses_the_same(survivor):
    refused(lambda: S.plan([7]), "GPU 7 does not exist", survivor=survivor)
    refused(lambda: S.plan(" , "), "names no GPU", survivor=survivor)
