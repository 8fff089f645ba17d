# pytest-jupyter's server fixtures and its async test runner for this folder only (as in
# tests/server/conftest.py: its autouse fixtures must not wrap the other GPU tests, and pytest takes
# hooks from a conftest, not from a test module).
from pytest_jupyter.jupyter_server import *  # noqa: F401,F403
