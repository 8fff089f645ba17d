"""The rows steps' Triton kernels compiled before a session's first list (``start``).

Why: on a machine whose Triton cache does not hold nvkit's kernels yet (a new machine or
container), a list's first prompt prefill compiles the kernels its eager layer launches (the norms
with their residual sums, the activation, the per-head q/k norms with RoPE and the pool's writes:
``llama_rows_step.prefill_rows_layer``) one after another, on the request's thread, before its first
token, and its first decode step those of the rows decode layer (the same norms and activation for
one token a row, and the paged attention's two kernels: ``decode_rows_layer``). What they are
compiled for depends on the model's shapes and dtypes (and the page tables' width) only, so once the batch-1
decoder has answered a session's first fast request (``Decoders.compile_ahead``: not during it,
whose host time the compile would share), a daemon thread runs those
layers on meta tensors (shapes and dtypes, no memory, no GPU work) inside
``kernels.launch.compile_only``: each launch is compiled for the arguments the request's launch
will have, and nothing runs. A list that comes sooner compiles whatever is left itself; on a
machine whose cache holds the kernels, the thread only reads them from it.

What keeps it out of the way: the thread holds meta copies of the layers' arguments, not the
weights (an unload frees them at once); each distinct layer (by its arguments' shapes, dtypes and
values) runs once, and a process does each model shape once; the prefill's attention, torch's fused one,
is stood in for by a tensor of its shape (``prefill_rows_layer``'s ``attend``), as torch's choice of
attention backend is process-wide state the thread must not switch; the decode layer's paged
attention is called past its custom op (``decode_rows_layer``'s ``paged``), whose fake
implementation would launch nothing, with the launch the op takes on the model's device. The
layers' own code runs on ``meta`` tensors, so a kernel wrapper that chose its launch by the
tensors' device would compile for another launch; those of these layers do not
(tests/generate/kernels/test_compile_ahead.py holds every launch of a real prefill and decode step
to a compile ahead with the same specialisation).
"""

from __future__ import annotations

import threading
import time

from ...errors import error_summary
from ..kernels import warm
from ..kernels.launch import compile_only
from .llama_rows_step import decode_rows_layer, prefill_rows_layer
from .llama_step import layer_args

#: rows and padded length of the stand-in prompt group (no launch's compile depends on them)
ROWS, LENGTH = 2, 32

_lock = threading.Lock()
_started: set = set()  # the shapes this process has compiled (or is compiling) ahead


def start(fw, table_width: int = 0) -> threading.Thread | None:
    """Compile the rows prefill's kernels for the fused weights ``fw`` in a daemon thread, and
    with ``table_width`` (the page-table entries per row of the session's first pool; 0: the rows
    step's attention is not the paged kernel) the rows decode step's too: its layer with the paged
    attention. None where this process has done so for these shapes already. The thread, its
    seconds, the kernels it compiled and any error go into ``kernels.warm`` (``ahead``,
    ``seconds``, ``errors``: ``warm.words()`` says "rows step kernels" are still compiling
    while it runs)."""
    try:
        work = plan(fw, table_width)
    except Exception as e:  # noqa: BLE001 - a head start only, never a reason for the request to fail
        warm.errors["rows step kernels"] = error_summary(e)
        return None
    with _lock:
        if work.key in _started:
            return None
        _started.add(work.key)
    t = threading.Thread(target=work.run, name="nvkit-compile-ahead", daemon=True)
    warm.ahead["rows step kernels"] = t
    t.start()
    return t


class Plan:
    """The rows steps' distinct layers on meta tensors, ready to run in any thread (``run``):
    ``parts``, each (a layer function, its leading inputs, each distinct layer's arguments)."""

    def __init__(self, parts: list, device, key):
        self.parts, self.device, self.key = parts, device, key

    @property
    def layers(self) -> list:
        """Every part's layer arguments, in order."""
        return [args for _, _, layers in self.parts for args in layers]

    def run(self) -> list[str]:
        """Compile the kernels; returns their names, one per launch, in order."""
        import contextlib

        import torch
        t = time.perf_counter()
        where = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        names: list[str] = []
        try:
            with where, compile_only() as names:
                for layer, inputs, layers in self.parts:
                    for args in layers:
                        layer(*inputs, *args)
        except Exception as e:  # noqa: BLE001 - a head start only: the list compiles whatever is left
            warm.errors["rows step kernels"] = error_summary(e)
        warm.seconds[f"rows step kernels ({len(set(names))})"] = time.perf_counter() - t
        return names


def plan(fw, table_width: int = 0) -> Plan:
    """The work ``start`` does for ``fw`` (and ``table_width``), on meta tensors (made here, in
    the caller's thread)."""
    import torch
    cos, _ = fw.rotary(1)  # the tables' width and dtype (a partial rotation's are narrower than a head)
    layers: dict = {}
    for w in fw.layers:
        args = layer_args(w, None)
        layers.setdefault(_each_tensor(args, _signature), args)
    meta = dict(device="meta")
    hidden = fw.embed.shape[1]
    device = fw.embed.device
    table = torch.empty((1, LENGTH, 1, cos.shape[-1]), dtype=cos.dtype, **meta)
    pool = torch.empty((ROWS * LENGTH, fw.nkv, fw.hd), dtype=fw.dtype, **meta)  # paged_cache.new_arena's
    inputs = (torch.empty((ROWS, LENGTH, hidden), dtype=fw.embed.dtype, **meta), table, table,
              torch.empty((ROWS * LENGTH,), dtype=torch.long, **meta), pool, pool)
    layer = prefill_rows_layer(fw.nh, fw.nkv, fw.hd, fw.residual_scale, fw.weight_first, fw.activation,
                               fw.attn_softcap, kernels=True, attend=_attention_shape)
    metas = [_each_tensor(a, _meta) for a in layers.values()]
    parts = [(layer, inputs, metas)]
    if table_width:
        from ..kernels.add_rms_norm import add_rms_norm
        from ..kernels.paged_attention import default_launch
        from .paged_cache import PAGE
        # the launch the op takes on this device (tensor cores on a GPU's 16-bit pool), asked for by name
        kind = default_launch(torch.empty(0, dtype=fw.dtype, device=device))
        decode = decode_rows_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, "paged", PAGE, True, fw.residual_scale,
                                   fw.weight_first, act=fw.activation, softcap=fw.attn_softcap, paged=_paged(kind))
        h = torch.empty((ROWS, hidden), dtype=fw.embed.dtype, **meta)
        rotary = torch.empty((table_width * PAGE, cos.shape[-1]), dtype=cos.dtype, **meta)
        pages = torch.empty((ROWS * PAGE, fw.nkv, fw.hd), dtype=fw.dtype, **meta)
        parts.append((decode, (h, h, torch.empty((ROWS,), dtype=torch.long, **meta),
                               torch.empty((ROWS, table_width), dtype=torch.int32, **meta), rotary, rotary,
                               None, None, None, None, None, pages, pages), metas))
        # the step's last sum and norm (``llama_step.decode_head``'s kernel; its LM head is torch's)
        parts.append((add_rms_norm, (h, h), [(_meta(fw.norm), fw.norm_eps, fw.weight_first)]))
    key = (str(device), str(fw.dtype), fw.nh, fw.nkv, fw.hd, hidden, tuple(cos.shape[1:]), str(cos.dtype),
           fw.residual_scale, fw.weight_first, fw.activation, fw.attn_softcap, table_width, tuple(layers))
    return Plan(parts, device, key)


def _paged(kind: dict):
    """``paged_decode_attention``'s launch itself (past the op, whose fake implementation launches
    nothing on meta tensors), with the device's launch ``kind`` and two slices, so that the merge
    compiles too (neither kernel specialises on the slice count)."""
    from ..kernels.paged_attention import paged_launch

    def attend(qkv, q_weight, k_weight, cos, sin, k, v, pos, table, page, scale, eps, splits, window, softcap):
        return paged_launch(qkv, q_weight, k_weight, cos, sin, k, v, pos, table, page, scale, eps,
                            splits=splits or 2, window=window, softcap=softcap, **kind)
    return attend


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
