"""Runs Triton kernels on the CPU: ``interpret(code)`` runs ``code`` in a child process with
TRITON_INTERPRET=1, which must be set before triton is imported (hence the child process), and
returns its output; a failing child fails the test with the child's output."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def interpret(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout


def refused(call, what: str = "a wrong shape") -> str:
    """For a child's code: ``call()`` must raise ValueError. Prints "refused: <message>" (the
    parent counts those lines) and returns the message; raises AssertionError if ``what`` passed."""
    try:
        call()
    except ValueError as e:
        print("refused:", e)
        return str(e)
    raise AssertionError(f"{what} was accepted")
