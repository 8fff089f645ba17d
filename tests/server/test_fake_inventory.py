"""The fake inventory as the server tests use it: ``NVKIT_FAKE_GPUS=@file`` follows the file, fake
processes are checked, a container-style process finds its GPUs, and process names are told only
for the user's own processes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess

import pytest

from nvkit import NvkitError

G = importlib.import_module("nvkit.hardware.inventory")
GIB = 2**30


@pytest.fixture
def inventory(tmp_path, monkeypatch):
    path = tmp_path / "gpus.json"

    def put(gpus) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(gpus))
        os.replace(tmp, path)

    put([{}])
    monkeypatch.setenv("NVKIT_FAKE_GPUS", f"@{path}")
    return put


def test_at_file_is_read_again_when_it_changes(inventory):
    assert len(G.gpus()) == 1 and G.gpus()[0].processes == ()
    inventory([{"memory_used": GIB, "processes": [{"pid": 12, "used_memory": GIB // 2}]}, {}])
    a, b = G.gpus()
    assert [(p.pid, p.used_memory, p.name, p.kind) for p in a.processes] == \
        [(12, GIB // 2, None, "compute")]
    assert a.memory_used == GIB and G.memory_used(0) == GIB
    inventory([])
    assert G.gpus() == []


def test_listed_processes_count_in_the_used_memory(inventory):
    inventory([{"processes": []}])
    base = G.gpus()[0].memory_used
    inventory([{"processes": [{"pid": 5, "used_memory": 3 * GIB}]}])
    assert G.gpus()[0].memory_used - base >= 3 * GIB - 64 * 2**20     # the base drifts a little


@pytest.mark.parametrize("proc,word", [
    ({"used_memory": 1}, "pid"),
    ({"pid": "12"}, "pid"),
    ({"pid": -1}, "pid"),
    ({"pid": 1, "used_memory": "1GB"}, "used_memory"),
    ({"pid": 1, "name": 5}, "name"),
    ({"pid": 1, "kind": "mystery"}, "kind"),
    ({"pid": 1, "container_pid": True}, "container_pid"),
    ("1234", "object"),
])
def test_a_bad_fake_process_is_a_clear_error(inventory, proc, word):
    inventory([{"processes": [proc]}])
    with pytest.raises(NvkitError, match="NVKIT_FAKE_GPUS") as e:
        G.gpus()
    assert word in str(e.value)
    inventory([{"processes": [{"pid": 1}]}])               # fixed: usable again
    assert G.gpus()[0].processes[0].pid == 1


def test_a_missing_at_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", f"@{tmp_path / 'nope.json'}")
    with pytest.raises(NvkitError, match="NVKIT_FAKE_GPUS"):
        G.gpus()
    assert not G.nvml_status().ok


def test_a_container_pid_finds_its_gpus(inventory):
    me = os.getpid()
    inventory([{"processes": [{"pid": 4_000_001, "container_pid": me}]},
               {"processes": [{"pid": 4_000_002}]},
               {"processes": [{"pid": me}]}])
    assert [g.index for g in G.fake_gpus_of()] == [0, 2]
    assert [g.index for g in G.fake_gpus_of(4_000_002)] == [1]
    # NVML has no such field: the process list shows only the host pid
    assert [p.pid for p in G.gpus()[0].processes] == [4_000_001]


def test_no_fake_inventory_no_fake_gpus(monkeypatch):
    monkeypatch.delenv("NVKIT_FAKE_GPUS", raising=False)
    assert G.fake_gpus_of() == []


def test_process_names_only_for_own_processes():
    assert G.is_own_process(os.getpid())
    assert G._process_name(os.getpid())
    assert not G.is_own_process(4_000_003)
    if os.geteuid() == 0:
        p = subprocess.Popen(["sleep", "30"], user=65534, group=65534)
        try:
            assert not G.is_own_process(p.pid)
            assert G._process_name(p.pid) is None
        finally:
            p.kill()
            p.wait()
    elif os.stat("/proc/1").st_uid != os.geteuid():
        assert G._process_name(1) is None
