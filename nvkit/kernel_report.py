"""This kernel tells the Jupyter server what it holds on the GPUs.

The server maps GPU memory to kernels by pid (NVML pid = the kernel manager's pid). Inside a
container NVML reports host pids that match no local process, so a kernel that has imported nvkit
also writes a small report next to its connection file (the server's runtime folder)::

    nvkit-kernel-<kernel id>.json   (0600, replaced atomically, removed when the kernel exits)
    {"version": 1, "kernel_id", "pid", "updated", "devices": [{"uuid", "pci_bus_id",
     "cuda_index", "reserved", "allocated"}], "model": {"id", "loaded", "device"} | null}

A daemon thread rewrites it every few seconds when something changed, and at once after nvkit
records a load or unload. It never imports torch or initialises CUDA: devices are read only from a
torch that is already imported with CUDA up. The comm target ``nvkit.unload`` lets the lab's
sidebar unload the current model and hear back the bytes freed.

Only the standard library and nvkit's ground floor (errors, events) are imported here, so
``import nvkit`` stays cheap; the session is read from ``nvkit.state.STATE`` (set by ``nvkit.load``).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from . import events
from .cache import write_atomic
from .checks import env_set
from .errors import NvkitError
from .hardware.inventory import fake_gpus_of
from .state import STATE

PREFIX = "nvkit-kernel-"
COMM_TARGET = "nvkit.unload"
INTERVAL_S = 3.0          # how stale the sidebar may be; a write is a few hundred bytes
REFRESH_S = 30.0          # rewrite even without a change, so "updated" tells a hung writer
VERSION = 1

_lock = threading.Lock()
_thread: threading.Thread | None = None
_wake = threading.Event()
_stop = threading.Event()
_path: Path | None = None
_owner_pid: int | None = None
_subscribed = False


# --- what this kernel is ---------------------------------------------------------------------------

def _kernel_app():
    """The running IPKernelApp, or None outside a Jupyter kernel (scripts, IPython, subprocesses)."""
    mod = sys.modules.get("ipykernel.kernelapp")
    if mod is None:
        return None
    try:
        return mod.IPKernelApp.instance() if mod.IPKernelApp.initialized() else None
    except Exception:
        return None


def _connection_file(app) -> Path | None:
    cf = getattr(app, "abs_connection_file", None) or getattr(app, "connection_file", None)
    return Path(cf) if cf else None


def kernel_id_of(connection_file: Path) -> str | None:
    """The kernel id in a connection file's name (``kernel-<id>.json``, as Jupyter names them)."""
    m = re.fullmatch(r"kernel-([A-Za-z0-9_.-]+)\.json", connection_file.name)
    return m.group(1) if m else None


def report_name(kernel_id: str) -> str:
    return f"{PREFIX}{kernel_id}.json"


# --- what it holds ----------------------------------------------------------------------------------

def _uuid(props) -> str | None:
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    s = str(raw)
    return s if s.startswith(("GPU-", "MIG-")) else f"GPU-{s}"


def _cuda_devices() -> list[dict]:
    """The GPUs this process has a CUDA context on, with torch's allocator figures. Nothing unless
    torch is already imported and has initialised CUDA (never import or initialise it here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_initialized():
            return []
        count = torch.cuda.device_count()
    except Exception:
        return []
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    out = []
    for i in range(count):
        try:
            if has_context is not None and not has_context(i):
                continue                  # asking about a device without a context could make one
            p = torch.cuda.get_device_properties(i)
            out.append({
                "uuid": _uuid(p),
                "pci_bus_id": f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0",
                "cuda_index": i,
                "reserved": int(torch.cuda.memory_reserved(i)),
                "allocated": int(torch.cuda.memory_allocated(i)),
            })
        except Exception:
            continue
    return out


def _fake_devices() -> list[dict]:
    """Under NVKIT_FAKE_GPUS there is no CUDA: the fake inventory says which GPUs this process is
    on. No figures from torch, as there is no allocator on a fake GPU."""
    if not env_set("NVKIT_FAKE_GPUS"):
        return []
    try:
        found = fake_gpus_of()
    except Exception:
        return []
    return [{"uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "cuda_index": None, "reserved": None,
             "allocated": None} for g in found]


def _model() -> dict | None:
    try:
        s = STATE.session   # set by nvkit.load; reading it imports nothing (no torch for it)
        if s is None:
            return None
        loaded = bool(s.loaded)
        return {"id": str(s.model_id), "loaded": loaded,
                "device": str(s.device) if loaded else None}
    except Exception:               # a model being unloaded in another thread: next round
        return None


def snapshot() -> dict:
    """This kernel's report as a dict (what the file holds)."""
    app = _kernel_app()
    cf = _connection_file(app) if app is not None else None
    return {
        "version": VERSION,
        "kernel_id": kernel_id_of(cf) if cf else None,
        "pid": os.getpid(),
        "updated": time.time(),
        "devices": _cuda_devices() or _fake_devices(),
        "model": _model(),
    }


# --- the file ----------------------------------------------------------------------------------------

def _write(path: Path, data: dict) -> None:
    """Replace ``path`` atomically with a 0600 file (a reader never sees half a report; a planted
    symlink is replaced, never written through)."""
    write_atomic(path, json.dumps(data), 0o600)


def _remove() -> None:
    # A forked child inherits atexit handlers, and a restarted kernel (same id) may already have
    # written its own report: remove only a file this very process wrote.
    if _path is None or os.getpid() != _owner_pid:
        return
    try:
        if json.loads(_path.read_text()).get("pid") == _owner_pid:
            _path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _loop(path: Path) -> None:
    last, last_write = None, 0.0
    while not _stop.is_set():
        try:
            data = snapshot()
            same = {k: v for k, v in data.items() if k != "updated"}
            if same != last or time.monotonic() - last_write > REFRESH_S:
                _write(path, data)
                last, last_write = same, time.monotonic()
        except Exception:
            pass        # a full disk or a removed runtime folder: try again next round
        _wake.wait(INTERVAL_S)
        _wake.clear()


def _on_event(ev) -> None:
    if ev.kind in ("load", "unload"):
        _wake.set()


# --- unload from the lab -------------------------------------------------------------------------------

def unload_current() -> dict:
    """Unload this kernel's current nvkit session; the answer the sidebar shows."""
    s = STATE.session
    if s is None or not s.loaded:
        return {"ok": False, "freed": 0, "model": None,
                "message": "No model is loaded in this kernel: nothing to unload."}
    model_id = str(s.model_id)
    try:
        freed = int(s.unload())
    except NvkitError as e:
        return {"ok": False, "freed": 0, "model": model_id, "message": str(e)}
    except Exception as e:            # reported to the user, the kernel keeps running
        return {"ok": False, "freed": 0, "model": model_id,
                "message": f"unloading {model_id} failed: {type(e).__name__}: {e}"}
    _wake.set()
    return {"ok": True, "freed": freed, "model": model_id, "message": f"{model_id} unloaded"}


def _on_comm_open(comm, msg) -> None:
    try:
        comm.send(unload_current())
    finally:
        comm.close()


def _register_comm_target() -> None:
    try:
        import comm
        comm.get_comm_manager().register_target(COMM_TARGET, _on_comm_open)
    except Exception:     # an old ipykernel without the comm package: the sidebar says unsupported
        pass


# --- start / stop ----------------------------------------------------------------------------------------

def start() -> Path | None:
    """Start reporting, once per kernel; does nothing outside a Jupyter kernel. Returns the report
    file's path. Cheap: the first snapshot is taken by the thread."""
    global _thread, _path, _owner_pid, _subscribed
    with _lock:
        if _thread is not None and _owner_pid == os.getpid():
            return _path
        app = _kernel_app()
        cf = _connection_file(app) if app is not None else None
        kid = kernel_id_of(cf) if cf else None
        if kid is None or not cf.parent.is_dir():
            return None
        _path = cf.parent / report_name(kid)
        _owner_pid = os.getpid()
        _stop.clear()
        if not _subscribed:
            events.subscribe(_on_event)
            _register_comm_target()
            atexit.register(stop)
            _subscribed = True
        _thread = threading.Thread(target=_loop, args=(_path,), name="nvkit-kernel-report",
                                   daemon=True)
        _thread.start()
        return _path


def stop() -> None:
    """Stop reporting and remove the file (atexit does this when the kernel exits)."""
    global _thread
    _stop.set()
    _wake.set()
    t = _thread
    if t is not None and t is not threading.current_thread() and _owner_pid == os.getpid():
        t.join(timeout=2)
    _thread = None
    _remove()
