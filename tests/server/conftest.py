# pytest-jupyter's server fixtures for these tests only. Not `pytest_plugins = [...]`: pytest refuses
# that outside the top-level conftest, and loaded globally its autouse fixtures (an asyncio loop it
# closes after each test, a ServerApp cleanup) would wrap every test of the suite, breaking the
# Playwright tests in tests/ui. Star-importing keeps fixtures and hooks scoped to this folder.
import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403


@pytest.fixture
def jp_server_config():
    # load nvkit's server extension into the test server (as the installed config file does)
    return {"ServerApp": {"jpserver_extensions": {"nvkit": True}}}


@pytest.fixture
def tutorials(tmp_path, monkeypatch):
    """Two tutorials (one without a heading) and a non-notebook, served from a temporary folder."""
    import json

    from tests.server.helpers import TUTORIAL
    d = tmp_path / "tutorials"
    d.mkdir()
    (d / "00-hello.ipynb").write_text(json.dumps(TUTORIAL))
    untitled = dict(TUTORIAL, cells=[TUTORIAL["cells"][1]])
    (d / "01-untitled.ipynb").write_text(json.dumps(untitled))
    (d / "notes.txt").write_text("not a notebook")
    monkeypatch.setenv("NVKIT_TUTORIALS_DIR", str(d))
    return d
