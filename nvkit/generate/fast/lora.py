"""LoRA adapters on the fast path, unmerged: the low-rank products run inside the fused steps.

``LoraSlots`` holds, for each layer, one (A, B) pair per group of projections that meet the same
input (q/k/v, o, gate/up, down): A stacks the adapters' A matrices by rows, B places each
adapter's B (times its scaling) in the rows of its projection and the columns of its rank, so
one product pair per group adds every active adapter of every projection in it. The buffers have
a fixed size (``rank`` columns per projection); the host refills them when the adapters change
(another adapter set, one trained further, one disabled), so switching adapters needs no new
capture. Only a larger total rank than the buffers hold makes new ones.

``fold=True`` (``FastOptions.lora_fold``) also writes each group's A, split into a high and a low
half in the weights' dtype, into the spare rows ``FusedWeights`` keeps below the group's weights,
so the batch-1 step computes the base product and x A.T in one reduction (``llama_step.linear``). It
takes effect where the spare rows hold the buffers' rank; else the products stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fused_fit import GROUPS, PROJECTIONS, base_layer, decoder_of, group_names
from .fused_weights import FusedWeights


def _lora_layers(model):
    """(layer index, group, position in group, LoRA layer) for every projection a LoRA wraps."""
    inner = _inner(model)
    for i, layer in enumerate(inner.layers):
        for group, (part, _) in GROUPS.items():
            for j, name in enumerate(group_names(layer, group)):
                m = getattr(getattr(layer, part), name, None)
                if hasattr(m, "lora_A"):
                    yield i, group, j, m


def _inner(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return decoder_of(base)


def _active(m) -> list[str]:
    """The adapters of LoRA layer ``m`` that change its output now."""
    if getattr(m, "disable_adapters", False) or getattr(m, "merged", False):
        return []
    return [a for a in m.active_adapters if a in m.lora_A]


def lora_why(model) -> str | None:
    """Why the adapters on ``model`` cannot run on the fast path (None: they can, or there are none)."""
    configs = getattr(model, "peft_config", None) or {}
    kinds = {str(getattr(c, "peft_type", "")).split(".")[-1] for c in configs.values()}
    if kinds - {"LORA"}:
        return f"adapter type(s) {', '.join(sorted(kinds - {'LORA'}))}: the fast path runs LoRA adapters"
    covered = {id(m) for _, _, _, m in _lora_layers(model)}
    for name, m in model.named_modules():
        cls = type(m).__name__
        if "ModulesToSave" in cls or "TrainableTokens" in cls:
            return f"the adapter trains whole modules ({name}: modules_to_save or trainable tokens)"
        if hasattr(m, "lora_A") and id(m) not in covered:
            return (f"a LoRA adapter sits on {name}; the fast path runs LoRA on the {', '.join(PROJECTIONS)} "
                    "projections (qkv_proj and gate_up_proj where a model computes those as one)")
    import torch.nn as nn
    for _, _, _, m in _lora_layers(model):
        for a in _active(m):
            if getattr(m, "lora_variant", {}).get(a) is not None or getattr(m, "use_dora", {}).get(a):
                return f"adapter {a!r} uses a LoRA variant (DoRA, ...) the fast path does not compute"
            if not isinstance(m.lora_A[a], nn.Linear) or getattr(m.lora_B[a], "bias", None) is not None:
                return f"adapter {a!r} has a LoRA bias or non-Linear LoRA layers"
    return None


def forward_lora_why(model) -> str | None:
    """Why the adapters on ``model`` cannot run in the model's own forward on the fast path (None:
    they can, or there are none): there PEFT's own layers run them, on whatever modules they wrap,
    so any LoRA adapter does; other adapter types change the inputs or the cache."""
    configs = getattr(model, "peft_config", None) or {}
    kinds = {str(getattr(c, "peft_type", "")).split(".")[-1] for c in configs.values()}
    if kinds - {"LORA"}:
        return f"adapter type(s) {', '.join(sorted(kinds - {'LORA'}))}: the fast path runs LoRA adapters"
    return None


def forward_state(model) -> tuple:
    """What a captured graph of the model's own forward bakes in of its adapters: () when none
    changes the output; else each LoRA layer's active adapters with their scaling and the addresses
    of their weights, and each saved module's active copy. A graph captured in one state must not
    replay in another (an adapter switched off, another loaded or merged)."""
    out = []
    for name, m in model.named_modules():
        if hasattr(m, "lora_A"):
            out += [(name, a, float(m.scaling[a]), m.lora_A[a].weight.data_ptr(), m.lora_B[a].weight.data_ptr())
                    for a in _active(m)]
        elif hasattr(m, "modules_to_save") and not getattr(m, "disable_adapters", False):
            out.append((name, str(getattr(m, "active_adapter", ""))))
    return tuple(out)


def active(model) -> bool:
    """True when some LoRA adapter changes the model's output now (attached, enabled, unmerged)."""
    return any(_active(m) for _, _, _, m in _lora_layers(model))


def needed_rank(model) -> int:
    """The largest total rank of the active adapters on any one projection."""
    return max((sum(m.lora_A[a].out_features for a in _active(m)) for _, _, _, m in _lora_layers(model)), default=0)


def kernel_folds(device) -> bool:
    """Whether the uncompiled step with nvkit's kernels runs the folded products on ``device``
    (``kernels.lora_add.linear``: where ``torch.mm`` gives float32 products)."""
    from ..kernels.lora_add import fp32_products
    return fp32_products(device)


def adapter_dtype(model):
    import torch
    dtypes = {m.lora_A[a].weight.dtype for _, _, _, m in _lora_layers(model) for a in _active(m)}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


@dataclass
class LayerLora:
    qkv: tuple[Any, Any]
    o: tuple[Any, Any]
    gate_up: tuple[Any, Any]
    down: tuple[Any, Any]
    #: folded: per group (qkv, o, gate_up, down), the weights with A's halves below them (views
    #: of ``FusedWeights``' tensors, cut to this rank); None where the products stay apart
    folded: tuple | None = None


class LoraSlots:
    """The device buffers the fused steps read the adapters from (see the module docstring)."""

    def __init__(self, fw: FusedWeights, rank: int, dtype, fold: bool = False):
        import torch
        self.rank, self.dtype = rank, dtype
        #: A folded into the weights' spare rows (see the module docstring)
        self.folded = fold and fw.spare >= 2 * rank
        dev = fw.embed.device
        self.layers: list[LayerLora] = []
        with torch.inference_mode(False):
            for w, layer in zip(fw.layers, decoder_of(fw.model).layers):
                pairs, folded = {}, []
                for group, weight, spare in zip(GROUPS, (w.qkv, w.o, w.gate_up, w.down), w.spare or (None,) * 4):
                    n = len(group_names(layer, group))
                    pairs[group] = (torch.zeros(n * rank, weight.shape[1], dtype=dtype, device=dev),
                                    torch.zeros(weight.shape[0], n * rank, dtype=dtype, device=dev))
                    if self.folded:
                        folded.append(spare[:weight.shape[0] + 2 * n * rank])
                self.layers.append(LayerLora(**pairs, folded=tuple(folded) if self.folded else None))
        self._signature = None

    def fits(self, model) -> bool:
        return needed_rank(model) <= self.rank and adapter_dtype(model) == self.dtype

    @staticmethod
    def signature(model) -> tuple:
        """What the buffers were filled from: which adapters are active where, and the identity
        and version (in-place updates: a training step) of their weights."""
        sig = []
        for i, group, j, m in _lora_layers(model):
            for a in _active(m):
                A, B = m.lora_A[a].weight, m.lora_B[a].weight
                sig.append((i, group, j, a, A.data_ptr(), A._version, B.data_ptr(), B._version, float(m.scaling[a])))
        return tuple(sig)

    def load(self, model) -> bool:
        """Fill the buffers from the model's active adapters; False when nothing changed."""
        import torch
        sig = self.signature(model)
        if sig == self._signature:
            return False
        with torch.inference_mode(False), torch.no_grad():
            for layer in self.layers:
                for a, b in (layer.qkv, layer.o, layer.gate_up, layer.down):
                    a.zero_()
                    b.zero_()
            for i, group, j, m in _lora_layers(model):
                a_buf, b_buf = getattr(self.layers[i], group)
                layer = _inner(model).layers[i]
                part, names = GROUPS[group][0], group_names(layer, group)
                owner = getattr(layer, part)
                row0 = sum(base_layer(getattr(owner, name)).out_features for name in names[:j])  # rows before it
                col = j * self.rank
                for ad in _active(m):
                    A, B = m.lora_A[ad].weight, m.lora_B[ad].weight
                    r, rows = A.shape[0], B.shape[0]
                    a_buf[col:col + r].copy_(A)
                    b_buf[row0:row0 + rows, col:col + r].copy_(B.to(torch.float32) * float(m.scaling[ad]))
                    col += r
            if self.folded:
                for layer in self.layers:
                    for (a, b), stacked in zip((layer.qkv, layer.o, layer.gate_up, layer.down), layer.folded):
                        n = b.shape[0]
                        high = a.to(stacked.dtype)
                        stacked[n:n + a.shape[0]].copy_(high)
                        stacked[n + a.shape[0]:].copy_((a.to(torch.float32) - high.to(torch.float32)).to(stacked.dtype))
        self._signature = sig
        return True
