"""The demo model (or the tiny stand-in) for the training tests, loaded once per module."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from tests import demo_model
    return demo_model.path()


@pytest.fixture(scope="module")
def s(path):
    import nvkit
    import torch
    torch.set_num_threads(2)
    sess = nvkit.load(path)
    yield sess
    sess.unload()


@pytest.fixture(autouse=True)
def _no_adapter_left(request):
    """Each test starts from the base model: an adapter a test trained is removed after it."""
    yield
    sess = request.node.funcargs.get("s")
    if sess is not None and sess.loaded and sess.info["adapters"] and (sess.training is None or sess.training.done):
        sess.unload_adapter()
