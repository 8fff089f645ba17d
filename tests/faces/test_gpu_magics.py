"""GPU selection in real IPython kernels (jupyter_client), on 4 fake GPUs: ``%nvkit gpus/select``,
and a choice made after CUDA is up that comes back by itself when the kernel restarts — only in
that kernel."""

import json
import os
import queue
import subprocess
import sys

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
from jupyter_client import KernelManager  # noqa: E402

# "CUDA is initialised" inside the kernel, at the one boundary nvkit checks.
PRETEND_CUDA_UP = ("import importlib; importlib.import_module('nvkit.hardware.selection')"
                   ".cuda_initialized = lambda: True")


class Kernel:
    def __init__(self, env):
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=env["NVKIT_TEST_CWD"])
        self._connect()

    def _connect(self):
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=90)

    def run(self, code: str, timeout: float = 120) -> dict:
        """Run a cell; returns {'out': stdout, 'err': stderr, 'error': 'Name: value' or ''}."""
        got = {"out": "", "err": "", "error": "", "result": ""}

        def hook(msg):
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                got["out" if c["name"] == "stdout" else "err"] += c["text"]
            elif t == "error":
                got["error"] = f"{c['ename']}: {c['evalue']}"
            elif t == "execute_result":
                got["result"] += c["data"].get("text/plain", "")
        self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return got

    def restart(self):
        self.kc.stop_channels()
        self.km.restart_kernel(now=True)
        self._connect()
        # drain anything left from the old kernel
        try:
            while True:
                self.kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            pass

    def kernel_id(self) -> str:
        name = os.path.basename(self.km.connection_file)
        return name[len("kernel-"):-len(".json")] if name.startswith("kernel-") else name[:-5]

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        e.pop(k, None)
    e.update(NVKIT_FAKE_GPUS="4", NVKIT_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1",
             NVKIT_TEST_CWD=str(tmp_path), PYTHONUNBUFFERED="1")
    return e


@pytest.fixture
def kernel(env):
    k = Kernel(env)
    yield k
    k.close()


VIS = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"


def test_gpus_and_select_magics(kernel):
    assert kernel.run("%load_ext nvkit")["error"] == ""
    r = kernel.run("%nvkit gpus")
    assert r["error"] == "" and r["out"].count("NVIDIA H200 (fake)") == 4 + 4   # table + mapping
    assert "Hopper" in r["out"] and "00000000:18:00.0" in r["out"] and "all GPUs: in force" in r["out"]
    r = kernel.run("%nvkit gpus --json")
    assert [g["index"] for g in json.loads(r["out"])] == [0, 1, 2, 3]

    r = kernel.run("%nvkit select 2,0")
    assert "cuda:0 = GPU 2" in r["out"] and "cuda:1 = GPU 0" in r["out"], r
    assert kernel.run(VIS)["out"].strip() == "'2,0'"
    assert kernel.run("import os; print(os.environ['CUDA_DEVICE_ORDER'])")["out"].strip() == "PCI_BUS_ID"
    assert kernel.run("import nvkit; print(nvkit.launch_command('train.py'))")["out"].strip() == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 torchrun --nproc_per_node=2 train.py"

    assert "CPU only: in force" in kernel.run("%nvkit select cpu")["out"]
    assert kernel.run(VIS)["out"].strip() == "''"
    assert "all GPUs: in force" in kernel.run("%nvkit select all")["out"]
    assert kernel.run(VIS)["out"].strip() == "None"
    kernel.run("%nvkit select 3 1")
    assert kernel.run(VIS)["out"].strip() == "'3,1'"

    r = kernel.run("%nvkit select 9")
    assert "NvkitError" in r["err"] and "GPU 9 does not exist" in r["err"] and "Valid GPUs: 0 (" in r["err"]
    assert r["error"] == ""                                         # one line, no traceback
    r = kernel.run("%nvkit select")
    assert "needs a choice" in r["err"]
    assert kernel.run(VIS)["out"].strip() == "'3,1'"               # errors change nothing
    assert "select" in kernel.run("%nvkit")["out"]                  # listed in the usage


def test_choice_made_after_cuda_init_comes_back_after_restart(kernel, env, tmp_path):
    r = kernel.run("import nvkit\nnvkit.select_gpus([1])\n" + PRETEND_CUDA_UP + "\n"
                   "s = nvkit.select_gpus([2, 0]); print(s.restart_needed, s.saved)")
    assert r["error"] == "" and r["out"].split() == ["True", "True"], r
    assert "already initialised" in r["err"] and "restart" in r["err"]
    assert kernel.run(VIS)["out"].strip() == "'1'"                 # never pretends
    saved = tmp_path / "cache" / "selections" / f"kernel-{kernel.kernel_id()}.json"
    assert saved.exists()

    # an unrelated kernel and an unrelated script do not pick it up
    other = Kernel(env)
    try:
        r = other.run("import nvkit; " + VIS)
        assert r["out"].strip() == "None" and "applied" not in r["out"]
    finally:
        other.close()
    p = subprocess.run([sys.executable, "-c", "import nvkit; " + VIS], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "None" and "applied" not in p.stdout, p.stderr
    assert saved.exists()

    kernel.restart()
    r = kernel.run("import nvkit; " + VIS + "\nprint(nvkit.selection().choice)")
    assert "nvkit: applied the GPU choice saved before this kernel restarted" in r["out"], r
    assert "cuda:0=GPU 2, cuda:1=GPU 0" in r["out"]
    assert r["out"].strip().splitlines()[-2:] == ["'2,0'", "(2, 0)"]
    assert not saved.exists()                                      # applied once, then gone

    kernel.restart()
    r = kernel.run("import nvkit; " + VIS)
    assert r["out"].strip() == "None"                              # a later restart is clean


def test_load_ext_first_also_applies_it(kernel, tmp_path):
    r = kernel.run("%load_ext nvkit\n" + PRETEND_CUDA_UP + "\n%nvkit select cpu")
    assert "takes effect only after a restart" in r["err"], r
    kernel.restart()
    r = kernel.run("%load_ext nvkit")
    assert "applied the GPU choice saved" in r["out"] and "CUDA_VISIBLE_DEVICES=" in r["out"], r
    assert kernel.run(VIS)["out"].strip() == "''"
    assert "CPU only: in force" in kernel.run("%nvkit gpus")["out"]


def test_saved_choice_waits_when_cuda_came_first(kernel, tmp_path):
    kernel.run("import nvkit\n" + PRETEND_CUDA_UP + "\nnvkit.select_gpus([3])")
    kernel.restart()
    # torch initialised CUDA before nvkit was imported: a stand-in torch at the real boundary
    r = kernel.run("import sys, types\n"
                   "sys.modules['torch'] = types.SimpleNamespace(cuda=types.SimpleNamespace("
                   "is_initialized=lambda: True))\n"
                   "import nvkit\n" + VIS)
    assert "NOT applied" in r["err"] and r["out"].strip() == "None", r
    assert (tmp_path / "cache" / "selections" / f"kernel-{kernel.kernel_id()}.json").exists()
