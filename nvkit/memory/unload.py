"""Verified unload: what an unload gave back as NVML, torch and the OS see it, and, when memory
stays held, which live tensors hold it and which names in the notebook reach them."""

from __future__ import annotations

import collections
import functools
import gc
import warnings
from dataclasses import dataclass, field

from .. import events
from ..state import STATE
from ..units import fmt_bytes
from .usage import nvml_used, release, rss_bytes, torch_module, torch_stats, visible_gpus


@dataclass(frozen=True)
class HeldTensor:
    nbytes: int
    shape: tuple
    dtype: str
    device: str
    owners: tuple[str, ...]    # where it is referenced from, when that could be found

    def __str__(self) -> str:
        who = ", ".join(self.owners) if self.owners else "owner not found (a closure, a cache, a traceback?)"
        return f"{fmt_bytes(self.nbytes)} {self.dtype}{list(self.shape)} on {self.device}: {who}"


def live_tensors(device_type: str = "cuda", limit: int = 10, namespace: dict | None = None) -> list[HeldTensor]:
    """The largest live tensors on ``device_type`` found through the garbage collector, one per
    storage, with names that hold them in ``namespace`` (default: the notebook's user namespace)
    where one can be found."""
    torch = torch_module()
    if torch is None:
        return []
    storages: dict[int, tuple[int, object]] = {}
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # the objects usage.settle froze are not in gc.get_objects()
    try:
        with warnings.catch_warnings():
            # isinstance() on every gc object also touches deprecated lazy attributes (a FutureWarning
            # from torch.distributed.reduce_op was seen on the H200): this scan is not the user's code
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                try:
                    if not isinstance(obj, torch.Tensor) or obj.device.type != device_type:
                        continue
                    key, n = _storage(obj)
                except Exception:
                    continue
                if n and (key not in storages or obj.numel() > storages[key][1].numel()):
                    storages[key] = (n, obj)
    finally:
        if frozen:
            gc.freeze()
    top = sorted(storages.items(), key=lambda kv: -kv[1][0])[:limit]
    names = _owner_names({k for k, _ in top}, namespace)
    out = [HeldTensor(n, tuple(t.shape), str(t.dtype).replace("torch.", ""), str(t.device), tuple(names.get(k, ())))
           for k, (n, t) in top]
    del top, storages
    return out


@functools.cache
def _fake_tensor_type() -> tuple:
    """torch.compile's FakeTensor class, as an isinstance() target (looked up once: the live-tensor
    scan asks for every tensor the garbage collector holds)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except Exception:  # noqa: BLE001 - a torch without them has none
        return ()
    return (FakeTensor,)


def _is_tracing_tensor(t) -> bool:
    """A meta tensor or one of torch.compile's FakeTensors: shapes only, no memory of their own
    (and data_ptr() on a FakeTensor warns)."""
    return t.is_meta or isinstance(t, _fake_tensor_type())


def _storage(t) -> tuple[int, int]:
    """(storage address, bytes) of a tensor's memory; (0, 0) for tensors that hold none."""
    if _is_tracing_tensor(t):
        return 0, 0
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _owner_names(keys: set, namespace: dict | None) -> dict[int, list[str]]:
    """storage ptr -> names in the user namespace that reach it (a tensor, a module's parameter or
    buffer, a model output, a list/dict of tensors, IPython's Out history)."""
    torch = torch_module()
    if namespace is None:
        try:
            from IPython import get_ipython
            ip = get_ipython()
            namespace = ip.user_ns if ip is not None else {}
        except Exception:
            namespace = {}
    found: dict[int, list[str]] = collections.defaultdict(list)

    def visit(name, v, depth):
        if isinstance(v, torch.Tensor):
            try:
                k = _storage(v)[0]
            except Exception:
                return
            if k in keys and name not in found[k]:
                found[k].append(name)
        elif depth > 2:
            return
        elif isinstance(v, torch.nn.Module):
            for pn, p in list(v.named_parameters()) + list(v.named_buffers()):
                visit(f"{name}.{pn}", p, 3)
        elif isinstance(v, dict) and depth < 2:
            for kk, vv in list(v.items())[:200]:
                visit(f"{name}[{kk!r}]", vv, depth + 1)
        elif isinstance(v, (list, tuple)) and depth < 2:
            for i, vv in enumerate(list(v)[:200]):
                visit(f"{name}[{i}]", vv, depth + 1)
        elif hasattr(v, "model") and isinstance(getattr(v, "model", None), torch.nn.Module):
            visit(f"{name}.model", v.model, depth + 1)  # a Session, a Trainer, a pipeline
    for name, v in list(namespace.items()):
        if name.startswith("__") or name in ("In", "exit", "quit", "get_ipython"):
            continue
        if name == "Out" or (name.startswith("_") and name.strip("_").isdigit()) or name in ("_", "__", "___"):
            visit(f"{name} (IPython output history)", v, 1 if name == "Out" else 0)
            continue
        visit(name, v, 0)
    # The loaded session holds its weights whether or not a notebook name points at it.
    cur = STATE.session
    if cur is not None and cur.model is not None:
        visit("nvkit.session().model", cur.model, 0)
    return found


@dataclass
class UsageSnapshot:
    t: float
    nvml: dict            # cuda index -> NVML used
    allocated: dict       # cuda index -> torch allocated
    reserved: dict
    rss: int


def usage_snapshot() -> UsageSnapshot:
    devs = visible_gpus()
    nv, al, re_ = {}, {}, {}
    for d in devs:
        nv[d.cuda_index] = nvml_used(d.index)
        a, r = torch_stats(d.cuda_index)
        al[d.cuda_index], re_[d.cuda_index] = a, r
    return UsageSnapshot(events.now(), nv, al, re_, rss_bytes())


@dataclass
class UnloadReport:
    """What an unload gave back, seen by NVML, torch and the OS, and what still holds memory."""
    model_id: str
    device: str
    before: UsageSnapshot
    after: UsageSnapshot
    held: list = field(default_factory=list)   # HeldTensor, when memory stayed held

    @property
    def torch_freed(self) -> int:
        return int(sum(self.before.allocated.values()) - sum(self.after.allocated.values()))

    @property
    def reserved_freed(self) -> int:
        return int(sum(self.before.reserved.values()) - sum(self.after.reserved.values()))

    @property
    def nvml_freed(self) -> dict:
        return {i: self.before.nvml[i] - self.after.nvml.get(i, float("nan")) for i in self.before.nvml}

    @property
    def rss_freed(self) -> int:
        return int(self.before.rss - self.after.rss)

    @property
    def still_allocated(self) -> int:
        return int(sum(self.after.allocated.values()))

    @property
    def freed(self) -> int:
        """The headline number: torch's drop on CUDA, the RSS drop on CPU."""
        return max(0, self.torch_freed if self.device.startswith("cuda") else self.rss_freed)

    def __str__(self) -> str:
        lines = [f"Unloaded {self.model_id} ({self.device}):"]
        if self.device.startswith("cuda"):
            lines.append(f"  torch allocated: −{fmt_bytes(self.torch_freed)} (still {fmt_bytes(self.still_allocated)}), "
                         f"reserved: −{fmt_bytes(self.reserved_freed)}")
            for i, v in self.nvml_freed.items():
                lines.append(f"  NVML used cuda:{i}: −{fmt_bytes(v)} (now {fmt_bytes(self.after.nvml.get(i))})")
        lines.append(f"  process RSS: −{fmt_bytes(self.rss_freed)} (now {fmt_bytes(self.after.rss)})")
        if self.held:
            lines.append("  still held by live tensors:")
            lines += [f"    {h}" for h in self.held]
            lines.append("  Delete those names (del x) or clear the output history (%reset -f out), then "
                         "nvkit.memory.release().")
        return "\n".join(lines)


# Memory left allocated after an unload above this is worth explaining (small leftovers are
# cuBLAS/cuDNN handles' workspaces and RNG state).
HELD_THRESHOLD = 64 * 2**20


def verified_release(model_id: str, device: str, before: UsageSnapshot) -> UnloadReport:
    """Release, measure again, and when CUDA memory stays allocated find what holds it."""
    release()
    after = usage_snapshot()
    rep = UnloadReport(model_id, device, before, after)
    if device.startswith("cuda") and rep.still_allocated > HELD_THRESHOLD:
        rep.held = live_tensors("cuda")
    return rep
