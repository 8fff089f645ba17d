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
