"""The first Load in a fresh kernel: ``nvkit.panel()``, the Model tab, Load. The load runs in a
worker thread while the main thread builds the tab and estimates (both import transformers);
two threads importing transformers at once could leave one with a half-imported module ("cannot
import name 'PreTrainedModel' from 'transformers'"). What the worker imports is imported before
it starts (nvkit.model.imports): here in twenty fresh kernels, and recorded import by import in
a fresh interpreter."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
from jupyter_client import KernelManager  # noqa: E402

KERNELS = 20
AT_ONCE = 2

# The tab switch and the click served back to back, as a kernel serves a quick click after
# opening the tab: the tab's estimate (queued for when the kernel is free) then runs in the main
# thread while the load's worker runs.
OPEN_AND_CLICK = "p.tabs.selected_index = 1\np.parts['Model'].load_button.click()"
WAIT = """\
import time
lp = p.parts['Model']
t0 = time.monotonic()
while (lp.job is None or not lp.job.settled) and time.monotonic() - t0 < 240:
    time.sleep(0.05)
print(json.dumps({"settled": bool(lp.job and lp.job.settled), "error": lp.error,
                  "loaded": nvkit.session(required=False) is not None, "status": lp.status.value}))
"""


def _one_fresh_load(env: dict) -> dict:
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=env["NVKIT_TEST_CWD"])
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        out, errors = [], []

        def hook(msg):
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

        kc.execute_interactive("import json, nvkit\np = nvkit.panel()\ndisplay(p)", timeout=120, output_hook=hook)
        kc.execute_interactive(OPEN_AND_CLICK, timeout=120, output_hook=hook)
        out.clear()
        kc.execute_interactive(WAIT, timeout=300, output_hook=hook)
        lines = [ln for ln in "".join(out).splitlines() if ln.startswith("{")]
        if errors or not lines:
            return {"error": "; ".join(errors) or "no answer from the kernel", "settled": False, "loaded": False}
        return json.loads(lines[-1])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_first_load_from_the_panel_works_in_twenty_fresh_kernels(tmp_path):
    env = dict(os.environ)
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVKIT_FAKE_GPUS"):
        env.pop(k, None)
    env.update(NVKIT_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", NVKIT_TEST_CWD=str(tmp_path),
               PYTHONUNBUFFERED="1")
    results: list = [None] * KERNELS
    todo = iter(range(KERNELS))
    lock = threading.Lock()

    def runner():
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = _one_fresh_load(env)
            except Exception as e:  # noqa: BLE001 - counted as a failed kernel, with its reason
                results[i] = {"error": f"{type(e).__name__}: {e}", "settled": False, "loaded": False}

    t0 = time.monotonic()
    threads = [threading.Thread(target=runner) for _ in range(AT_ONCE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(i, r) for i, r in enumerate(results) if not (r and r["settled"] and r["error"] is None and r["loaded"])]
    assert not failed, f"{len(failed)} of {KERNELS} fresh kernels failed the first Load: {failed}"
    assert all(r["status"].startswith("loaded") for r in results), results
    print(f"{KERNELS} fresh-kernel loads in {time.monotonic() - t0:.0f} s")


# Fresh interpreters, each in the order a kernel serves it: the panel is made inside a running
# event loop (so its estimate waits for the loop), the button is clicked, then the loop runs the
# estimate while the worker works. Every module import is recorded with the thread that did it.
RECORD = r"""
import asyncio, json, sys, threading
log = []
class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name not in sys.modules:
            log.append((threading.current_thread().name, name))
        return None
sys.meta_path.insert(0, Recorder())
heavy = ("torch", "transformers", "tokenizers", "safetensors", "accelerate", "huggingface_hub", "peft",
         "datasets", "pandas", "deepspeed", "bitsandbytes")

def report(error, worker, **more):
    got = sorted({n for t, n in log if t == worker and n in sys.modules and n.split(".")[0] in heavy})
    print(json.dumps({"error": error, "worker_imported": got, **more}))
"""
CASES = {
    # the Model tab's Load
    "load": """
from nvkit.ui.load_panel import LoadPanel

async def main():
    p = LoadPanel(device="cpu")
    p.load_button.click()
    while not p.job.settled:
        await asyncio.sleep(0.05)
    return p

p = asyncio.run(main())
report(p.error, "nvkit-load", estimate=p.estimate_html.value)
""",
    # the Generate tab with nothing loaded: its worker loads the demo model first
    "generate": """
from nvkit.ui.generate_panel import GeneratePanel

async def main():
    p = GeneratePanel()
    p.prompt.value, p.max_new_tokens.value = "NVIDIA GPUs are", 4
    p.generate_button.click()
    while not p.job.settled:
        await asyncio.sleep(0.05)
    return p

p = asyncio.run(main())
report(None if p.job.error is None else str(p.job.error), "nvkit-generate-panel")
""",
    # a fine-tune started from a cell: its worker builds the Trainer and the LoRA model
    "finetune": """
import os, tempfile
import nvkit
s = nvkit.load("demo", device_map="cpu")
log.clear()
run = nvkit.finetune(s, [{"prompt": "Which GPU?", "response": "An H200."}] * 4, max_steps=1, batch_size=2,
                     output_dir=os.path.join(tempfile.mkdtemp(), "run"))
err = run.job.error if run.job.wait_done(300) else "still running"
report(None if err is None else str(err), "nvkit-finetune")
""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_worker_finds_its_imports_done(tmp_path, case):
    env = dict(os.environ, HF_HUB_OFFLINE="1", NVKIT_CACHE=str(tmp_path / "cache"))
    env.pop("NVKIT_FAKE_GPUS", None)
    r = subprocess.run([sys.executable, "-c", RECORD + CASES[case]], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["error"] is None
    # torch, transformers, PEFT and the rest were imported by the thread that started the worker
    assert got["worker_imported"] == [], got["worker_imported"]
    if case == "load":
        assert "estimated before loading" in got["estimate"]
