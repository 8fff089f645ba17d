"""``nvkit doctor`` on a CPU-only machine: clear, and exit 0."""

import json
import os
import subprocess
import sys


def _nvkit(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "nvkit.cli", *args], capture_output=True, text=True, env=e, timeout=300)


def test_doctor_cpu_only_says_so_and_exits_0():
    r = _nvkit("doctor", env={"NVKIT_FAKE_GPUS": ""})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "torch.cuda.is_available() = False" in out
    assert "No CUDA GPU is visible here" in out
    for pkg in ("torch", "transformers", "peft", "kernels", "bitsandbytes"):
        assert pkg in out


def test_doctor_json_is_machine_readable():
    r = _nvkit("doctor", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["cuda_available"] is False and data["cuda_device_count"] == 0
    assert data["versions"]["transformers"].startswith("5.")


def test_unknown_subcommand_fails_with_usage():
    r = _nvkit("frobnicate")
    assert r.returncode != 0 and "invalid choice" in r.stderr
