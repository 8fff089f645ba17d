"""Fixtures the generation tests share."""

import pytest


@pytest.fixture(scope="module")
def cpu_demo():
    """The demo model on the CPU in float32, one session per test file."""
    import nvkit
    from tests import demo_model
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()
