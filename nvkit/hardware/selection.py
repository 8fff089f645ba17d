"""Which GPUs this process uses, in which order: ``CUDA_VISIBLE_DEVICES`` done carefully.

Indices are nvidia-smi's (``nvkit.gpus()``); nvkit always sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so
CUDA numbers GPUs the same way, and ``cuda:i`` is the i-th GPU of the choice.

CUDA reads these variables once, when the process initialises the driver. After that a new choice
cannot take effect in this process. nvkit then says so, leaves the environment alone (it never
pretends), and saves the choice under the kernel's id (which survives a kernel restart but is not
shared with any other kernel or process); ``apply_saved()`` runs when the restarted kernel imports
nvkit or loads the extension, before any CUDA work, and prints one line when it applies something.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .. import cache, events
from ..errors import NvkitError
from ..state import STATE
from .inventory import GPU, gpus as _list_gpus, nvml_status

ORDER = "CUDA_DEVICE_ORDER"
VISIBLE = "CUDA_VISIBLE_DEVICES"
_KEEP_SAVED_S = 14 * 24 * 3600   # saved choices of kernels gone this long are pruned


# --- boundaries (tests monkeypatch these) --------------------------------------------------------

def cuda_initialized() -> bool:
    """True once this process has initialised CUDA, after which CUDA_VISIBLE_DEVICES is fixed.

    ``torch.cuda.is_initialized()`` is not enough: ``torch.cuda.is_available()`` already runs
    ``cuInit`` (through cudaGetDeviceCount) without setting it. So the driver is asked too, but only
    when libcuda is already loaded in this process; nothing here loads or initialises CUDA.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return True
        except Exception:
            pass
    return _cuda_driver_initialized()


def _cuda_driver_initialized() -> bool:
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=getattr(os, "RTLD_NOLOAD", 4) | os.RTLD_LAZY)
    except (OSError, AttributeError):
        return False                      # libcuda not loaded: nothing can have called cuInit
    try:
        n = ctypes.c_int(0)
        # CUDA_ERROR_NOT_INITIALIZED (3) until cuInit; this call initialises nothing
        return lib.cuDeviceGetCount(ctypes.byref(n)) == 0
    except Exception:
        return False


def kernel_id() -> str | None:
    """This Jupyter kernel's id (from its connection file; a restart keeps it), else None.

    Only the kernel process itself has one: an initialised ``IPKernelApp``. Scripts, subprocesses
    and multiprocessing children (which copy the kernel's argv) get None, so they never pick up a
    saved choice.
    """
    mod = sys.modules.get("ipykernel.kernelapp")
    if mod is None:
        return None
    try:
        if not mod.IPKernelApp.initialized():
            return None
        cf = mod.IPKernelApp.instance().connection_file
    except Exception:
        return None
    if not cf:
        return None
    stem = Path(cf).name
    stem = stem[:-5] if stem.endswith(".json") else stem
    stem = stem[7:] if stem.startswith("kernel-") else stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or None


def _startup_env() -> dict[str, str | None]:
    """The two variables as this process started (what the kernel inherited from the server)."""
    env = None
    try:
        raw = Path("/proc/self/environ").read_bytes()
        env = dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)
        env = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in env.items()}
    except OSError:
        env = dict(os.environ)
    return {ORDER: env.get(ORDER), VISIBLE: env.get(VISIBLE)}


_STARTUP = _startup_env()


def startup_env() -> dict[str, str | None]:
    return dict(_STARTUP)


def _torch_cuda_bus_ids() -> list[str] | None:
    """The PCI bus id of each cuda:i as the initialised CUDA reports it (no init; None if unknown)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0")
        return out
    except Exception:
        return None


# --- the result ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CudaDevice:
    cuda_index: int
    index: int | None        # nvidia-smi index; None where it can't be resolved
    name: str | None
    pci_bus_id: str | None
    uuid: str | None

    def __str__(self) -> str:
        if self.index is None:
            return f"cuda:{self.cuda_index} = ? ({self.name or 'unresolved'})"
        return f"cuda:{self.cuda_index} = GPU {self.index} ({self.name}, bus {self.pci_bus_id})"


@dataclass(frozen=True, repr=False)
class Selection:
    """A GPU choice and its cuda:i mapping. ``in_force`` says whether this process uses it now (or
    will, at its first CUDA call); otherwise ``restart_needed`` and ``saved`` say what happens."""

    choice: tuple[int, ...] | None    # nvidia-smi indices in cuda order; None = all; () = CPU only
    devices: tuple[CudaDevice, ...]   # cuda:0, cuda:1, ...
    env: dict                         # CUDA_DEVICE_ORDER / CUDA_VISIBLE_DEVICES (None = unset)
    in_force: bool
    cuda_initialized: bool
    restart_needed: bool = False
    saved: bool = False               # kept for this kernel's restart
    pending: "Selection | None" = None  # selection(): a choice waiting for the restart
    notes: tuple[str, ...] = ()

    @property
    def mapping(self) -> dict[str, CudaDevice]:
        return {f"cuda:{d.cuda_index}": d for d in self.devices}

    @property
    def cpu_only(self) -> bool:
        return self.choice == ()

    @property
    def env_line(self) -> str:
        """The variables as a shell prefix, e.g. ``CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0``."""
        return " ".join(_assign(k, v) for k, v in self.env.items() if v is not None)

    def describe(self) -> str:
        what = ("CPU only" if self.cpu_only else "all GPUs" if self.choice is None
                else "GPUs " + ", ".join(map(str, self.choice)))
        if self.in_force:
            state = "in force" + ("" if self.cuda_initialized else " (CUDA reads it at its first use)")
        elif self.restart_needed:
            state = "NOT in force: takes effect after a kernel restart" + (
                " (saved for the restart)" if self.saved else "")
        else:
            state = "not applied"
        lines = [f"{what}: {state}", f"  env: {self.env_line or '(no CUDA variables set)'}"]
        unset = [k for k, v in self.env.items() if v is None]
        if VISIBLE in unset:
            lines[-1] += f"  ({VISIBLE} unset: CUDA sees every GPU)"
        lines += [f"  {d}" for d in self.devices] or ["  no cuda devices: torch runs on the CPU"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.pending is not None:
            lines.append("pending, after the kernel restarts: " + self.pending.describe().replace("\n", "\n  "))
        return "\n".join(lines)

    __str__ = describe

    def __repr__(self) -> str:
        return self.describe()

    def to_dict(self) -> dict:
        return {"choice": None if self.choice is None else list(self.choice),
                "mapping": {k: vars(d) for k, d in self.mapping.items()},
                "env": dict(self.env), "env_line": self.env_line, "in_force": self.in_force,
                "cuda_initialized": self.cuda_initialized, "restart_needed": self.restart_needed,
                "saved": self.saved, "notes": list(self.notes),
                "pending": None if self.pending is None else self.pending.to_dict()}


def _assign(k: str, v: str) -> str:
    return f"{k}=" if v == "" else f"{k}={shlex.quote(v)}"


# --- parsing -------------------------------------------------------------------------------------

def _describe_valid(gs: list[GPU], allowed: list[int] | None) -> str:
    shown = [g for g in gs if allowed is None or g.index in allowed]
    if not shown:
        return "No GPU can be chosen here. Use [] for CPU only."
    items = "; ".join(f"{g.index} ({g.name}, {g.pci_bus_id})" for g in shown)
    return f"Valid GPUs: {items}. Use [] for CPU only and None for all."


def _by_uuid(gs: list[GPU], token: str) -> GPU | None:
    hits = [g for g in gs if g.uuid.lower().startswith(token.lower())]
    return hits[0] if len(hits) == 1 else None


def _parse_visible(value: str | None, gs: list[GPU]) -> tuple[list[int] | None, list[str]]:
    """Indices CUDA makes visible for a CUDA_VISIBLE_DEVICES value (None = all), read the way CUDA
    reads it: comma separated indices or (prefixes of) UUIDs, stopping at the first invalid one."""
    if value is None:
        return None, []
    out: list[int] = []
    notes: list[str] = []
    tokens = [t.strip() for t in value.split(",")]
    if tokens == [""]:
        return [], []
    for t in tokens:
        if re.fullmatch(r"-?\d+", t):
            n = int(t)
            if n < 0 or (gs and n >= len(gs)):
                notes.append(f"{VISIBLE}={value}: entry {t} is not a GPU, CUDA ignores it and the rest")
                break
            out.append(n)
        elif t.upper().startswith("GPU-") and gs:
            g = _by_uuid(gs, t)
            if g is None:
                notes.append(f"{VISIBLE}={value}: {t} matches no GPU, CUDA ignores it and the rest")
                break
            out.append(g.index)
        else:
            notes.append(f"{VISIBLE}={value}: nvkit cannot map {t!r} (a MIG instance?) to a GPU index")
            break
    if len(set(out)) != len(out):
        notes.append(f"{VISIBLE}={value} lists a GPU twice; CUDA then reports no usable device")
    return out, notes


def inherited(gs: list[GPU]) -> tuple[list[int] | None, list[str]]:
    """The GPUs this process may use at all: those of a CUDA_VISIBLE_DEVICES it started with."""
    value = _STARTUP[VISIBLE]
    allowed, notes = _parse_visible(value, gs)
    if value is None:
        return None, []
    say = (f"this kernel started with {VISIBLE}={value}, so it may use "
           + ("no GPU" if not allowed else "GPU " + ", ".join(map(str, allowed)) + " only")
           + "; nvkit's indices stay nvidia-smi's and cuda:i counts the chosen GPUs in order")
    if allowed and _STARTUP[ORDER] != "PCI_BUS_ID":
        say += (f" (it was set without {ORDER}=PCI_BUS_ID; nvkit reads its indices in nvidia-smi "
                "order, which matches CUDA's unless the GPUs differ in speed)")
    return allowed, [say, *notes]


def _resolve(choice, gs: list[GPU], allowed: list[int] | None) -> tuple[int, ...] | None:
    """A user choice -> nvidia-smi indices in cuda order (None = all)."""
    if choice is None:
        return None
    if isinstance(choice, str):
        s = choice.strip().lower()
        if s in ("all", "*"):
            return None
        if s in ("cpu", "", "-1"):
            return ()
        items: Iterable = [t for t in re.split(r"[,\s]+", choice.strip()) if t]
        if not items:
            raise NvkitError(f"select_gpus: {choice!r} names no GPU. Pass indices like '2,0', 'cpu' (or []) for CPU "
                             "only, or 'all' (or None) for all. " + (_describe_valid(gs, allowed) if gs else ""))
    elif isinstance(choice, (int, GPU)) and not isinstance(choice, bool):
        items = [choice]
    elif isinstance(choice, (list, tuple)):
        items = choice
    else:
        raise NvkitError(f"select_gpus: {choice!r} is not a GPU choice. Pass a list of nvidia-smi "
                         "indices or UUIDs like [2, 0], [] for CPU only, or None for all.")
    out: list[int] = []
    for item in items:
        if isinstance(item, GPU):
            idx = item.index
        elif isinstance(item, int) and not isinstance(item, bool):
            idx = item
        elif isinstance(item, str) and re.fullmatch(r"\d+", item.strip()):
            idx = int(item)
        elif isinstance(item, str) and item.strip().upper().startswith("GPU-"):
            g = _by_uuid(gs, item.strip())
            if g is None:
                raise NvkitError(f"select_gpus: no GPU has the UUID {item!r}. "
                                 + (_describe_valid(gs, allowed) if gs else ""))
            idx = g.index
        else:
            raise NvkitError(f"select_gpus: {item!r} is neither a GPU index nor a GPU UUID. "
                             + (_describe_valid(gs, allowed) if gs else ""))
        if not gs:
            raise NvkitError(f"select_gpus: there are no GPUs to choose from ({nvml_status().reason}). "
                             "Use [] for CPU only.")
        if not 0 <= idx < len(gs):
            raise NvkitError(f"select_gpus: GPU {idx} does not exist on this machine. "
                             + _describe_valid(gs, allowed))
        if idx in out:
            raise NvkitError(f"select_gpus: GPU {idx} is listed twice; each GPU can be chosen once. "
                             + _describe_valid(gs, allowed))
        if allowed is not None and idx not in allowed:
            raise NvkitError(f"select_gpus: GPU {idx} is outside this kernel's {VISIBLE}="
                             f"{_STARTUP[VISIBLE]} (set when the kernel started), so CUDA cannot use it "
                             "here. " + _describe_valid(gs, allowed)
                             + f" To use other GPUs, start Jupyter without {VISIBLE}.")
        out.append(idx)
    return tuple(out)


def _devices(indices: Sequence[int] | None, gs: list[GPU]) -> tuple[CudaDevice, ...]:
    if indices is None:
        indices = [g.index for g in gs]
    by_index = {g.index: g for g in gs}
    out = []
    for i, idx in enumerate(indices):
        g = by_index.get(idx)
        out.append(CudaDevice(i, idx, g.name if g else None, g.pci_bus_id if g else None,
                              g.uuid if g else None))
    return tuple(out)


def _env_for(choice: tuple[int, ...] | None, allowed: list[int] | None) -> dict[str, str | None]:
    if choice is None:
        visible = None if allowed is None else ",".join(map(str, allowed))
    else:
        visible = ",".join(map(str, choice))
    return {ORDER: "PCI_BUS_ID", VISIBLE: visible}


def _canonical(indices, gs: list[GPU], allowed: list[int] | None):
    if indices is None:
        if allowed is not None:
            return tuple(allowed)
        return tuple(g.index for g in gs) if gs else None
    return tuple(indices)


def _in_force_now(gs: list[GPU]) -> tuple[tuple[int, ...] | None, tuple[CudaDevice, ...], list[str]]:
    """What CUDA in this process uses: asked from torch when CUDA is up, else read from the env."""
    bus_ids = _torch_cuda_bus_ids()
    if bus_ids is not None:
        key = {_bus_key(g.pci_bus_id): g for g in gs}
        found = [key.get(_bus_key(b)) for b in bus_ids]
        if all(found):
            idx = tuple(g.index for g in found)
            return idx, _devices(idx, gs), []
    value = os.environ.get(VISIBLE)
    indices, notes = _parse_visible(value, gs)
    if value is not None and indices and os.environ.get(ORDER) != "PCI_BUS_ID":
        notes.append(f"{ORDER} is not PCI_BUS_ID here: CUDA numbers GPUs fastest first, which can "
                     "differ from nvidia-smi's order")
    return (None if indices is None else tuple(indices)), _devices(indices, gs), notes


def _bus_key(bus: str) -> tuple[int, ...]:
    try:
        return tuple(int(x, 16) for x in re.split(r"[:.]", bus.strip())[:3])
    except ValueError:
        return (hash(bus),)


# --- saving for a restart ------------------------------------------------------------------------



def _saved_dir() -> Path:
    return cache.root() / "selections"


def _saved_path(kid: str) -> Path:
    return _saved_dir() / f"kernel-{kid}.json"


def _save(kid: str, choice: tuple[int, ...] | None, gs: list[GPU]) -> Path:
    d = cache.own_dir("selections")
    now = time.time()
    for pattern in ("kernel-*.json", ".kernel-*.tmp"):   # a .tmp is left only by a write that died midway
        for old in d.glob(pattern):
            try:
                if now - old.lstat().st_mtime > _KEEP_SAVED_S:
                    old.unlink()
            except OSError:
                pass
    by_index = {g.index: g for g in gs}
    data = {"kernel_id": kid, "pid": os.getpid(), "process": _process_tag(), "saved_at": now,
            "choice": None if choice is None else list(choice),
            "uuids": None if choice is None else [by_index[i].uuid for i in choice]}
    return cache.write_private(_saved_path(kid), json.dumps(data))


def _read_saved(path: Path) -> dict:
    """The saved choice in ``path``. FileNotFoundError when there is none, or none nvkit may read
    (nvkit.cache's rule: a folder and a file of this user that no one else can write, never through a
    link; it has said why); ValueError when the file holds JSON of another shape or wrong types."""
    raw = cache.read_trusted_bytes(path, "saved GPU choices", limit=64 * 1024)
    if raw is None:
        raise FileNotFoundError(errno.ENOENT, "no saved GPU choice of this user", str(path))
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"it holds a JSON {type(data).__name__}, not a saved choice")
    choice, uuids = data.get("choice"), data.get("uuids")
    if choice is not None and not (isinstance(choice, list)
                                   and all(isinstance(i, int) and not isinstance(i, bool) for i in choice)):
        raise ValueError(f"its choice {choice!r} is not a list of GPU indices")
    if uuids is not None and not (isinstance(uuids, list) and all(isinstance(u, str) for u in uuids)):
        raise ValueError(f"its uuids {uuids!r} are not a list of GPU UUIDs")
    if not isinstance(data.get("pid", 0), int) or not isinstance(data.get("process", ""), str):
        raise ValueError("its pid or process tag has the wrong type")
    return data


def _process_tag() -> str:
    """pid plus start time: a restarted kernel that happens to reuse the pid is still another process."""
    try:
        start = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{os.getpid()}:{start}"


def _forget_saved() -> None:
    STATE.pending_gpus = None
    kid = kernel_id()
    if kid:
        try:
            _saved_path(kid).unlink()
        except OSError:
            pass


# --- public ----------------------------------------------------------------------------------

def plan(choice=None) -> Selection:
    """What ``select_gpus(choice)`` would do, without doing it (the GPU selector previews with it)."""
    gs = _list_gpus(processes=False)
    allowed, notes = inherited(gs)
    wanted = _resolve(choice, gs, allowed)
    initialized = cuda_initialized()
    now, _, _ = _in_force_now(gs)
    same = _canonical(wanted, gs, allowed) == _canonical(now, gs, allowed)
    env = _env_for(wanted, allowed)
    if not initialized:
        same = same and all(os.environ.get(k) == v for k, v in env.items())
    for g in gs:
        if wanted and g.index in wanted and g.mig_mode:
            notes.append(f"GPU {g.index} has MIG enabled: CUDA shows its MIG instances, not the "
                         "whole GPU (nvidia-smi -L lists their UUIDs)")
    return Selection(wanted, _devices(wanted if wanted is not None else allowed, gs), env,
                     in_force=same, cuda_initialized=initialized,
                     restart_needed=initialized and not same, notes=tuple(notes))


def select_gpus(choice=None) -> Selection:
    """Choose the GPUs this kernel uses and their order: ``[2, 0]`` makes cuda:0 GPU 2 and cuda:1
    GPU 0 (nvidia-smi indices; UUIDs work too); ``[]`` means CPU only, ``None`` all GPUs.

    Sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES``. If CUDA is already
    initialised in this process and the choice differs from what is in force, nothing changes now:
    the choice is saved and applied when this kernel restarts (and a message says so). A choice
    applied before CUDA started is kept for the next restart too: a restarted kernel inherits the
    server's environment, not this process's.
    """
    return _select(choice, keep_for_restart=True)


def _select(choice, keep_for_restart: bool) -> Selection:
    gs = _list_gpus(processes=False)
    p = plan(choice)
    if not p.cuda_initialized:
        changed = any(os.environ.get(k) != v for k, v in p.env.items())
        for k, v in p.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        saved = False
        kid = kernel_id() if keep_for_restart else None
        if kid:
            try:
                _save(kid, p.choice, gs)
                saved = True
            except OSError as e:
                print(f"nvkit: could not keep the GPU choice for a kernel restart ({e}); "
                      "set NVKIT_CACHE to a writable directory.", file=sys.stderr)
        else:
            _forget_saved()
        if changed:
            events.record("select", p.env_line or "all GPUs")
        return Selection(p.choice, p.devices, p.env, True, False, saved=saved, notes=p.notes)
    if p.in_force:
        _forget_saved()   # back to what is in force: nothing waits for a restart any more
        return p
    kid = kernel_id()
    saved = False
    if kid:
        try:
            _save(kid, p.choice, gs)
            saved = True
        except OSError as e:
            print(f"nvkit: could not save the GPU choice for the restart ({e}); "
                  "set NVKIT_CACHE to a writable directory.", file=sys.stderr)
    result = Selection(p.choice, p.devices, p.env, False, True, restart_needed=True, saved=saved,
                       notes=p.notes)
    STATE.pending_gpus = result
    now = selection()
    where = ", ".join(str(d) for d in now.devices) or "no GPU"
    if saved:
        how = ("It is saved and will be applied when this kernel restarts (Kernel > Restart), "
               "as soon as nvkit is imported, before any CUDA work.")
    else:
        how = f"Start the process again with: {result.env_line} python ..."
    print(f"nvkit: CUDA is already initialised in this process, so its GPUs cannot change now "
          f"(in force: {where}). Your choice ({result.env_line}) takes effect only after a "
          f"restart. {how}", file=sys.stderr)
    return result


def selection() -> Selection:
    """The cuda:i -> physical GPU mapping in force in this process (with ``.pending``: a choice
    waiting for a kernel restart, if any)."""
    gs = _list_gpus(processes=False)
    allowed, notes = inherited(gs)
    now, devices, more = _in_force_now(gs)
    env = {ORDER: os.environ.get(ORDER), VISIBLE: os.environ.get(VISIBLE)}
    return Selection(now, devices, env, in_force=True, cuda_initialized=cuda_initialized(),
                     pending=STATE.pending_gpus, notes=tuple(notes + more))


def requested() -> Selection:
    """The choice a new process should get: the pending one if any, else the one in force."""
    s = selection()
    return s.pending if s.pending is not None else s


def apply_saved() -> Selection | None:
    """Apply the GPU choice saved for this kernel before it restarted; cheap when there is none.

    Runs at ``import nvkit`` and ``%load_ext nvkit`` (once per process). Only a Jupyter kernel
    whose id has a saved file is affected, and it prints one line saying what it applied.
    """
    if STATE.saved_gpus_applied:
        return None
    STATE.saved_gpus_applied = True
    kid = kernel_id()
    if not kid:
        return None
    path = _saved_path(kid)
    try:
        data = _read_saved(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        print(f"nvkit: ignoring an unreadable saved GPU choice {path} ({e}).", file=sys.stderr)
        return None
    if data.get("pid") == os.getpid() and data.get("process", _process_tag()) == _process_tag():
        return None                       # saved by this very process: it waits for the restart
    choice = data.get("choice")
    uuids = data.get("uuids")
    what = "all GPUs" if choice is None else "CPU only" if choice == [] else f"GPUs {choice}"
    if cuda_initialized():
        print(f"nvkit: a GPU choice saved for this kernel ({what}) was NOT applied: CUDA was "
              "initialised before nvkit was imported. Restart the kernel and run `import nvkit` "
              "(or %load_ext nvkit) before anything uses CUDA.", file=sys.stderr)
        return None
    try:
        sel = _select(uuids if uuids else choice, keep_for_restart=False)
    except NvkitError as e:
        print(f"nvkit: the GPU choice saved before this kernel restarted ({what}) was not "
              f"applied: {e}", file=sys.stderr)
        _forget_saved()
        return None
    mapping = ", ".join(f"cuda:{d.cuda_index}=GPU {d.index}" for d in sel.devices) or "no cuda devices"
    print(f"nvkit: applied the GPU choice saved before this kernel restarted: "
          f"{sel.env_line or 'all GPUs'} ({mapping}).")
    return sel


def launch_command(script: str, nproc_per_node: int | None = None, *, launcher: str = "torchrun",
                   gpus=..., args: Sequence[str] = (), **torchrun_args) -> "LaunchCommand":
    """The exact shell line that runs ``script`` on the chosen GPUs, e.g.
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 torchrun --nproc_per_node=2 train.py``.

    ``gpus`` defaults to this kernel's choice (a pending one first); the variables are always on the
    line itself, so a stale ``export`` can't send the run elsewhere. ``nproc_per_node`` defaults to
    the number of GPUs chosen. ``launcher="accelerate"`` gives the ``accelerate launch`` form; other
    keyword arguments become ``--key=value`` options of the launcher, ``args`` go after the script.
    """
    if not isinstance(script, (str, os.PathLike)) or not os.fspath(script).strip():
        raise NvkitError(f"launch_command needs the script to run, e.g. launch_command('train.py'), not {script!r}.")
    if gpus is ...:
        sel = requested()
        choice = sel.choice
        if choice is None:  # "all": spell them out
            gs = _list_gpus(processes=False)
            allowed, _ = inherited(gs)
            choice = _canonical(None, gs, allowed)
    else:
        gs = _list_gpus(processes=False)
        allowed, _ = inherited(gs)
        choice = _canonical(_resolve(gpus, gs, allowed), gs, allowed)
    env = {ORDER: "PCI_BUS_ID"}
    if choice is not None:
        env[VISIBLE] = ",".join(map(str, choice))
    n = nproc_per_node if nproc_per_node is not None else max(1, len(choice or ()))
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise NvkitError(f"launch_command: nproc_per_node must be a positive integer, not {n!r}.")
    if choice and n > len(choice):
        # every rank takes the GPU of its local rank: the ones past the GPUs on the line find none
        # (or share one, which NCCL refuses), on this machine and on any node the line is run on
        raise NvkitError(
            f"nproc_per_node={n} starts one process per GPU, but {len(choice)} GPU(s) are on the launch "
            f"line ({VISIBLE}={env[VISIBLE]}). Use nproc_per_node={len(choice)} (or fewer), choose more GPUs "
            "(gpus=[...] or nvkit.select_gpus), or run CPU processes with gpus=[] (gloo).")
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)) or not all(
            isinstance(a, (str, int, float, os.PathLike)) and not isinstance(a, bool) for a in args):
        raise NvkitError(f"launch_command: args must be a list of the script's arguments, e.g. "
                         f"args=['--epochs', '3'], not {args!r}.")
    for k, v in torchrun_args.items():
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", k):
            raise NvkitError(f"launch_command: {k!r} is not a launcher option name; options are keywords "
                             "such as master_port=29501 (each becomes --master_port=29501).")
        if v is not None and not isinstance(v, (str, int, float, bool, os.PathLike)):
            raise NvkitError(f"launch_command: the value of {k} must be a string, number or True, not {v!r}.")
    opts = [_opt(k, v) for k, v in torchrun_args.items() if v is not None and v is not False]
    if launcher == "torchrun":
        argv = ["torchrun", f"--nproc_per_node={n}", *opts]
    elif launcher in ("accelerate", "accelerate launch"):
        argv = ["accelerate", "launch", f"--num_processes={n}"]
        if choice == ():
            argv.append("--cpu")
        elif n > 1:
            argv.append("--multi_gpu")
        argv += opts
    else:
        raise NvkitError(f"launch_command: launcher must be 'torchrun' or 'accelerate', not {launcher!r}.")
    return LaunchCommand(env, [*argv, str(script), *map(str, args)])


def _opt(key: str, value) -> str:
    return f"--{key}" if value is True else f"--{key}={value}"


class LaunchCommand(str):
    """The launch line as a string, with ``.env`` (the variables) and ``.argv`` (the command)."""

    env: dict
    argv: list

    def __new__(cls, env: dict, argv: list):
        line = " ".join([_assign(k, v) for k, v in env.items()] + [shlex.quote(a) for a in argv])
        obj = super().__new__(cls, line)
        obj.env = dict(env)
        obj.argv = list(argv)
        return obj
