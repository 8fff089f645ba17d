"""Shared test setup: never reach the Hub, keep nvkit's caches inside the test run; fixtures that several
folders use (`survivor`, `fake_gpus`)."""

import os

import pytest

# Set before anything imports transformers/huggingface_hub (they read it at import time).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# A test that fine-tunes without an output folder writes under ./nvkit-runs of its working
# directory; run from the checkout, that is the developer's tree. The suite fails when a run folder
# appeared there, naming it, so such a test is found the day it is written.
_ROOT_RUNS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nvkit-runs")


def _run_folders() -> set:
    return set(os.listdir(_ROOT_RUNS)) if os.path.isdir(_ROOT_RUNS) else set()


_RUNS_BEFORE = _run_folders()


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks once
        return
    new = sorted(_run_folders() - _RUNS_BEFORE)
    if new:
        print(f"\nA test wrote run folders into the checkout ({_ROOT_RUNS}): {new}; give it an output_dir "
              "or a working directory under tmp_path.")
        session.exitstatus = 1


# ---- fixtures shared by several folders -------------------------------------------------------


@pytest.fixture(scope="module")
def survivor():
    """The bad-input tests' demo session, one per test file (see tests/refusals.py): loaded before
    the file's first refusal, checked after each, unloaded after the file."""
    from tests.refusals import Survivor
    s = Survivor()
    yield s
    s.close()


@pytest.fixture
def fake_gpus(monkeypatch):
    """Returns ``start(kernel="k-test", *, cache=None, visible=None, order=None, cuda_up=False)``,
    which puts this test on 4 fake GPUs with nvkit's GPU selection as a fresh kernel has it: no
    choice pending or applied, the start-up CUDA variables unset, ``kernel_id()`` answering
    ``kernel``, CUDA started or not (``cuda_up``), ``CUDA_VISIBLE_DEVICES``/``CUDA_DEVICE_ORDER``
    set to ``visible``/``order`` (unset for None), ``NVKIT_CACHE`` at ``cache`` (left as it is for
    None). ``start`` returns the path the kernel's saved choice is kept at. Everything is undone
    after the test."""
    import importlib

    from nvkit.state import STATE
    selection = importlib.import_module("nvkit.hardware.selection")   # nvkit.selection is the function
    inventory = importlib.import_module("nvkit.hardware.inventory")

    def start(kernel: str = "k-test", *, cache=None, visible: str | None = None, order: str | None = None,
              cuda_up: bool = False):
        monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")
        if cache is not None:
            monkeypatch.setenv("NVKIT_CACHE", str(cache))
        for name, value in (("CUDA_VISIBLE_DEVICES", visible), ("CUDA_DEVICE_ORDER", order)):
            monkeypatch.setenv(name, value or "")       # records the original, so teardown restores it
            if value is None:
                monkeypatch.delenv(name)
        monkeypatch.setattr(selection, "_STARTUP", {selection.ORDER: None, selection.VISIBLE: None})
        monkeypatch.setattr(STATE, "pending_gpus", None)
        monkeypatch.setattr(STATE, "saved_gpus_applied", False)
        monkeypatch.setattr(selection, "cuda_initialized", lambda: cuda_up)
        monkeypatch.setattr(selection, "kernel_id", lambda: kernel)
        inventory._fake_sources.clear()
        return selection._saved_path(kernel)

    yield start
    inventory._fake_sources.clear()
