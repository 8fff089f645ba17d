"""What this process holds now, read cheaply and without ever creating a CUDA context: process RSS,
PyTorch's CUDA allocator (allocated / reserved), NVML's used memory per GPU, and the GPUs this
process's ``cuda:i`` map to. The sampler, the report, the unload check and the OOM post-mortem all
read memory through here.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from dataclasses import dataclass

from ..errors import NvkitError, require
from ..hardware.inventory import gpus as list_gpus, memory_used
from ..hardware.selection import selection


def rss_bytes() -> int:
    """Resident set size of this process (what the OS sees us holding)."""
    try:
        import psutil
        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:  # psutil missing: /proc is enough on Linux
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def torch_module():
    """torch when something already imported it, else None (reading memory never imports torch)."""
    return sys.modules.get("torch")


def cuda_in_use() -> bool:
    """True once this process has a CUDA context (never creates one)."""
    torch = torch_module()
    return bool(torch is not None and torch.cuda.is_initialized())


def _torch_sum(stat: str, devices) -> int:
    if not cuda_in_use():
        return 0
    torch = torch_module()
    devs = range(torch.cuda.device_count()) if devices is None else devices
    return int(sum(getattr(torch.cuda, stat)(d) for d in devs))


def torch_allocated(devices=None) -> int:
    """Bytes held by live tensors in PyTorch's CUDA allocator, summed over ``devices`` (all)."""
    return _torch_sum("memory_allocated", devices)


def torch_reserved(devices=None) -> int:
    """Bytes PyTorch's CUDA allocator holds from the driver, summed over ``devices`` (all)."""
    return _torch_sum("memory_reserved", devices)


def release() -> None:
    """Give freed memory back: Python garbage (the objects ``settle`` kept out of the collector's
    passes looked at again, then what survives settled anew), PyTorch's CUDA cache, glibc's free
    lists."""
    gc.unfreeze()
    settle()
    if cuda_in_use():
        torch_module().cuda.empty_cache()
    if sys.platform.startswith("linux"):
        try:  # glibc keeps freed heap pages unless asked; RSS would then hide a real free
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass


def settle() -> None:
    """Collect the garbage there is now and keep every object that survives out of the garbage
    collector's later passes (``gc.freeze``, as vLLM does after its start-up).

    Why: a full pass walks every object the process holds (with torch, transformers and a model
    loaded, some 400,000) and nothing else runs meanwhile; it comes whenever enough objects have
    outlived the younger passes, so it lands inside whatever runs then: three of them took a third
    of a 1-step fine-tune of the demo model on a 2-core CPU (docs/history.md). With the loaded
    session's objects frozen a pass walks only what came after. Frozen objects are still freed when
    their last reference goes (a model, a PEFT model and nvkit's sessions hold no reference cycle);
    a cycle among them waits for the next ``release`` (a load or an unload), which looks at every
    object again."""
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class Device:
    """One GPU the sampler watches: its cuda ordinal in this process and its nvidia-smi index."""
    cuda_index: int
    index: int            # nvidia-smi (NVML) index
    name: str
    memory_total: int

    @property
    def label(self) -> str:
        return f"cuda:{self.cuda_index}" + ("" if self.index == self.cuda_index else f" (GPU {self.index})")


def visible_gpus() -> list[Device]:
    """The GPUs this process's ``cuda:i`` map to, read without creating a CUDA context."""
    try:
        inventory = {g.index: g for g in list_gpus(processes=False)}
    except Exception:
        return []
    if not inventory:
        return []
    mapping: list[int | None] = []
    try:
        mapping = [d.index for d in selection().devices]
    except Exception:  # selection unavailable: CUDA sees every GPU in NVML order
        mapping = sorted(inventory)
    if not mapping and os.environ.get("CUDA_VISIBLE_DEVICES", None) is None:
        mapping = sorted(inventory)
    out = []
    for ci, phys in enumerate(mapping):
        g = inventory.get(phys) if phys is not None else None
        if g is not None:
            out.append(Device(ci, g.index, g.name, int(g.memory_total)))
    return out


def nvml_used(index: int) -> float:
    try:
        return float(memory_used(index))
    except Exception:
        return float("nan")


def torch_stats(cuda_index: int) -> tuple[float, float]:
    """(allocated, reserved) of one device without building torch's flattened stats dict (the
    sampler calls this up to 20 times a second while a decode loop wants the GIL)."""
    torch = torch_module()
    if torch is None or not torch.cuda.is_initialized():
        return 0.0, 0.0
    try:
        st = torch._C._cuda_memoryStats(cuda_index)
        return float(st["allocated_bytes"]["all"]["current"]), float(st["reserved_bytes"]["all"]["current"])
    except Exception:
        try:
            return float(torch.cuda.memory_allocated(cuda_index)), float(torch.cuda.memory_reserved(cuda_index))
        except Exception:
            return float("nan"), float("nan")


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def fast_rss() -> int:
    """RSS from /proc/self/statm (~20 µs; psutil builds a Process each time, ~1 ms)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return rss_bytes()


def reset_rss_peak() -> bool:
    """Start the kernel's record of this process's peak RSS (VmHWM) over from now; False where it
    cannot be (not Linux, or /proc/self/clear_refs refused), and ``rss_peak`` is then no use."""
    try:  # a kernel interface, not a file on disk: written in place
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak resident set size (Linux 4.0+)
        return True
    except OSError:
        return False


def rss_peak() -> int | None:
    """The peak RSS of this process since ``reset_rss_peak`` (or since it started), as the kernel
    recorded it: exact, however short the peak, where a sampler could miss it. None off Linux."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def pick_devices(every: list, devices, what: str = "sample") -> list:
    """The devices among ``every`` named by ``devices`` (cuda indices; None = all), or NvkitError."""
    if devices is None:
        return list(every)
    require(isinstance(devices, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in devices),
            f"devices must be a list of cuda indices such as [0, 1], or None for all, not {devices!r}.")
    by_ci = {d.cuda_index: d for d in every}
    missing = [d for d in devices if d not in by_ci]
    if missing:
        raise NvkitError(f"No cuda:{missing[0]} to {what}: this process sees "
                         f"{', '.join(d.label for d in every) or 'no GPU'}. Pick from those, or devices=None.")
    return [by_ci[d] for d in devices]


def memory_now(device_type: str) -> tuple[int, int]:
    """(current, peak) bytes of the work running now: PyTorch's allocator on CUDA (current device),
    the process RSS on the CPU (where current and peak are the same reading)."""
    if device_type == "cuda":
        torch = torch_module()
        return int(torch.cuda.memory_allocated()), int(torch.cuda.max_memory_allocated())
    r = rss_bytes()
    return r, r
