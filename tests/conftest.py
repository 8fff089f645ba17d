"""Shared test setup: never reach the Hub, keep nvkit's caches inside the test run."""

import os

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
