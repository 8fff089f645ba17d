"""What the kernel benchmarks (``attention``, ``gemv``) share: the device a run may use (a CUDA GPU,
or Triton's interpreter on the CPU to check the benchmark itself) and the two ways they time a call.

- ``events_us``: calls launched back to back between two CUDA events, for kernels long enough that
  the host's launches keep ahead of them (an attention call over a long cache or many rows);
- ``graph_us``: calls captured in one CUDA graph and replayed, for kernels of a few microseconds
  that a decode step replays from a graph too: launched from Python one by one they would time
  the host, not the GPU.
"""

from __future__ import annotations

import os
import time

from ..errors import NvkitError, require

#: bytes of weight or cache copies a timing graph cycles through: several times any GPU's L2
#: cache, so each call reads from memory as a decode step does
L2_OVERFLOW = 256 * 2**20


def kernel_device(device: str, what: str):
    """``torch.device(device)`` for a kernel benchmark, refused where it cannot run: "cuda" needs a
    GPU, "cpu" needs Triton's interpreter on (``TRITON_INTERPRET=1`` before triton is imported)."""
    import torch
    require(device in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu', not {device!r}.")
    if device == "cuda" and not torch.cuda.is_available():
        raise NvkitError(f"The {what} benchmark times Triton kernels on a CUDA GPU; none is visible here "
                         "(device='cpu' with TRITON_INTERPRET=1 checks the benchmark itself).")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise NvkitError("device='cpu' runs the kernels in Triton's interpreter: start Python with TRITON_INTERPRET=1.")
    return torch.device(device)


def events_us(fn, repeats: int, dev) -> float:
    """Microseconds per call of ``fn`` over ``repeats`` calls (CUDA events on a GPU)."""
    import torch
    if dev.type != "cuda":
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t) * 1e6 / repeats
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def graph_us(fn, inputs: list, repeats: int, dev, replays: int = 3) -> float:
    """Microseconds per call of ``fn(x)``, the calls cycling through ``inputs`` (copies of a weight
    that together overflow the L2 cache, so each call reads from memory as a decode step does): on
    a GPU one CUDA graph of ``repeats`` cycles, captured after a warm-up that compiles, replayed
    ``replays`` times between two events; on the CPU the calls one by one."""
    import torch
    if dev.type != "cuda":
        t = time.perf_counter()
        for x in inputs * repeats:
            fn(x)
        return (time.perf_counter() - t) * 1e6 / (repeats * len(inputs))
    for x in inputs:
        fn(x)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            for x in inputs:
                fn(x)
    graph.replay()
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * repeats * len(inputs))
