"""GPU discovery through NVML: what is in the machine, in nvidia-smi order, without touching CUDA.

NVML is the driver's management library (the one nvidia-smi uses). Reading it creates no CUDA
context, costs microseconds per call and ignores ``CUDA_VISIBLE_DEVICES``, so it always lists every
GPU of the machine with the nvidia-smi index that ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA use.

Everything NVML-specific sits behind one small "source" object (``_NvmlSource``), so that
``NVKIT_FAKE_GPUS`` can swap in a fake inventory (``_FakeSource``) for tests and demos while
selection, mapping, widgets and magics run their real code on top.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid as _uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import NvkitError
from ..units import fmt_bytes

FAKE_ENV = "NVKIT_FAKE_GPUS"

# compute capability (major, minor) -> architecture name; NVML's own arch enum is the fallback
_ARCH_BY_CC = {
    (3, 0): "Kepler", (3, 5): "Kepler", (3, 7): "Kepler",
    (5, 0): "Maxwell", (5, 2): "Maxwell", (5, 3): "Maxwell",
    (6, 0): "Pascal", (6, 1): "Pascal", (6, 2): "Pascal",
    (7, 0): "Volta", (7, 2): "Volta", (7, 5): "Turing",
    (8, 0): "Ampere", (8, 6): "Ampere", (8, 7): "Ampere", (8, 9): "Ada",
    (9, 0): "Hopper",
}
_ARCH_BY_NVML = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}


def architecture_name(capability: tuple[int, int] | None, nvml_arch: int | None = None) -> str:
    """'Hopper' for (9, 0), 'Blackwell' for 10.x/12.x, ...; 'unknown' when neither source says."""
    if capability:
        cc = tuple(capability)
        if cc in _ARCH_BY_CC:
            return _ARCH_BY_CC[cc]
        if cc[0] in (10, 11, 12):
            return "Blackwell"
    if nvml_arch in _ARCH_BY_NVML:
        return _ARCH_BY_NVML[nvml_arch]
    return "unknown"


@dataclass(frozen=True)
class GPUProcess:
    pid: int
    used_memory: int | None      # bytes; None where NVML can't say (containers, WDDM)
    name: str | None = None
    kind: str = "compute"        # "compute" or "graphics"


@dataclass(frozen=True)
class GPU:
    """One physical GPU as NVML (or the fake source) reports it. ``index`` is nvidia-smi's."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str              # "00000000:18:00.0", as nvidia-smi --query-gpu=pci.bus_id prints it
    memory_total: int            # bytes
    memory_used: int
    memory_free: int
    utilization: int | None      # GPU utilization %, None where unsupported
    capability: tuple[int, int] | None
    architecture: str
    mig_mode: bool | None        # None where the GPU has no MIG support
    processes: tuple[GPUProcess, ...] = field(default_factory=tuple)
    fake: bool = False

    @property
    def capability_str(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}" if self.capability else "?"

    def to_dict(self) -> dict:
        """A JSON-able dict (the server's ``nvkit/api/gpus`` route sends a list of these)."""
        d = asdict(self)
        d["capability"] = list(self.capability) if self.capability else None
        d["processes"] = [asdict(p) for p in self.processes]
        return d

    def __str__(self) -> str:
        return (f"GPU {self.index}: {self.name} ({self.architecture}, cc {self.capability_str}), "
                f"{fmt_bytes(self.memory_used)} / {fmt_bytes(self.memory_total)} used, "
                f"bus {self.pci_bus_id}")


@dataclass(frozen=True)
class NvmlStatus:
    """Why ``gpus()`` returns what it does (``nvkit doctor`` prints it)."""

    ok: bool
    source: str                  # "nvml", "fake" or "none"
    count: int
    reason: str                  # one sentence: what was found, or why nothing was
    driver_version: str | None = None
    cuda_driver_version: str | None = None   # highest CUDA the driver supports, e.g. "12.8"
    nvml_version: str | None = None

    def __str__(self) -> str:
        return self.reason




# --- NVML ---------------------------------------------------------------------------------------

class _NvmlSource:
    """The real driver, read through pynvml. Initialised on first use, once per process."""

    kind = "nvml"

    def __init__(self):
        self._lock = threading.Lock()
        self._tried = False
        self._error: str | None = None
        self._nvml = None
        self._static: dict[int, tuple] = {}   # index -> (handle, uuid, name, bus, cc, arch, mig)

    def _init(self):
        with self._lock:
            if self._tried:
                return self._nvml
            self._tried = True
            try:
                import pynvml
            except ImportError as e:
                self._error = (f"the nvidia-ml-py package is not installed ({e}); "
                               "pip install nvidia-ml-py")
                return None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                self._error = _explain_nvml_error(pynvml, e)
                return None
            except Exception as e:  # e.g. an OSError from a broken libnvidia-ml
                self._error = f"NVML could not start: {type(e).__name__}: {e}"
                return None
            self._nvml = pynvml
            return pynvml

    def error(self) -> str | None:
        self._init()
        return self._error

    def _static_info(self, nv, i: int) -> tuple:
        info = self._static.get(i)
        if info is None:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            bus = nv.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else str(bus)
            cc = _try(lambda: tuple(nv.nvmlDeviceGetCudaComputeCapability(h)))
            arch = architecture_name(cc, _try(lambda: nv.nvmlDeviceGetArchitecture(h)))
            mig = _try(lambda: bool(nv.nvmlDeviceGetMigMode(h)[0]))
            info = (h, nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetName(h), bus.upper(), cc, arch, mig)
            self._static[i] = info
        return info

    def read(self, processes: bool) -> list[GPU]:
        nv = self._init()
        if nv is None:
            return []
        try:
            count = nv.nvmlDeviceGetCount()
            out = []
            for i in range(count):
                h, uuid, name, bus, cc, arch, mig = self._static_info(nv, i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                util = _try(lambda: int(nv.nvmlDeviceGetUtilizationRates(h).gpu))
                procs = _nvml_processes(nv, h) if processes else ()
                out.append(GPU(i, uuid, name, bus, int(mem.total), int(mem.used), int(mem.free),
                               util, cc, arch, mig, procs))
            return out
        except nv.NVMLError as e:
            raise NvkitError(f"NVML failed while reading the GPUs: {e}. "
                             "Check the driver with nvidia-smi.") from e

    def versions(self) -> dict:
        nv = self._init()
        if nv is None:
            return {}
        cuda = _try(nv.nvmlSystemGetCudaDriverVersion)
        return {
            "driver_version": _try(nv.nvmlSystemGetDriverVersion),
            "nvml_version": _try(nv.nvmlSystemGetNVMLVersion),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        }


def _try(fn):
    """NVML answers NotSupported for many queries on some boards: treat any failure as unknown."""
    try:
        return fn()
    except Exception:
        return None


def _nvml_processes(nv, h) -> tuple[GPUProcess, ...]:
    procs: dict[int, GPUProcess] = {}
    for kind, getter in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                         ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        for p in _try(lambda: getattr(nv, getter)(h)) or []:
            if p.pid in procs:
                continue
            used = p.usedGpuMemory
            procs[p.pid] = GPUProcess(int(p.pid), None if used is None else int(used),
                                      _process_name(int(p.pid)), kind)
    return tuple(procs.values())


def is_own_process(pid: int) -> bool:
    """True when ``pid`` is a process of this process's user (as ``/proc`` says). False for another
    user's process and for one not visible here (NVML lists host pids inside containers), so
    callers can tell whose process names they may show."""
    try:
        return os.stat(f"/proc/{int(pid)}").st_uid == os.geteuid()
    except (OSError, ValueError, TypeError, AttributeError):   # no /proc, no such pid, no geteuid
        return False


def _process_name(pid: int) -> str | None:
    # Only our own processes: what other users run on a shared GPU is theirs to tell.
    # /proc is cheap and needs nothing; NVML's name lookup fails for other users' processes.
    if not is_own_process(pid):
        return None
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or None
    except OSError:
        return None


def _explain_nvml_error(nv, e) -> str:
    code = getattr(e, "value", None)
    if code == nv.NVML_ERROR_LIBRARY_NOT_FOUND:
        return ("no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed on this "
                "machine, so there are no GPUs to use")
    if code == nv.NVML_ERROR_DRIVER_NOT_LOADED:
        return ("the NVIDIA driver is installed but not loaded (NVML: Driver Not Loaded); "
                "check nvidia-smi, or whether the container was started with GPU access")
    if code == nv.NVML_ERROR_NO_PERMISSION:
        return "no permission to talk to the NVIDIA driver (NVML: Insufficient Permissions)"
    return f"NVML could not start: {e}"


# --- the fake inventory --------------------------------------------------------------------------

_H200 = {
    "name": "NVIDIA H200 (fake)",
    "memory_total": 143771 * 2**20,      # what nvidia-smi shows for an H200 (143771 MiB)
    "capability": (9, 0),
    "mig_mode": False,
    "utilization": None,                 # None: a small wave, see _FakeSource.read
    "memory_used": None,                 # None: a base plus a small wave
}
_FAKE_WAVE = 64 * 2**20                  # used memory drifts by up to 64 MiB so charts look alive


class _FakeSource:
    """``NVKIT_FAKE_GPUS=N`` (N fake H200s), ``=path.json`` (a JSON list of GPU dicts, fields as in
    ``GPU.to_dict()``; any missing field comes from the H200 template; read once) or
    ``=@path.json`` (the same, re-read whenever the file changes, so a test can put processes on
    the fake GPUs while a server runs).

    A fake process is ``{"pid", "used_memory", "name", "kind", "container_pid"}`` (only ``pid`` is
    required). ``container_pid`` fakes a process seen from inside a container: NVML lists the host
    pid (``pid``) while the process itself has another one; ``fake_gpus_of`` lets that process
    find its GPUs, as a real one does through its CUDA context."""

    kind = "fake"

    def __init__(self, spec: str):
        self.spec = spec
        s = spec.strip()
        self._file = Path(s[1:]).expanduser() if s.startswith("@") else None
        self._key = None
        self._lock = threading.Lock()
        self._gpus = [] if self._file else self._parse(spec)
        if self._file:
            self._current()           # a missing or broken file is an error now, not at first use
        self._t0 = time.monotonic()

    def _current(self) -> list[dict]:
        if self._file is None:
            return self._gpus
        try:
            st = self._file.stat()
        except OSError as e:
            raise NvkitError(f"{FAKE_ENV}={self.spec!r}: cannot read {self._file} ({e}). Point it "
                             f"at a JSON file with a list of GPUs, or use e.g. {FAKE_ENV}=4.") from e
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            if key != self._key:
                self._gpus = self._parse(str(self._file), display=self.spec)
                self._key = key
            return self._gpus

    @staticmethod
    def _parse(spec: str, display: str | None = None) -> list[dict]:
        shown = spec if display is None else display
        s = spec.strip()
        if s.isdigit():
            entries: list = [{} for _ in range(int(s))]
        else:
            try:
                text = s if s.startswith("[") else Path(s).expanduser().read_text()
                entries = json.loads(text)
            except (OSError, ValueError) as e:
                raise NvkitError(f"{FAKE_ENV}={shown!r} is neither a number of GPUs nor a readable "
                                 f"JSON file with a list of GPUs ({e}). Use e.g. {FAKE_ENV}=4.") from e
            if not isinstance(entries, list) or not all(isinstance(x, dict) for x in entries):
                raise NvkitError(f"{FAKE_ENV}: {shown} must hold a JSON list of objects, one per GPU.")
        gpus = []
        for i, e in enumerate(entries):
            g = dict(_H200)
            g.update(e)
            g["index"] = i
            g.setdefault("uuid", f"GPU-{_uuid.uuid5(_uuid.NAMESPACE_URL, f'nvkit-fake-gpu-{i}')}")
            g.setdefault("pci_bus_id", f"00000000:{0x18 + 0x11 * i:02X}:00.0")
            cc = g.get("capability")
            if isinstance(cc, str):
                cc = tuple(int(x) for x in cc.split("."))
            g["capability"] = tuple(cc) if cc else None
            g.setdefault("architecture", architecture_name(g["capability"]))
            raw = g.get("processes") or ()
            if not isinstance(raw, (list, tuple)):
                raise NvkitError(f"{FAKE_ENV}: GPU {i}'s \"processes\" in {shown} must be a list of "
                                 "objects such as {\"pid\": 1234, \"used_memory\": 1073741824}.")
            procs, inside = [], {}
            for p in raw:
                proc, cpid = _fake_process(p, i, shown)
                procs.append(proc)
                if cpid is not None:
                    inside[cpid] = proc.pid
            g["processes"] = tuple(procs)
            g["container_pids"] = inside
            gpus.append(g)
        return gpus

    def error(self) -> str | None:
        return None

    def read(self, processes: bool) -> list[GPU]:
        t = time.monotonic() - self._t0
        out = []
        for g in self._current():
            i, total = g["index"], int(g["memory_total"])
            used = g["memory_used"]
            if used is None:
                wave = 0.5 + 0.5 * math.sin(2 * math.pi * t / 20 + i)
                used = (512 + 256 * i) * 2**20 + int(_FAKE_WAVE * wave) // 2**20 * 2**20
                # the listed processes hold memory too, as they would on a real GPU
                used += sum(p.used_memory or 0 for p in g["processes"])
            used = min(int(used), total)
            util = g["utilization"]
            if util is None:
                util = int(round(2 + 2 * math.sin(2 * math.pi * t / 7 + i)))
            out.append(GPU(i, g["uuid"], g["name"], g["pci_bus_id"], total, used, total - used,
                           util, g["capability"], g["architecture"], g["mig_mode"],
                           g["processes"] if processes else (), fake=True))
        return out

    def gpus_of(self, pid: int) -> list[GPU]:
        """The fake GPUs listing ``pid`` as a process, or as a process's ``container_pid``."""
        found = []
        for g, raw in zip(self.read(processes=True), self._current()):
            if pid in raw["container_pids"] or any(p.pid == pid for p in g.processes):
                found.append(g)
        return found

    def versions(self) -> dict:
        return {}


def _fake_process(p, gpu: int, shown: str) -> tuple[GPUProcess, int | None]:
    """One fake process entry, checked: a typo in a test's inventory says where it is."""
    def bad(what: str) -> NvkitError:
        return NvkitError(f"{FAKE_ENV}: a process of GPU {gpu} in {shown} {what}. Write it as "
                          "{\"pid\": 1234, \"used_memory\": 1073741824, \"name\": \"python\"}.")

    def whole(key: str, required: bool = False) -> int | None:
        v = p.get(key)
        if v is None and not required:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(f"needs {key!r} as a whole number >= 0 (got {v!r})")
        return v

    if not isinstance(p, dict):
        raise bad(f"is {p!r}, not an object")
    name = p.get("name")
    if name is not None and not isinstance(name, str):
        raise bad(f"has a non-text name {name!r}")
    kind = p.get("kind", "compute")
    if kind not in ("compute", "graphics"):
        raise bad(f"has kind {kind!r} (use 'compute' or 'graphics')")
    return (GPUProcess(whole("pid", required=True), whole("used_memory"), name, kind),
            whole("container_pid"))


_nvml_source = _NvmlSource()
_fake_sources: dict[str, _FakeSource] = {}
_fake_lock = threading.Lock()


def _source():
    spec = os.environ.get(FAKE_ENV, "").strip()
    if not spec:
        return _nvml_source
    with _fake_lock:
        src = _fake_sources.get(spec)
        if src is None:
            src = _fake_sources[spec] = _FakeSource(spec)
        return src


# --- public ---------------------------------------------------------------------------------------

def gpus(processes: bool = True) -> list[GPU]:
    """Every GPU of the machine in nvidia-smi (PCI bus) order, read with NVML.

    Creates no CUDA context and ignores ``CUDA_VISIBLE_DEVICES`` (see ``nvkit.selection()`` for
    what this process's ``cuda:i`` are). Without an NVIDIA driver it returns ``[]``;
    ``nvml_status()`` says why. ``processes=False`` skips the per-process query (for live refresh).
    """
    return _source().read(processes)


def fake_gpus_of(pid: int | None = None) -> list[GPU]:
    """Under ``NVKIT_FAKE_GPUS``, the fake GPUs this process (or ``pid``) is listed on, by its pid
    or a fake process's ``container_pid``; ``[]`` without a fake inventory. A kernel has no CUDA
    context on a fake GPU, so this is how it learns which ones it "uses"."""
    src = _source()
    if src.kind != "fake":
        return []
    return src.gpus_of(os.getpid() if pid is None else int(pid))


def memory_used(index: int) -> int:
    """Bytes used on GPU ``index`` (nvidia-smi numbering), one NVML call (~10 µs): cheap enough for
    the memory sampler's 5-20 Hz, where ``gpus()`` would also query utilization and build objects."""
    src = _source()
    if src.kind == "fake":
        return src.read(processes=False)[index].memory_used
    nv = src._init()
    if nv is None:
        raise NvkitError(f"NVML is not available: {src.error()}")
    handle = src._static_info(nv, index)[0]
    return int(nv.nvmlDeviceGetMemoryInfo(handle).used)


def nvml_status() -> NvmlStatus:
    """What ``gpus()`` sees and, when it sees nothing, why."""
    try:
        src = _source()
    except NvkitError as e:
        return NvmlStatus(False, "fake", 0, str(e))
    err = src.error()
    if err is not None:
        return NvmlStatus(False, "none", 0, err)
    try:
        found = src.read(processes=False)
    except NvkitError as e:
        return NvmlStatus(False, src.kind, 0, str(e))
    v = src.versions()
    if src.kind == "fake":
        reason = (f"{len(found)} fake GPU(s) from {FAKE_ENV}={src.spec} "
                  "(NVML is not read; unset the variable to see the real GPUs)")
    elif found:
        names = sorted({g.name for g in found})
        reason = (f"{len(found)} GPU(s) found with NVML ({', '.join(names)}); "
                  f"driver {v.get('driver_version')}, supports CUDA up to {v.get('cuda_driver_version')}")
    else:
        reason = "NVML works but reports no GPUs (driver loaded, no device visible to this container?)"
    return NvmlStatus(bool(found), src.kind, len(found), reason, **v)


def format_table(gs: list[GPU] | None = None) -> str:
    """A plain-text table of the GPUs, like a compact nvidia-smi (``%nvkit gpus`` prints it)."""
    gs = gpus() if gs is None else gs
    if not gs:
        return f"No GPUs: {nvml_status().reason}."
    rows = [("#", "name", "arch", "cc", "memory used / total", "util", "bus id", "MIG", "processes")]
    for g in gs:
        procs = ", ".join(f"{p.pid}{'' if not p.name else ' ' + p.name}"
                          f"{'' if p.used_memory is None else ' ' + fmt_bytes(p.used_memory)}"
                          for p in g.processes) or "-"
        rows.append((str(g.index), g.name, g.architecture, g.capability_str,
                     f"{fmt_bytes(g.memory_used)} / {fmt_bytes(g.memory_total)}",
                     "-" if g.utilization is None else f"{g.utilization}%",
                     g.pci_bus_id, {None: "-", True: "on", False: "off"}[g.mig_mode], procs))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1]
                     for r in rows)
