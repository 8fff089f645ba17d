"""GPU discovery and selection against the real driver (marked ``gpu`` by tests/gpu/conftest.py;
skipped with the reason when CUDA is absent).

Every selection check runs in a fresh subprocess: CUDA_VISIBLE_DEVICES only counts before the
process initialises CUDA, and this pytest process already has (conftest asks torch).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest


pytestmark = pytest.mark.gpu


def child_env():
    env = dict(os.environ)
    for k in ("NVKIT_FAKE_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        env.pop(k, None)
    env["HF_HUB_OFFLINE"] = "1"
    return env


# defined in every child; imports torch only when called, so a choice made first still counts
PRELUDE = """
import json, os
def bus(i):
    import torch
    p = torch.cuda.get_device_properties(i)
    return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
"""


def run_py(code: str) -> dict:
    """Run ``code`` in a new Python; it must print one JSON line last."""
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=child_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def real_gpus():
    found = run_py("import json, nvkit; print(json.dumps([g.to_dict() for g in nvkit.gpus()]))")
    if not found:
        from nvkit.hardware.inventory import nvml_status
        pytest.skip(f"NVML sees no GPU: {nvml_status()}")
    return found


def norm_bus(b: str) -> str:
    # nvidia-smi and NVML agree on "00000000:18:00.0"; compare without case or domain width games
    dom, rest = b.strip().split(":", 1)
    return f"{int(dom, 16):08X}:{rest.upper()}"


def test_gpus_match_nvidia_smi(real_gpus):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run([smi, "--query-gpu=index,pci.bus_id,uuid,name,memory.total",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True, env=child_env()).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    assert [int(r[0]) for r in rows] == [g["index"] for g in real_gpus]
    assert [norm_bus(r[1]) for r in rows] == [norm_bus(g["pci_bus_id"]) for g in real_gpus]
    assert [r[2] for r in rows] == [g["uuid"] for g in real_gpus]
    assert [r[3] for r in rows] == [g["name"] for g in real_gpus]
    assert [int(r[4]) for r in rows] == [g["memory_total"] // 2**20 for g in real_gpus]
    for g in real_gpus:
        assert g["capability"] and g["architecture"] != "unknown"
        assert g["memory_used"] + g["memory_free"] <= g["memory_total"]


def test_discovery_creates_no_cuda_context(real_gpus):
    r = run_py("""
        import json, importlib, torch, nvkit
        sel = importlib.import_module('nvkit.hardware.selection')
        gs = nvkit.gpus(); nvkit.selection(); nvkit.launch_command('t.py'); nvkit.select_gpus([0])
        before = [torch.cuda.is_initialized(), sel.cuda_initialized()]
        torch.cuda.is_available()              # runs cuInit, yet torch.cuda.is_initialized() stays False
        after = [torch.cuda.is_initialized(), sel.cuda_initialized()]
        print(json.dumps({"n": len(gs), "before": before, "after": after}))
    """)
    assert r["n"] == len(real_gpus)
    assert r["before"] == [False, False]
    assert r["after"] == [False, True], "nvkit must notice the driver init that is_available() does"


def test_select_one_gpu_torch_sees_exactly_it(real_gpus):
    last = real_gpus[-1]
    r = run_py(f"""
        import nvkit
        nvkit.select_gpus([{last['index']}])
        import torch
        torch.zeros(1, device="cuda")
        m = nvkit.selection()
        print(json.dumps({{"n": torch.cuda.device_count(), "bus": bus(0),
                          "mapped": m.choice, "cuda": m.cuda_initialized}}))
    """)
    assert r["n"] == 1
    assert norm_bus(r["bus"]) == norm_bus(last["pci_bus_id"])
    assert r["mapped"] == [last["index"]] and r["cuda"] is True


def test_cpu_only_torch_sees_none(real_gpus):
    r = run_py("""
        import json, nvkit
        nvkit.select_gpus([])
        import torch
        print(json.dumps({"avail": torch.cuda.is_available(), "n": torch.cuda.device_count()}))
    """)
    assert r == {"avail": False, "n": 0}


def test_reversed_order_cuda0_is_gpu1(real_gpus):
    if len(real_gpus) < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {len(real_gpus)}")
    r = run_py("""
        import nvkit
        nvkit.select_gpus([1, 0])
        import torch
        print(json.dumps({"n": torch.cuda.device_count(), "bus": [bus(0), bus(1)],
                          "line": nvkit.launch_command("train.py")}))
    """)
    assert r["n"] == 2
    assert [norm_bus(b) for b in r["bus"]] == [norm_bus(real_gpus[1]["pci_bus_id"]),
                                              norm_bus(real_gpus[0]["pci_bus_id"])]
    assert r["line"] == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1,0 torchrun --nproc_per_node=2 train.py"


def test_after_cuda_init_a_new_choice_waits_for_a_restart(real_gpus):
    other = "[1]" if len(real_gpus) > 1 else "[]"
    r = run_py(f"""
        import json, os, nvkit, torch
        nvkit.select_gpus([0])
        torch.zeros(1, device="cuda")
        s = nvkit.select_gpus({other})
        now = nvkit.selection()
        print(json.dumps({{"restart": s.restart_needed, "in_force": s.in_force,
                          "env": os.environ["CUDA_VISIBLE_DEVICES"], "now": now.choice,
                          "pending": now.pending.choice if now.pending else "none",
                          "n": torch.cuda.device_count()}}))
    """)
    assert r["restart"] is True and r["in_force"] is False
    assert r["env"] == "0" and r["now"] == [0] and r["n"] == 1     # nothing pretended
    assert r["pending"] == json.loads(other)


def test_nvml_memory_and_processes_follow_an_allocation(real_gpus):
    r = run_py("""
        import json, os, nvkit, torch
        nvkit.select_gpus([0])
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        before = nvkit.gpus()[0].memory_used
        x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
        g = nvkit.gpus()[0]
        mine = [p.used_memory for p in g.processes if p.pid == os.getpid()]
        print(json.dumps({"delta": g.memory_used - before, "mine": mine}))
    """)
    assert r["delta"] >= 2 * 2**30 - 64 * 2**20
    # NVML lists our process with its memory where the container lets it see our pid
    if r["mine"] and r["mine"][0] is not None:
        assert r["mine"][0] >= 2 * 2**30


def test_a_launch_with_more_processes_than_gpus_is_refused_before_it_starts(tmp_path):
    import torch

    import nvkit
    from nvkit.errors import NvkitError
    from tests import demo_model
    n = torch.cuda.device_count()
    for start in (lambda: nvkit.launch_generate(["Hi"], model=demo_model.path(), nproc_per_node=n + 1,
                                                run_dir=str(tmp_path / "gen")),
                  lambda: nvkit.launch({"model": demo_model.path(), "data": ["a b c", "d e f"], "max_steps": 1},
                                       nproc_per_node=n + 1, run_dir=str(tmp_path / "train"))):
        with pytest.raises(NvkitError, match=rf"nproc_per_node={n + 1} starts one process per GPU, but {n} GPU"):
            start()
    assert not (tmp_path / "gen").exists() and not (tmp_path / "train").exists()
    run = nvkit.launch_generate(["Hi"], model=demo_model.path(), nproc_per_node=1, max_new_tokens=4,
                                run_dir=str(tmp_path / "one"))
    assert len(run.result(timeout=300).texts) == 1
