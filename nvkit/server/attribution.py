"""Whose GPU memory is it: NVML's processes mapped to this server's kernels and their notebooks.

Three sources, in this order of trust:

1. **pids**: the kernel manager knows the process of each local kernel; an NVML process that is
   that process or one of its descendants (torchrun workers, DataLoader workers, a wrapper
   launcher's child) belongs to the kernel.
2. **report files**: inside a container NVML lists host pids that match nothing here. A kernel that
   imported nvkit writes ``nvkit-kernel-<id>.json`` next to its connection file (see
   ``nvkit.kernel_report``) naming the GPUs it has a CUDA context on; the unmatched NVML processes
   of such a GPU whose pids are not processes here are paired with the reporting kernels (one
   each, or by memory where the allocator's figure tells them apart). A report counts only when it is a regular file of the
   server's user, names a kernel of this server and a live process of that kernel.
3. everything else is an "other process": pid and memory, and its name only when the server's
   user owns it (what other users run is theirs to tell).

The session manager gives each kernel's notebook path (relative to the server root).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from jupyter_server.utils import ensure_async

from nvkit import kernel_report

_REPORT_MAX_BYTES = 64 * 1024
_MAX_DEPTH = 32            # ancestors walked per process; process trees are shallow


@dataclass
class KernelFacts:
    id: str
    name: str | None                # kernel spec name
    execution_state: str | None
    pid: int | None                 # local kernels only
    connection_file: str | None
    path: str | None = None         # notebook or console path, relative to the server root
    session_type: str | None = None


def _as_pid(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _kernel_pid(km) -> int | None:
    """The pid of a kernel the server started locally (jupyter_client's LocalProvisioner)."""
    prov = getattr(km, "provisioner", None)
    pid = _as_pid(getattr(prov, "pid", None))
    if pid is None:
        pid = _as_pid(getattr(getattr(prov, "process", None), "pid", None))
    return pid


async def kernel_facts(kernel_manager, session_manager) -> list[KernelFacts]:
    """Every kernel of this server with its pid, connection file and notebook path."""
    sessions: dict[str, dict] = {}
    try:
        for s in await ensure_async(session_manager.list_sessions()):
            kid = (s.get("kernel") or {}).get("id")
            if kid:
                sessions[kid] = s
    except Exception:          # a broken session database must not take the GPU list down
        pass
    out = []
    for kid in list(kernel_manager.list_kernel_ids()):
        try:
            model = kernel_manager.kernel_model(kid)
            km = kernel_manager.get_kernel(kid)
        except Exception:      # shut down meanwhile
            continue
        s = sessions.get(kid) or {}
        out.append(KernelFacts(
            id=kid, name=model.get("name"), execution_state=model.get("execution_state"),
            pid=_kernel_pid(km), connection_file=getattr(km, "connection_file", None) or None,
            path=s.get("path") or None, session_type=s.get("type") or None))
    return out


# --- processes -------------------------------------------------------------------------------------

def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from /proc (None when it is not visible here)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ')'
    try:
        return int(raw[raw.rindex(")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def visible_here(pid: int) -> bool:
    """Whether ``pid`` is a process in this pid namespace. An NVML pid that is not comes from a
    container's host; one that is belongs to some other process of this machine, never to a
    kernel whose own pid differs."""
    return os.path.exists(f"/proc/{pid}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return False
    return True


def _lineage(pid: int, parent=parent_pid) -> list[int]:
    """``pid`` and its ancestors, nearest first."""
    chain, seen = [], set()
    p: int | None = pid
    while p and p > 1 and p not in seen and len(chain) < _MAX_DEPTH:
        chain.append(p)
        seen.add(p)
        p = parent(p)
    return chain


# --- report files ------------------------------------------------------------------------------------

def read_report(k: KernelFacts, is_own=None, parent=parent_pid) -> dict | None:
    """The kernel's report, or None when it has none that counts (missing, not a plain file of
    this user, unreadable, about another kernel, or its process is gone or is not this kernel's)."""
    if not k.connection_file:
        return None
    path = Path(k.connection_file).parent / kernel_report.report_name(k.id)
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > _REPORT_MAX_BYTES:
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd) as f:
            data = json.loads(f.read(_REPORT_MAX_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("kernel_id") != k.id:
        return None
    pid = _as_pid(data.get("pid"))
    if pid is None or not _alive(pid) or (is_own is not None and not is_own(pid)):
        return None                      # stale: written by a kernel process that is gone
    if k.pid is not None and k.pid not in _lineage(pid, parent):
        return None                      # a process that is not this kernel (or its child)
    devices = data.get("devices")
    data["devices"] = [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []
    if not isinstance(data.get("model"), dict):
        data["model"] = None
    return data


def _same(a, b) -> bool:
    return bool(a) and bool(b) and str(a).lower() == str(b).lower()


def _device_of(report: dict, gpu: dict) -> dict | None:
    """The report's entry for this GPU: by UUID, else by PCI bus id (a MIG instance's UUID is not
    its GPU's, its bus is)."""
    for d in report["devices"]:
        if _same(d.get("uuid"), gpu.get("uuid")) or _same(d.get("pci_bus_id"), gpu.get("pci_bus_id")):
            return d
    return None


def _num(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


# --- the mapping ---------------------------------------------------------------------------------------

def _pair_by_report(claims: list[tuple[KernelFacts, dict]], procs: list[dict]) -> dict[str, list[dict]]:
    """Pair the kernels that report this GPU with its unmatched processes. One of each is a pair.
    As many of each, with every figure known, pair in order of size: NVML's figure is torch's
    reserve plus a CUDA context of about the same size in every process, and each pair must have
    NVML >= reserved. Anything else is ambiguous and stays unpaired: no attribution beats a wrong
    one."""
    if not claims or len(claims) != len(procs):
        return {}
    if len(claims) == 1:
        return {claims[0][0].id: [procs[0]]}
    reserved = [_num(dev.get("reserved")) for _, dev in claims]
    used = [_num(p.get("used_memory")) for p in procs]
    if None in reserved or None in used:
        return {}
    ks = sorted(zip(reserved, (k.id for k, _ in claims)))
    ps = sorted(zip(used, range(len(procs))))
    if any(u < r for (r, _), (u, _) in zip(ks, ps)):
        return {}
    return {kid: [procs[i]] for (_, kid), (_, i) in zip(ks, ps)}


def attribute(gpus: list[dict], kernels: list[KernelFacts], reports: dict[str, dict],
              is_own, parent=parent_pid, visible=visible_here) -> None:
    """Add ``kernels`` and ``other_processes`` to each GPU dict (``GPU.to_dict()``) and drop the
    names of processes the server's user does not own."""
    by_pid: dict[int, KernelFacts] = {}
    for k in kernels:
        if k.pid is not None:
            by_pid[k.pid] = k
        r = reports.get(k.id)
        if r is not None:
            by_pid.setdefault(r["pid"], k)
    by_id = {k.id: k for k in kernels}
    lineage_cache: dict[int, KernelFacts | None] = {}

    def owner(pid) -> KernelFacts | None:
        if pid not in lineage_cache:
            lineage_cache[pid] = next((by_pid[p] for p in _lineage(pid, parent) if p in by_pid), None)
        return lineage_cache[pid]

    for g in gpus:
        procs = []
        for p in g.get("processes") or []:
            pid = _as_pid(p.get("pid"))
            if pid is None:
                continue
            q = dict(p)
            if not is_own(pid):
                q["name"] = None
            procs.append(q)
        g["processes"] = procs

        found: dict[str, list[dict]] = {}
        unmatched = []
        for p in procs:
            k = owner(p["pid"])
            if k is None:
                unmatched.append(p)
            else:
                found.setdefault(k.id, []).append(p)
        matched_by = {kid: "pid" for kid in found}

        claims = []
        for k in kernels:
            r = reports.get(k.id)
            dev = _device_of(r, g) if r is not None else None
            if dev is not None and k.id not in found:
                claims.append((k, dev))
        paired = _pair_by_report(claims, [p for p in unmatched if not visible(p["pid"])])
        for kid, ps in paired.items():
            found[kid] = ps
            matched_by[kid] = "report"
            for p in ps:
                unmatched.remove(p)
        for k, _ in claims:                 # on this GPU by its own word, NVML shows nothing of it
            if k.id not in found:
                found[k.id] = []
                matched_by[k.id] = "report"

        entries = []
        for kid, ps in found.items():
            k = by_id[kid]
            r = reports.get(kid)
            dev = _device_of(r, g) if r is not None else None
            mems = [_num(p.get("used_memory")) for p in ps]
            entries.append({
                "id": k.id,
                "name": k.name,
                "execution_state": k.execution_state,
                "notebook": k.path,
                "session_type": k.session_type,
                "pids": [p["pid"] for p in ps],
                "memory": sum(mems) if ps and None not in mems else None,
                "reserved": _num(dev.get("reserved")) if dev else None,
                "allocated": _num(dev.get("allocated")) if dev else None,
                "model": r.get("model") if r is not None else None,
                "nvkit": r is not None,
                "matched_by": matched_by[kid],
            })
        entries.sort(key=lambda e: (-(e["memory"] or e["reserved"] or 0), e["notebook"] or "", e["id"]))
        g["kernels"] = entries
        g["other_processes"] = unmatched
