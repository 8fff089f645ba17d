"""On a real GPU: two real kernels of a real Jupyter server, each loading the demo model on cuda, one
holding 2 GiB more. ``GET nvkit/api/gpus`` must put each kernel's memory on the right kernel: NVML's
figure per kernel against ``torch.cuda.memory_reserved()`` printed inside that kernel, and the
reserve its report file carries. Then "Unload model" through the comm gives memory back.

Run with ``-s`` to see the figures side by side."""

from __future__ import annotations

import json

import pytest


from tests.server.kernel_sessions import gpus, notebooks, open_unload_comm, wait_for  # noqa: F401

GIB = 2**30
EXTRA = 2 * GIB
# NVML counts the CUDA context, cuBLAS workspaces and the allocator's reserve; the context of a
# Hopper GPU with torch's kernels loaded is several hundred MiB
CONTEXT_MAX = 3 * GIB

LOAD = """
import json, torch, nvkit
s = nvkit.load('demo', device_map='cuda')
s.generate('NVIDIA GPUs are', max_new_tokens=16)
{extra}
torch.cuda.synchronize()
p = torch.cuda.get_device_properties(0)
print(json.dumps({{"reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(),
                  "uuid": str(p.uuid), "bus": f"{{p.pci_domain_id:08X}}:{{p.pci_bus_id:02X}}:{{p.pci_device_id:02X}}.0"}}))
"""
FIGURES = """
import json, torch
torch.cuda.synchronize()
print(json.dumps({"reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated()}))
"""


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"nvkit": True}}}


def gib(n) -> str:
    return "?" if n is None else f"{n / GIB:.3f} GiB"


def entry(gs: list[dict], kid: str) -> tuple[dict, dict] | None:
    for g in gs:
        for k in g.get("kernels") or []:
            if k["id"] == kid:
                return g, k
    return None


def field(gs: list[dict], kid: str, key: str):
    e = entry(gs, kid)
    return None if e is None else e[1][key]


async def test_two_kernels_on_one_gpu_are_told_apart(jp_fetch, notebooks, monkeypatch):  # noqa: F811
    monkeypatch.delenv("NVKIT_FAKE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")        # both on GPU 0
    kid_a, pid_a, run_a = await notebooks("a.ipynb")
    kid_b, pid_b, run_b = await notebooks("b.ipynb")
    inside = {
        kid_a: json.loads((await run_a(LOAD.format(extra=""), timeout=600)).strip().splitlines()[-1]),
        kid_b: json.loads((await run_b(LOAD.format(
            extra=f"x = torch.empty({EXTRA}, dtype=torch.uint8, device='cuda')"),
            timeout=600)).strip().splitlines()[-1]),
    }
    gs = await wait_for(jp_fetch, lambda gs: all(field(gs, kid, "reserved") is not None
                                                  for kid in inside), 60)
    # fresh figures from inside, now that the route has answered
    inside[kid_a].update(json.loads((await run_a(FIGURES)).strip()))
    inside[kid_b].update(json.loads((await run_b(FIGURES)).strip()))
    gs = await wait_for(jp_fetch, lambda gs: all(field(gs, kid, "reserved") == inside[kid]["reserved"]
                                                  for kid in inside), 30)

    print("\nkernel  pid      found by  route NVML      route reserved  torch reserved  "
          "torch allocated  NVML - reserved")
    rows = {}
    for label, kid, pid in (("a", kid_a, pid_a), ("b", kid_b, pid_b)):
        found = entry(gs, kid)
        assert found is not None, f"kernel {label} is on no GPU: {gs}"
        g, k = found
        t = inside[kid]
        rows[label] = (g, k, t)
        print(f"{label:6}  {pid:<7}  {k['matched_by']:8}  {gib(k['memory']):14}  {gib(k['reserved']):14}  "
              f"{gib(t['reserved']):14}  {gib(t['allocated']):15}  "
              f"{gib(None if k['memory'] is None else k['memory'] - t['reserved'])}")
    # by pid where NVML's pids are this machine's; by the report files inside a container (NVML
    # lists host pids there), where the 2 GiB difference is what tells the two apart
    nvml_seen = all(r[1]["memory"] is not None for r in rows.values())
    if not nvml_seen:
        print("NVML lists no process of these kernels (a container without host pids?): "
              "the route can show only what each kernel reports")
    for label, (g, k, t) in rows.items():
        assert k["matched_by"] in ("pid", "report")
        assert g["index"] == 0
        assert k["notebook"] == f"{label}.ipynb"
        assert k["reserved"] == t["reserved"] and k["allocated"] == t["allocated"]
        if nvml_seen:
            assert t["reserved"] <= k["memory"] <= t["reserved"] + CONTEXT_MAX
        # the report's device is NVML's GPU: what attribution inside a container relies on
        assert g["uuid"].lower().endswith(t["uuid"].lower()) or g["pci_bus_id"] == t["bus"]
        assert k["model"] == {"id": "demo", "loaded": True, "device": "cuda:0"}
    (_, a, _), (_, b, _) = rows["a"], rows["b"]
    if nvml_seen:
        assert abs((b["memory"] - a["memory"]) - EXTRA) < GIB // 2, (a["memory"], b["memory"])

    # "Unload model" on b (its extra tensor dropped first, so the allocator holds it as cache): the
    # unload frees the model, empties the cache, and the route sees the memory come back
    await run_b("del x")
    reply = await open_unload_comm(run_b.client)
    assert reply["ok"] and reply["freed"] > 0, reply
    after = json.loads((await run_b(FIGURES)).strip())
    gs = await wait_for(jp_fetch, lambda gs: field(gs, kid_b, "reserved") == after["reserved"]
                        and entry(gs, kid_b)[1]["model"] is None, 30)
    _, b_after = entry(gs, kid_b)
    print(f"b after unload: route NVML {gib(b_after['memory'])}, reserved {gib(b_after['reserved'])} "
          f"(torch {gib(after['reserved'])}); freed {gib(reply['freed'])}")
    if nvml_seen:
        assert b["memory"] - b_after["memory"] >= EXTRA - GIB // 4
    assert after["reserved"] < inside[kid_b]["reserved"]
