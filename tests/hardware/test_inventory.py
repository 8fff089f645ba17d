"""GPU discovery: the NVML reader (against a stand-in pynvml), the fake inventory, and the promise
that discovery never touches CUDA."""

import importlib
import json
import subprocess
import sys
import types

import pytest

from nvkit.errors import NvkitError

G = importlib.import_module("nvkit.hardware.inventory")   # the module (nvkit.gpus is the function)

GIB = 2**30


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("NVKIT_FAKE_GPUS", raising=False)
    G._fake_sources.clear()
    yield
    G._fake_sources.clear()


# --- a stand-in for pynvml, so the real NVML code path runs without a driver -------------------

class _Err(Exception):
    def __init__(self, value):
        self.value = value
        super().__init__(f"NVML error {value}")


def fake_pynvml(n=2, init_error=None, procs=None):
    nv = types.SimpleNamespace(NVMLError=_Err, NVML_ERROR_LIBRARY_NOT_FOUND=12,
                               NVML_ERROR_DRIVER_NOT_LOADED=9, NVML_ERROR_NO_PERMISSION=4)

    def init():
        if init_error is not None:
            raise _Err(init_error)
    nv.nvmlInit = init
    nv.nvmlDeviceGetCount = lambda: n
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h[1]:02x}:00.0".encode())
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd"
    nv.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-80GB" if h[1] == 0 else "NVIDIA L4"
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0) if h[1] == 0 else (8, 9)
    nv.nvmlDeviceGetArchitecture = lambda h: 7
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1) if h[1] == 0 else (_ for _ in ()).throw(_Err(3))
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=80 * GIB, used=(1 + h[1]) * GIB,
                                                                free=(79 - h[1]) * GIB)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37)
    procs = procs or {}
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: procs.get(h[1], [])
    nv.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    nv.nvmlSystemGetDriverVersion = lambda: "580.82"
    nv.nvmlSystemGetNVMLVersion = lambda: "13.580.82"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 13000
    return nv


@pytest.fixture
def with_nvml(monkeypatch):
    def install(nv):
        monkeypatch.setitem(sys.modules, "pynvml", nv)
        monkeypatch.setattr(G, "_nvml_source", G._NvmlSource())
    return install


def test_nvml_reader_fills_every_field(with_nvml):
    proc = types.SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB)
    hidden = types.SimpleNamespace(pid=4343, usedGpuMemory=None)   # containers: NVML can't say
    with_nvml(fake_pynvml(procs={0: [proc, hidden]}))
    gs = G.gpus()
    assert [g.index for g in gs] == [0, 1]
    a100, l4 = gs
    assert a100.name == "NVIDIA A100-SXM4-80GB" and a100.pci_bus_id == "00000000:18:00.0"
    assert a100.uuid.startswith("GPU-00000000")
    assert (a100.memory_total, a100.memory_used, a100.memory_free) == (80 * GIB, GIB, 79 * GIB)
    assert a100.utilization == 37 and a100.capability == (8, 0) and a100.architecture == "Ampere"
    assert a100.mig_mode is True and l4.mig_mode is None          # NotSupported -> None
    assert l4.architecture == "Ada" and l4.capability_str == "8.9"
    assert [(p.pid, p.used_memory) for p in a100.processes] == [(4242, 3 * GIB), (4343, None)]
    assert G.gpus(processes=False)[0].processes == ()
    d = a100.to_dict()
    json.dumps(d)
    for key in ("index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used", "memory_free",
                "utilization", "capability", "architecture", "mig_mode", "processes"):
        assert key in d
    assert d["capability"] == [8, 0] and d["processes"][0]["used_memory"] == 3 * GIB
    st = G.nvml_status()
    assert st.ok and st.source == "nvml" and st.count == 2
    assert st.driver_version == "580.82" and st.cuda_driver_version == "13.0"
    assert "2 GPU(s)" in str(st)


def test_nvml_init_runs_once_and_static_info_is_cached(with_nvml):
    nv = fake_pynvml()
    calls = {"init": 0, "name": 0}
    init, name = nv.nvmlInit, nv.nvmlDeviceGetName

    def counted_init():
        calls["init"] += 1
        init()

    def counted_name(h):
        calls["name"] += 1
        return name(h)
    nv.nvmlInit, nv.nvmlDeviceGetName = counted_init, counted_name
    with_nvml(nv)
    for _ in range(5):
        G.gpus()
    assert calls == {"init": 1, "name": 2}


@pytest.mark.parametrize("code,words", [(12, "no NVIDIA driver"), (9, "not loaded"), (4, "permission")])
def test_without_a_driver_the_list_is_empty_and_the_status_says_why(with_nvml, code, words):
    with_nvml(fake_pynvml(init_error=code))
    assert G.gpus() == []
    st = G.nvml_status()
    assert not st.ok and st.count == 0 and st.source == "none"
    assert words in st.reason
    assert "No GPUs" in G.format_table()


def test_missing_pynvml_is_explained(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)      # import pynvml -> ImportError
    monkeypatch.setattr(G, "_nvml_source", G._NvmlSource())
    assert G.gpus() == []
    assert "nvidia-ml-py" in G.nvml_status().reason


def test_on_this_machine_without_driver_gpus_is_empty_or_real():
    # Either NVML works (GPU machine) or the list is empty and the reason is given.
    gs = G.gpus()
    st = G.nvml_status()
    assert st.ok == bool(gs) and st.count == len(gs)
    if not gs:
        assert st.reason


# --- the fake inventory --------------------------------------------------------------------------

def test_fake_gpus_number(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")
    gs = G.gpus()
    assert [g.index for g in gs] == [0, 1, 2, 3]
    assert all(g.fake and "H200" in g.name and g.architecture == "Hopper" and g.capability == (9, 0)
               for g in gs)
    assert len({g.uuid for g in gs}) == 4 and all(g.uuid.startswith("GPU-") for g in gs)
    buses = [g.pci_bus_id for g in gs]
    assert buses == sorted(buses) and len(set(buses)) == 4     # nvidia-smi order is PCI bus order
    for g in gs:
        assert g.memory_total == 143771 * 2**20
        assert g.memory_used + g.memory_free == g.memory_total
        assert 512 * 2**20 <= g.memory_used <= (512 + 256 * 3 + 64) * 2**20
        assert 0 <= g.utilization <= 4
    # stable identity across calls and processes
    assert [g.uuid for g in G.gpus()] == [g.uuid for g in gs]
    st = G.nvml_status()
    assert st.ok and st.source == "fake" and st.count == 4 and "NVKIT_FAKE_GPUS" in st.reason


def test_fake_memory_moves_a_little_over_time(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")
    src = G._source()
    seen = set()
    for t in range(0, 20, 2):
        monkeypatch.setattr(G.time, "monotonic", lambda t=t: src._t0 + t)
        seen.add(G.gpus()[0].memory_used)
    assert len(seen) > 2 and max(seen) - min(seen) <= 64 * 2**20


def test_fake_gpus_from_json(monkeypatch, tmp_path):
    spec = [
        {"name": "NVIDIA RTX 4090", "memory_total": 24 * GIB, "memory_used": 2 * GIB,
         "capability": "8.9", "utilization": 50, "processes": [{"pid": 7, "used_memory": GIB, "name": "python"}]},
        {"name": "Tesla T4", "memory_total": 16 * GIB, "capability": [7, 5], "mig_mode": None},
        {},
    ]
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(spec))
    monkeypatch.setenv("NVKIT_FAKE_GPUS", str(path))
    a, b, c = G.gpus()
    assert (a.name, a.architecture, a.memory_used, a.memory_free, a.utilization) == \
        ("NVIDIA RTX 4090", "Ada", 2 * GIB, 22 * GIB, 50)
    assert a.processes[0].pid == 7 and a.processes[0].name == "python"
    assert b.architecture == "Turing" and b.capability == (7, 5) and b.mig_mode is None
    assert "H200" in c.name                           # missing fields come from the template
    assert "python" in G.format_table()


@pytest.mark.parametrize("spec", ["lots", "/no/such/file.json", "[1, 2]"])
def test_bad_fake_spec_is_a_clear_error(monkeypatch, spec):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", spec)
    with pytest.raises(NvkitError, match="NVKIT_FAKE_GPUS"):
        G.gpus()
    assert not G.nvml_status().ok


def test_architecture_names():
    assert G.architecture_name((7, 5)) == "Turing"
    assert G.architecture_name((8, 6)) == "Ampere"
    assert G.architecture_name((8, 9)) == "Ada"
    assert G.architecture_name((9, 0)) == "Hopper"
    assert G.architecture_name((10, 0)) == "Blackwell" and G.architecture_name((12, 0)) == "Blackwell"
    assert G.architecture_name(None, 9) == "Hopper"
    assert G.architecture_name(None) == "unknown"


def test_format_table(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")
    table = G.format_table()
    lines = table.splitlines()
    assert len(lines) == 3 and lines[0].startswith("#") and "bus id" in lines[0]
    assert "Hopper" in lines[1] and "00000000:18:00.0" in lines[1]


# --- never CUDA ----------------------------------------------------------------------------------

def _run(code: str, **env):
    import os
    e = dict(os.environ, **env)
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        e.pop(k, None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_discovery_neither_imports_torch_nor_initialises_cuda():
    out = _run("import sys, nvkit\n"
               "gs = nvkit.gpus(); s = nvkit.selection(); nvkit.select_gpus(None)\n"
               "print('torch' in sys.modules)\n"
               "import torch\n"
               "nvkit.gpus(); nvkit.selection(); nvkit.launch_command('t.py')\n"
               "print(torch.cuda.is_initialized())", NVKIT_FAKE_GPUS="2")
    assert out.split() == ["False", "False"]
    out = _run("import sys, nvkit; nvkit.gpus(); print('torch' in sys.modules)")
    assert out.strip() == "False"


def test_public_names_are_the_functions_after_any_use():
    # nvkit.gpus / nvkit.selection are also submodule names; the package must keep the functions.
    out = _run("import nvkit\n"
               "nvkit.select_gpus([1]); nvkit.launch_command('t.py')\n"
               "from nvkit.ui.gpu_selector import GPUSelector\n"
               "print(callable(nvkit.gpus), callable(nvkit.selection), len(nvkit.gpus()),\n"
               "      nvkit.selection().choice)", NVKIT_FAKE_GPUS="2")
    assert out.split() == ["True", "True", "2", "(1,)"]
