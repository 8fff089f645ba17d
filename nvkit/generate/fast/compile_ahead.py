"""The rows prefill's Triton kernels compiled before a session's first list (``start``).

Why: on a machine whose Triton cache does not hold nvkit's kernels yet (a new machine or
container), a list's first prompt prefill compiles the kernels its eager layer launches (the norms
with their residual sums, the activation, the per-head q/k norms with RoPE and the pool's writes:
``llama_rows_step.prefill_rows_layer``) one after another, on the request's thread, before its first
token. What they are compiled for depends on the model's shapes and dtypes only, so once the batch-1
decoder has answered a session's first fast request (``Decoders.compile_ahead``: not during it,
whose host time the compile would share), a daemon thread runs that
layer on meta tensors (shapes and dtypes, no memory, no GPU work) inside
``kernels.launch.compile_only``: each launch is compiled for the arguments the request's launch
will have, and nothing runs. A list that comes sooner compiles whatever is left itself; on a
machine whose cache holds the kernels, the thread only reads them from it.

What keeps it out of the way: the thread holds meta copies of the layers' arguments, not the
weights (an unload frees them at once); each distinct layer (by its arguments' shapes, dtypes and
values) runs once, and a process does each model shape once; the attention, torch's fused one,
is stood in for by a tensor of its shape (``prefill_rows_layer``'s ``attend``), as torch's choice of
attention backend is process-wide state the thread must not switch. The layer's own code runs on
``meta`` tensors, so a kernel wrapper that chose its launch by the tensors' device would compile
for another launch; those of the prefill layer do not (tests/generate/kernels/test_compile_ahead.py
holds every launch of a real prefill to a compile ahead with the same specialisation).
"""

from __future__ import annotations

import threading
import time

from ...errors import error_summary
from ..kernels import warm
from ..kernels.launch import compile_only
from .llama_rows_step import prefill_rows_layer
from .llama_step import layer_args

#: rows and padded length of the stand-in prompt group (no launch's compile depends on them)
ROWS, LENGTH = 2, 32

_lock = threading.Lock()
_started: set = set()  # the shapes this process has compiled (or is compiling) ahead


def start(fw) -> threading.Thread | None:
    """Compile the rows prefill's kernels for the fused weights ``fw`` in a daemon thread; None
    where this process has done so for these shapes already. The thread, its seconds, the kernels it
    compiled and any error go into ``kernels.warm`` (``ahead``, ``seconds``, ``errors``: ``warm.words()``
    says "rows prefill kernels" are still compiling while it runs)."""
    try:
        work = plan(fw)
    except Exception as e:  # noqa: BLE001 - a head start only, never a reason for the request to fail
        warm.errors["rows prefill kernels"] = error_summary(e)
        return None
    with _lock:
        if work.key in _started:
            return None
        _started.add(work.key)
    t = threading.Thread(target=work.run, name="nvkit-compile-ahead", daemon=True)
    warm.ahead["rows prefill kernels"] = t
    t.start()
    return t


class Plan:
    """The rows prefill's distinct layers on meta tensors, ready to run in any thread (``run``)."""

    def __init__(self, layer, inputs: tuple, layers: list, device, key):
        self.layer, self.inputs, self.layers, self.device, self.key = layer, inputs, layers, device, key

    def run(self) -> list[str]:
        """Compile the kernels; returns their names, one per launch, in order."""
        import contextlib

        import torch
        t = time.perf_counter()
        where = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        names: list[str] = []
        try:
            with where, compile_only() as names:
                for args in self.layers:
                    self.layer(*self.inputs, *args)
        except Exception as e:  # noqa: BLE001 - a head start only: the list compiles whatever is left
            warm.errors["rows prefill kernels"] = error_summary(e)
        warm.seconds[f"rows prefill kernels ({len(set(names))})"] = time.perf_counter() - t
        return names


def plan(fw) -> Plan:
    """The work ``start`` does for ``fw``, on meta tensors (made here, in the caller's thread)."""
    import torch
    cos, _ = fw.rotary(1)  # the tables' width and dtype (a partial rotation's are narrower than a head)
    layers: dict = {}
    for w in fw.layers:
        args = layer_args(w, None)
        layers.setdefault(_each_tensor(args, _signature), args)
    meta = dict(device="meta")
    hidden = fw.embed.shape[1]
    table = torch.empty((1, LENGTH, 1, cos.shape[-1]), dtype=cos.dtype, **meta)
    pool = torch.empty((ROWS * LENGTH, fw.nkv, fw.hd), dtype=fw.dtype, **meta)  # paged_cache.new_arena's
    inputs = (torch.empty((ROWS, LENGTH, hidden), dtype=fw.embed.dtype, **meta), table, table,
              torch.empty((ROWS * LENGTH,), dtype=torch.long, **meta), pool, pool)
    layer = prefill_rows_layer(fw.nh, fw.nkv, fw.hd, fw.residual_scale, fw.weight_first, fw.activation,
                               fw.attn_softcap, kernels=True, attend=_attention_shape)
    device = fw.embed.device
    key = (str(device), str(fw.dtype), fw.nh, fw.nkv, fw.hd, hidden, tuple(cos.shape[1:]), str(cos.dtype),
           fw.residual_scale, fw.weight_first, fw.activation, fw.attn_softcap, tuple(layers))
    return Plan(layer, inputs, [_each_tensor(a, _meta) for a in layers.values()], device, key)


def _attention_shape(q, k, v, scaling, window, softcap):
    return q  # (rows, heads, length, head dim), as the attention's output


def _each_tensor(x, fn):
    """``x`` (a layer's arguments: tensors, numbers, None, nested tuples) with ``fn`` applied to each tensor."""
    import torch
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return tuple(_each_tensor(v, fn) for v in x)
    return x


def _meta(t):
    import torch
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")


def _signature(t):
    """What a launch's compile can depend on in a tensor argument: its shape, strides and dtype."""
    return ("tensor", tuple(t.shape), tuple(t.stride()), str(t.dtype))
