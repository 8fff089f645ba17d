"""The post-mortem of a CUDA out-of-memory: release what the failed step held, then say what was
asked against what was free, the largest consumers and what to try next."""

from __future__ import annotations

import os
import re
import traceback

from .. import events
from ..errors import NvkitError
from ..hardware.inventory import gpus as list_gpus
from ..units import fmt_bytes
from .unload import live_tensors
from .usage import cuda_in_use, release, torch_allocated, torch_module, torch_reserved, visible_gpus


def oom_error(e: BaseException, during: str, session=None):
    """An NvkitError for a CUDA out-of-memory during ``during`` (load, generate, fine-tune), after
    releasing what the failed step held, with what was asked vs free, the largest consumers and
    what to try next."""
    # The traceback's frames still reference the failed step's tensors (activations, the KV
    # cache): clear them first, or release() below would free nothing.
    traceback.clear_frames(e.__traceback__)
    release()
    msg = str(e)
    first = msg.splitlines()[0] if msg else "CUDA out of memory"
    asked = _parse_size(r"Tried to allocate ([\d.]+ [KMGT]i?B)", msg)
    free_then = _parse_size(r"of which ([\d.]+ [KMGT]i?B) is free", msg)
    lines = [f"Out of GPU memory during {during}: {first.rstrip('.')}."]
    if asked is not None:
        lines.append(f"Asked for {fmt_bytes(asked)} while {fmt_bytes(free_then) if free_then is not None else 'less'} "
                     "was free on that GPU.")
    torch = torch_module()
    if cuda_in_use():
        try:
            f, t = torch.cuda.mem_get_info()
            lines.append(f"After releasing the failed step: {fmt_bytes(f)} free of {fmt_bytes(t)}; this process holds "
                         f"{fmt_bytes(torch_allocated())} in tensors, {fmt_bytes(torch_reserved())} reserved.")
        except Exception:
            pass
        try:
            held = live_tensors("cuda", limit=5)
            if held:
                lines.append("Largest live tensors: " + "; ".join(str(h) for h in held) + ".")
        except Exception:
            pass
        lines += _other_processes()
    events.record("oom", f"out of memory during {during}" + (f": asked {fmt_bytes(asked)}" if asked else ""))
    tips = {
        "load": "quantize (quantization='nf4' needs about a quarter of the bf16 weights), device_map='auto' to "
                "split over the selected GPUs, or pick a GPU with more free memory (nvkit.gpus())",
        "generate": "fewer prompts at once (smaller batch), a shorter prompt or max_new_tokens, or quantize the "
                    "model; nvkit.estimate(s, batch_size=..., seq_len=...) shows what fits",
        "fine-tune": "a smaller batch_size or shorter sequences, gradient_checkpointing=True, QLoRA (load with "
                     "quantization='nf4'), or another GPU; nvkit.estimate(s, mode='lora', ...) shows what fits",
    }.get(during, "reduce the batch or sequence length, or quantize")
    lines.append("The failed step's memory was released and the session is still usable.")
    lines.append(f"Next: {tips}.")
    return NvkitError(" ".join(lines))


def _parse_size(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    if not m:
        return None
    num, unit = m.group(1).split()
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}.get(unit, 1)
    return int(float(num) * scale)


def _other_processes() -> list[str]:
    """Other processes on this process's GPUs that NVML can name (often the real culprit)."""
    try:
        mine = os.getpid()
        idx = {d.index for d in visible_gpus()}
        others = [(g.index, p) for g in list_gpus(processes=True) if g.index in idx
                  for p in g.processes if p.pid != mine and p.used_memory]
    except Exception:
        return []
    if not others:
        return []
    others.sort(key=lambda x: -x[1].used_memory)
    return ["Other processes on these GPUs: " + "; ".join(
        f"GPU {i}: pid {p.pid} {p.name or ''} {fmt_bytes(p.used_memory)}" for i, p in others[:5]) + "."]
