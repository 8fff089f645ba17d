"""Whose GPU memory is it: ``GET nvkit/api/gpus`` maps a fake inventory's processes (``NVKIT_FAKE_GPUS=@file``,
re-read on each request) to real kernels of a real in-process Jupyter server, by pid, by a child's
pid, and by the kernels' report files (container-style pids that match nothing here); stale reports
count for nothing; other users' process names are never sent; no credentials, no answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time

import pytest

from nvkit.server import attribution
from tests.server.helpers import NO_AUTH, fetch_error
from tests.server.kernel_sessions import gpus, notebooks, open_unload_comm, wait_for  # noqa: F401  (fixture)

GIB = 2**30
UNUSED_PID = 4_000_000        # above Linux's pid_max (4194304 at most) minus headroom: never a live pid here


@pytest.fixture
def inventory(tmp_path, monkeypatch):
    """``put([gpu, ...])`` rewrites the fake inventory the server reads on every request."""
    path = tmp_path / "gpus.json"

    def put(gpus: list[dict]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(gpus))
        os.replace(tmp, path)

    put([{"memory_used": GIB}, {"memory_used": GIB}])
    monkeypatch.setenv("NVKIT_FAKE_GPUS", f"@{path}")
    return put


def other_users_pid():
    """A live process of another user: started as nobody when we are root, else pid 1 if it is
    not ours."""
    if os.geteuid() == 0:
        p = subprocess.Popen(["sleep", "120"], user=65534, group=65534)
        return p.pid, p
    if os.stat("/proc/1").st_uid != os.geteuid():
        return 1, None
    pytest.skip("no process of another user to point at (not root, and pid 1 is ours)")


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# ---- attribution through the route ----------------------------------------------------------------

async def test_kernels_matched_by_pid_and_child_pid_with_their_notebooks(jp_fetch, inventory, notebooks):
    kid_a, pid_a, run_a = await notebooks("work/a.ipynb")
    kid_b, pid_b, _ = await notebooks("b.ipynb")
    child = int(await run_a("import subprocess\n_p = subprocess.Popen(['sleep', '120'])\n"
                            "print(_p.pid)"))
    me = os.getpid()
    inventory([
        {"memory_used": 4 * GIB, "processes": [
            {"pid": pid_a, "used_memory": 3 * GIB, "name": "python"},
            {"pid": me, "used_memory": GIB // 2, "name": "pytest-here"}]},
        {"memory_used": 7 * GIB, "processes": [
            {"pid": pid_b, "used_memory": 5 * GIB},
            {"pid": child, "used_memory": GIB}]},
    ])
    g0, g1 = await gpus(jp_fetch)
    assert [(k["id"], k["notebook"], k["memory"], k["pids"], k["matched_by"]) for k in g0["kernels"]] \
        == [(kid_a, "work/a.ipynb", 3 * GIB, [pid_a], "pid")]
    a = g0["kernels"][0]
    assert a["name"] == "python3" and a["session_type"] == "notebook"
    assert a["nvkit"] is False and a["model"] is None       # it never imported nvkit
    assert g0["other_processes"] == [{"pid": me, "used_memory": GIB // 2, "name": "pytest-here",
                                      "kind": "compute"}]
    # the child (e.g. a torchrun worker) counts for the kernel that started it
    assert [(k["id"], k["memory"], k["pids"]) for k in g1["kernels"]] == \
        [(kid_b, 5 * GIB, [pid_b]), (kid_a, GIB, [child])]
    assert g1["other_processes"] == []
    await run_a("_p.kill()")


async def test_report_files_attribute_container_pids_and_unload_through_the_comm(
        jp_fetch, inventory, notebooks):
    kid, pid, run = await notebooks("container.ipynb")
    host_pid = UNUSED_PID + 17
    inventory([
        {"memory_used": 2 * GIB, "processes": [{"pid": UNUSED_PID + 3, "used_memory": GIB}]},
        {"memory_used": 3 * GIB, "processes": [
            {"pid": host_pid, "container_pid": pid, "used_memory": 2 * GIB}]},
    ])
    g0, g1 = await gpus(jp_fetch)
    assert g1["kernels"] == [] and g1["other_processes"][0]["pid"] == host_pid   # no report yet

    out = await run("import nvkit, sys\nprint('torch' in sys.modules)")
    assert out.strip() == "False"          # the reporter imports no torch
    g0, g1 = await wait_for(jp_fetch, lambda gs: gs[1]["kernels"])
    assert (await run("print('torch' in sys.modules)")).strip() == "False"   # nor after reporting
    [k] = g1["kernels"]
    assert (k["id"], k["notebook"], k["memory"], k["pids"], k["matched_by"], k["nvkit"]) == \
        (kid, "container.ipynb", 2 * GIB, [host_pid], "report", True)
    assert k["model"] is None and k["reserved"] is None      # no torch, no model
    assert g1["other_processes"] == []
    assert g0["kernels"] == [] and [p["pid"] for p in g0["other_processes"]] == [UNUSED_PID + 3]

    report = run.report
    assert report.is_file()
    assert report.stat().st_mode & 0o777 == 0o600
    data = json.loads(report.read_text())
    assert data["pid"] == pid and data["kernel_id"] == kid

    await run("s = nvkit.load('demo')")
    g0, g1 = await wait_for(jp_fetch, lambda gs: any((k["model"] or {}).get("loaded") for k in gs[1]["kernels"]))
    assert g1["kernels"][0]["model"] == {"id": "demo", "loaded": True, "device": "cpu"}

    # the sidebar's "Unload model": a comm to the kernel's nvkit.unload target
    reply = await open_unload_comm(run.client)
    assert reply["ok"] is True and reply["model"] == "demo", reply
    assert isinstance(reply["freed"], int) and reply["freed"] >= 0
    assert (await run("print(s.loaded, nvkit.session(required=False))")).split() == ["False", "None"]
    g0, g1 = await wait_for(jp_fetch, lambda gs: all(k["model"] is None for k in gs[1]["kernels"]))
    assert g1["kernels"][0]["model"] is None
    # a second click has nothing to unload, and says so
    again = await open_unload_comm(run.client)
    assert again["ok"] is False and "No model" in again["message"]

    # the kernel ends: its report goes with it
    await jp_fetch("api", "kernels", kid, method="DELETE")
    deadline = time.monotonic() + 20
    while report.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not report.exists()


async def test_stale_and_foreign_report_files_count_for_nothing(jp_fetch, inventory, notebooks):
    kid, pid, run = await notebooks("stale.ipynb")    # never imports nvkit: no reporter of its own
    inventory([{"memory_used": 2 * GIB, "processes": [{"pid": UNUSED_PID + 5, "used_memory": GIB}]}])
    g = (await gpus(jp_fetch))[0]
    report = run.report

    def write(**changes):
        data = {"version": 1, "kernel_id": kid, "pid": pid, "updated": time.time(),
                "devices": [{"uuid": g["uuid"], "pci_bus_id": g["pci_bus_id"], "cuda_index": 0,
                             "reserved": GIB // 2, "allocated": GIB // 4}],
                "model": {"id": "demo", "loaded": True, "device": "cuda:0"}}
        data.update(changes)
        report.write_text(json.dumps(data))
        report.chmod(0o600)

    async def claimed() -> list:
        return (await gpus(jp_fetch))[0]["kernels"]

    write(pid=dead_pid())                           # left behind by a kernel process that died
    assert await claimed() == []
    write(kernel_id="not-this-kernel")              # about another kernel
    assert await claimed() == []
    write(pid=os.getpid())                          # a live process that is not this kernel
    assert await claimed() == []
    report.unlink()
    elsewhere = report.with_name("elsewhere.json")
    write()
    report.rename(elsewhere)
    report.symlink_to(elsewhere)                    # a link, not the kernel's own file
    assert await claimed() == []
    report.unlink()
    write()                                         # the same report from the live kernel counts
    [k] = await claimed()
    assert (k["id"], k["matched_by"], k["memory"], k["reserved"], k["allocated"]) == \
        (kid, "report", GIB, GIB // 2, GIB // 4)
    assert k["model"]["id"] == "demo"


async def test_another_users_process_names_are_not_sent(jp_fetch, inventory):
    other, proc = other_users_pid()
    try:
        inventory([{"processes": [
            {"pid": other, "used_memory": GIB, "name": "secret-training-run"},
            {"pid": os.getpid(), "used_memory": GIB, "name": "my-own-job"},
            {"pid": UNUSED_PID + 9, "used_memory": GIB, "name": "nobody-knows"}]}])
        r = await jp_fetch("nvkit", "api", "gpus")
        assert b"secret-training-run" not in r.body and b"nobody-knows" not in r.body
        g = json.loads(r.body)["gpus"][0]
        names = {p["pid"]: p["name"] for p in g["other_processes"]}
        assert names == {other: None, os.getpid(): "my-own-job", UNUSED_PID + 9: None}
        assert {p["pid"]: p["name"] for p in g["processes"]} == names
        assert all(p["used_memory"] == GIB for p in g["other_processes"])   # memory stays shown
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


async def test_without_credentials_no_kernels_are_revealed(jp_fetch, inventory, notebooks):
    kid, pid, _ = await notebooks("private/plans.ipynb")
    inventory([{"processes": [{"pid": pid, "used_memory": GIB, "name": "python"}]}])
    for headers in (NO_AUTH, {"Authorization": "token not-the-token"}):
        e = await fetch_error(jp_fetch("nvkit", "api", "gpus", headers=headers))
        assert e.code == 403
        assert kid.encode() not in e.response.body and b"plans" not in e.response.body
    assert (await gpus(jp_fetch))[0]["kernels"][0]["notebook"] == "private/plans.ipynb"


# ---- the pairing rules, on hand-made facts ---------------------------------------------------------

def _facts(n: int) -> list[attribution.KernelFacts]:
    return [attribution.KernelFacts(id=f"k{i}", name="python3", execution_state="idle", pid=None,
                                    connection_file=None, path=f"n{i}.ipynb") for i in range(n)]


def _report(i: int, reserved):
    return {"pid": 100 + i, "devices": [{"uuid": "GPU-x", "reserved": reserved}], "model": None}


def _gpu(*used):
    return {"uuid": "GPU-x", "pci_bus_id": "00000000:18:00.0",
            "processes": [{"pid": UNUSED_PID + i, "used_memory": u, "name": "p", "kind": "compute"}
                          for i, u in enumerate(used)]}


def _run(gpu, reports, visible=lambda pid: False):
    attribution.attribute([gpu], _facts(len(reports)), reports, is_own=lambda pid: False,
                          parent=lambda pid: None, visible=visible)
    return {k["id"]: (k["pids"], k["memory"]) for k in gpu["kernels"]}, gpu["other_processes"]


def test_two_reporting_kernels_pair_by_size():
    got, other = _run(_gpu(9 * GIB, 3 * GIB), {"k0": _report(0, 2 * GIB), "k1": _report(1, 8 * GIB)})
    assert got == {"k0": ([UNUSED_PID + 1], 3 * GIB), "k1": ([UNUSED_PID], 9 * GIB)}
    assert other == []


@pytest.mark.parametrize("used,reserved", [
    ((9 * GIB, 3 * GIB), (2 * GIB, None)),            # a figure unknown
    ((9 * GIB, 3 * GIB), (4 * GIB, 8 * GIB)),         # NVML below torch's reserve: not these pairs
    ((9 * GIB, 3 * GIB, GIB), (2 * GIB, 8 * GIB)),    # more processes than kernels
])
def test_ambiguous_pairs_stay_unpaired(used, reserved):
    got, other = _run(_gpu(*used), {f"k{i}": _report(i, r) for i, r in enumerate(reserved)})
    assert got == {f"k{i}": ([], None) for i in range(len(reserved))}   # shown, memory unknown
    assert len(other) == len(used)


def test_a_process_of_this_machine_is_never_paired_by_report():
    # its pid is a process here, and not the kernel's: NVML's pids are this machine's, so the
    # kernel's own pid would have matched had NVML listed it
    got, other = _run(_gpu(3 * GIB), {"k0": _report(0, 2 * GIB)}, visible=lambda pid: True)
    assert got == {"k0": ([], None)} and [p["pid"] for p in other] == [UNUSED_PID]
    got, other = _run(_gpu(3 * GIB), {"k0": _report(0, 2 * GIB)}, visible=lambda pid: False)
    assert got == {"k0": ([UNUSED_PID], 3 * GIB)} and other == []
