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

``MergedWeights`` (the batch-1 step's default, ``StepVariant.lora_merged``): the adapters merged
into a copy of the projections they change, W + B·A per group from the same buffers, one product
with float32 sums rounded once. The batch-1 step with adapters is then the base step over other
weights: the base step's rate, no adapter kernels to compile or launch, and a graph of its own
that switching adapters on and off does not recapture. It costs the copy's memory, so it is made
only where that fits beside what the GPU has free (``merge_why``); elsewhere the products stay
apart. The text is that of PEFT's own merge (``merge_and_unload``): in bf16 a near-tie may pick
another token than PEFT's unmerged forward, as any other order of the same sums may.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from ...units import fmt_bytes
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


def attached(model) -> bool:
    """True when ``model`` carries LoRA layers on the projections, active or not."""
    return any(True for _ in _lora_layers(model))


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


def touched(model) -> frozenset:
    """(layer index, group) of every projection group an active adapter changes now."""
    return frozenset((i, group) for i, group, _, m in _lora_layers(model) if _active(m))


#: at most this share of the memory the GPU has free (its own and the allocator's cached blocks)
#: goes to a merged copy: the rest stays for the caches, the lists' pools and a fine-tune
MERGE_SHARE = 0.5


def _group_bytes(fw: FusedWeights, groups) -> int:
    """The bytes of ``fw``'s projection ``groups`` ((layer, group) pairs)."""
    return sum(getattr(fw.layers[i], g).numel() * getattr(fw.layers[i], g).element_size() for i, g in groups)


def merge_why(fw: FusedWeights, groups, free: int | None = None) -> str | None:
    """Why the projection ``groups`` ((layer, group) pairs) are not merged into a copy (None: they
    fit in ``MERGE_SHARE`` of ``free`` bytes; None: what the GPU has free, its own and the
    allocator's cached blocks; a CPU has no such budget here)."""
    need = _group_bytes(fw, groups)
    if free is None:
        dev = fw.embed.device
        if dev.type != "cuda":
            return None
        import torch
        free = torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    if need > MERGE_SHARE * free:
        return (f"merging the adapter needs a {fmt_bytes(need)} copy of the weights it changes, over "
                f"{MERGE_SHARE:.0%} of the {fmt_bytes(free)} free")
    return None


class MergedWeights:
    """``fw`` with the projection ``groups`` ((layer, group) pairs) replaced by copies holding W +
    B·A of ``slots``' buffers (see the module docstring); ``weights``: the ``FusedWeights`` the
    base step reads instead (every other tensor shared with ``fw``). ``load`` recomputes the
    copies in place, so graphs captured on them read the new values."""

    def __init__(self, fw: FusedWeights, slots: LoraSlots, groups: frozenset):
        import torch
        self.groups = frozenset(groups)
        layers = []
        with torch.inference_mode(False), torch.no_grad():
            for i, w in enumerate(fw.layers):
                copies = {g: torch.empty_like(getattr(w, g), memory_format=torch.contiguous_format)
                          for g in GROUPS if (i, g) in self.groups}
                layers.append(dataclasses.replace(w, spare=None, **copies))
        self.weights = copy.copy(fw)
        self.weights.layers = layers
        self.weights.spare = 0
        self.load(fw, slots)

    def load(self, fw: FusedWeights, slots: LoraSlots) -> None:
        import torch
        with torch.inference_mode(False), torch.no_grad():
            for i, g in sorted(self.groups):
                a, b = getattr(slots.layers[i], g)
                merged = getattr(self.weights.layers[i], g)
                merged.copy_(getattr(fw.layers[i], g))
                # W + B·A in one product whose sums are float32 and rounded once into the copy (no
                # float32 temporary the size of the weights): B and A in the weights' dtype
                merged.addmm_(b.to(merged.dtype), a.to(merged.dtype))

    def nbytes(self) -> int:
        return _group_bytes(self.weights, self.groups)


@dataclass(frozen=True, eq=False)
class AdapterWeights:
    """What a step with the adapters on reads: ``weights``, the merged copy's fused weights (or the
    base ones, where the adapters stay apart), and ``slots``, the buffers whose products it adds
    (None where merged); ``words`` for the stats line. A decoder sharing the batch-1 step's adapters
    (``rows.BatchedDecoder``) builds its adapter steps on these, and again when either changes."""
    weights: FusedWeights
    slots: LoraSlots | None
    words: str

    def same(self, other: AdapterWeights | None) -> bool:
        """Whether ``other`` reads the very same tensors (steps built on it still hold)."""
        return other is not None and other.weights is self.weights and other.slots is self.slots


class Adapters:
    """The batch-1 fused step's adapters: their buffers (``slots``) and, with ``merge``
    (``StepVariant.lora_merged``), their merged copy (``merged``; ``merged_why`` says why there is
    none). ``fold``: the buffers' A folded into the weights' spare rows (``FastOptions.lora_fold``)."""

    def __init__(self, fold: bool, merge: bool):
        self.fold, self.merge = fold, merge
        self.slots: LoraSlots | None = None
        self.merged: MergedWeights | None = None
        self.merged_why: str | None = None
        #: the base weights were replaced (``FusedWeights.sync``) since the copy was made
        self.base_changed = False

    def sync(self, fw: FusedWeights, model) -> bool:
        """Buffers (and copy) as ``model``'s active adapters are now. Returns True where graphs
        captured with adapters must go: new buffers, or a new copy."""
        stale = False
        if self.slots is None or not self.slots.fits(model):
            rank = max(8, -(-needed_rank(model) // 8) * 8)
            self.slots = LoraSlots(fw, rank, adapter_dtype(model), fold=self.fold)
            stale = True
        changed = self.slots.load(model) or self.base_changed or stale
        self.base_changed = False
        if self.merge:
            stale = self._keep_merged(fw, model, changed) or stale
        return stale

    def _keep_merged(self, fw: FusedWeights, model, changed: bool) -> bool:
        """The merged copy for the adapters active on ``model`` now (``changed``: the buffers
        refilled, or the base weights re-synced since the copy was made): an existing copy is
        refilled in place where it covers the groups the adapters change; else a new one is made
        where it fits (``merge_why``, else ``merged_why`` says why not). Returns whether the copy
        the graphs read went (a new one, or none)."""
        groups = touched(model)
        old = self.merged
        if old is not None and groups <= old.groups:
            if changed:
                old.load(fw, self.slots)
            return False
        groups = groups | (old.groups if old is not None else frozenset())
        self.merged_why = merge_why(fw, groups)
        self.merged = MergedWeights(fw, self.slots, groups) if self.merged_why is None else None
        return self.merged is not None or old is not None

    def fits(self, model) -> bool:
        """Whether the buffers (and the copy) hold ``model``'s active adapters without new ones."""
        return self.slots is not None and self.slots.fits(model) and (
            self.merged is None or touched(model) <= self.merged.groups)

    def weights(self, fw: FusedWeights, on: bool):
        """(the fused weights a step reads, the adapter buffers it adds or None): with the
        adapters merged, the copy and none."""
        if on and self.merged is not None:
            return self.merged.weights, None
        return fw, (self.slots if on else None)

    def words(self, on: bool, folds: bool) -> str | None:
        """The stats line's words for the adapters (``on``: active now; ``folds``: the step runs
        the folded products where the buffers are folded); None where none runs."""
        if not on or self.slots is None:
            return None
        if self.merged is not None:
            return f"LoRA merged into a copy of {len(self.merged.groups)} projection groups"
        why = f"; {self.merged_why}" if self.merged_why else ""
        return f"LoRA unmerged (rank ≤ {self.slots.rank}{', folded' if self.slots.folded and folds else ''}{why})"

    def release_merged(self) -> int:
        """Drop the merged copy (the caller drops the graphs on it); returns its bytes."""
        held, self.merged = self.merged, None
        return held.nbytes() if held is not None else 0

