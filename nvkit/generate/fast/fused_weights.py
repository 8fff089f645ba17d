"""The weights of a model nvkit's fused steps run (``FusedWeights``; which models fit them, and
the facts of their layout: ``fused_fit``).

The steps read every weight from ``FusedWeights``, never through the model's modules: the q/k/v
and gate/up projections become one product each (the modules' weights are re-pointed at slices of
one fused tensor, so no memory is added and the model computes exactly as before), and a module
wrapped later (a LoRA layer) or swapped (another RMSNorm implementation) changes nothing the
captured graphs read. ``FusedWeights.sync`` copies weights the model replaced (an adapter merged,
new weights loaded) into the tensors the graphs read, so no capture is repeated for that. With
spare rows (``FusedWeights(spare=...)``, ``FastOptions.lora_fold``) the batch-1 step can fold an
adapter's first product into the base one (``llama_step.linear``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...memory.estimate import attention_dims
from .fused_fit import (activation, decoder_of, base_layer, group_names, layer_kinds, long_rope_from, norm_eps,
                        unit_offset_norms, weight_first_norms)

# --- the weights the steps read ----------------------------------------------------------------

@dataclass
class _Slot:
    """One weight the steps read: how to find the model's current tensor, and the tensor (or the
    slice of a fused tensor) the captured graphs read. ``derive``: the steps read a tensor computed
    from the parameter (the Gemma norms' float32 1 + w), recomputed when the parameter is replaced
    or changed in place (``seen``: its storage and version counter when last derived)."""
    find: Callable[[], Any]   # -> the model's nn.Parameter now
    held: Any
    derive: Callable[[Any], Any] | None = None
    seen: tuple = ()


@dataclass
class LayerWeights:
    in_norm: Any      # None: OLMo 2's layout (the branches' outputs normed: post_norm, ff_norm)
    in_eps: float
    qkv: Any          # (q + 2 kv rows, hidden): q, k and v stacked
    qkv_bias: Any
    q_norm: Any       # RMS norm weights per head (Qwen3) or over all heads (OLMo 2), else None
    k_norm: Any
    qk_eps: float
    o: Any
    o_bias: Any
    post_norm: Any
    post_eps: float
    gate_up: Any      # (2 x intermediate, hidden): gate and up stacked
    gate_up_bias: Any
    down: Any
    down_bias: Any
    scaling: float
    #: False where the layer applies no RoPE (SmolLM3's NoPE layers): the steps hand such a layer
    #: a rotary table of cos 1 and sin 0, which leaves q and k exactly as they are
    rope: bool = True
    #: OLMo 2, Gemma 2/3: the norm of the MLP's output (``post_norm`` is then the attention output's)
    ff_norm: Any = None
    ff_eps: float = 0.0
    #: Gemma 2/3: the norm of the MLP's input (with ``ff_norm``; OLMo 2's MLP reads the residual as it is)
    mlp_norm: Any = None
    mlp_eps: float = 0.0
    #: a sliding-window layer's window (it attends to the positions p - window < j <= p); 0: every position
    window: int = 0
    #: which of ``FusedWeights.rope_kinds``' rotary tables the layer's RoPE reads
    rope_table: int = 0
    #: with spare rows: the qkv, o, gate_up and down tensors with those rows below the weights
    #: (``qkv`` etc. are views of their first rows); None without
    spare: tuple | None = None


class FusedWeights:
    """The tensors the fused steps read, kept in step with the model (``sync``).

    ``spare``: rows of zeros allocated below each projection's weights (per projection of a
    group), where ``lora.LoraSlots`` may fold adapters in; the o and down projections then get
    tensors of their own too (the model's parameters re-pointed at them, as for q/k/v)."""

    def __init__(self, model, spare: int = 0):
        import torch
        self.model = model
        self.spare = spare
        inner = decoder_of(model)
        self.nh, self.nkv, self.hd = attention_dims(model.config)
        self.dtype = model.dtype
        self._slots: list[_Slot] = []
        # Fusing can happen inside generation, under inference_mode; tensors made there could never
        # be used for training again ("Inference tensors cannot be saved for backward"). The fused
        # tensors must be ordinary ones.
        cfg = model.config.get_text_config()
        #: the Gemma family's norms: the steps read float32 1 + w (``_norm``)
        self.unit_offset = unit_offset_norms(cfg)
        #: Gemma 3: a rotary table per attention kind (its rotary module takes the layer's kind);
        #: one table (named None) for every other model
        import inspect
        takes_kind = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
        self.rope_kinds: list = ([t for t in sorted(set(cfg.layer_types)) if hasattr(inner.rotary_emb, f"{t}_inv_freq")]
                                 if takes_kind else [None])
        with torch.inference_mode(False), torch.no_grad():
            self.embed = self._own(lambda: inner.embed_tokens.weight)
            self.norm = self._norm(lambda: inner.norm.weight)
            self.norm_eps = norm_eps(inner.norm)
            self.lm_head = self._own(lambda: model.lm_head.weight)
            kinds = layer_kinds(cfg)
            self.layers = [self._layer(layer, kinds[i], cfg) for i, layer in enumerate(inner.layers)]
        self.nope = not all(w.rope for w in self.layers)
        self.intermediate = int(self.layers[0].down.shape[1])  # the MLP's width (a prefill's activations)
        #: the MLP's gate activation (``ACTIVATIONS``)
        self.activation = activation(inner.layers[0].mlp)
        # Granite's constants, applied where its forward applies them: the embeddings times one,
        # each residual branch (attention and MLP output) times another, the logits divided by a
        # third; None where the family has none (the steps then skip the operation)
        granite = getattr(cfg, "model_type", None) == "granite"
        #: OLMo 2's and Gemma's norms multiply by the weight in float32 before rounding (Llama's round first)
        self.weight_first = weight_first_norms(cfg)
        scale = getattr(inner.embed_tokens, "embed_scale", None)  # Gemma: sqrt(hidden), rounded to the weights' dtype
        self.embed_scale = (float(cfg.embedding_multiplier) if granite
                            else float(scale.to(self.dtype)) if torch.is_tensor(scale) else None)
        self.residual_scale = float(cfg.residual_multiplier) if granite else None
        self.logits_scale = float(cfg.logits_scaling) if granite else None
        #: Gemma 2: the attention scores and the logits soft-capped (cap · tanh(x / cap)); None: not
        self.attn_softcap = _cap(getattr(cfg, "attn_logit_softcapping", None))
        self.logits_softcap = _cap(getattr(cfg, "final_logit_softcapping", None))
        #: LongRoPE: the original context, past which a prompt takes the long factors' tables
        self.long_from = long_rope_from(cfg)

    def _norm(self, find):
        """A norm's weight as the steps multiply by it: the parameter, or for the Gemma family float32
        1 + w (what its norms compute before every product), kept in step by ``sync``."""
        if not self.unit_offset:
            return self._own(find)
        import torch
        p = find()
        slot = _Slot(find, None, lambda t: 1.0 + t.detach().to(torch.float32), (p.data_ptr(), p._version))
        slot.held = slot.derive(p).contiguous()
        self._slots.append(slot)
        return slot.held

    def _own(self, find):
        p = find()
        self._slots.append(_Slot(find, p.data))
        return p.data

    def _fused(self, finds: list) -> tuple[Any, Any]:
        """One tensor for weights that meet the same input, stacked by rows (and ``spare`` rows
        of zeros per weight below them); each parameter is re-pointed at its slice, so memory
        stays as it was and the modules compute what they did. Returns (the weights' rows, the
        whole tensor with the spare rows)."""
        import torch
        params = [f() for f in finds]
        spare = [torch.zeros(self.spare * len(params), params[0].shape[1], dtype=params[0].dtype,
                             device=params[0].device)] if self.spare else []
        fused = torch.cat([p.detach() for p in params] + spare)
        off = 0
        for f, p in zip(finds, params):
            n = p.shape[0]
            p.data = fused[off:off + n]
            self._slots.append(_Slot(f, p.data))
            off += n
        return fused[:off], fused

    def _layer(self, layer, kind: str, cfg) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp

        def lin(parent, name, what="weight"):
            return lambda: getattr(base_layer(getattr(parent, name)), what)

        qkv_names, gate_up_names = group_names(layer, "qkv"), group_names(layer, "gate_up")
        qkv, qkv_spare = self._fused([lin(attn, n) for n in qkv_names])
        qkv_bias = self._bias_group(attn, qkv_names, lin)
        gate_up, gate_up_spare = self._fused([lin(mlp, n) for n in gate_up_names])
        gate_up_bias = self._bias_group(mlp, gate_up_names, lin)
        has_qk = hasattr(attn, "q_norm")
        spare = None
        if self.spare:
            (o, o_spare), (down, down_spare) = self._fused([lin(attn, "o_proj")]), self._fused([lin(mlp, "down_proj")])
            spare = (qkv_spare, o_spare, gate_up_spare, down_spare)
        else:
            o, down = self._own(lin(attn, "o_proj")), self._own(lin(mlp, "down_proj"))
        pre, post = hasattr(layer, "input_layernorm"), hasattr(layer, "post_feedforward_layernorm")
        both = pre and post
        table = self.rope_kinds.index(cfg.layer_types[layer.self_attn.layer_idx]) if self.rope_kinds != [None] else 0
        return LayerWeights(
            in_norm=self._norm(lambda: layer.input_layernorm.weight) if pre else None,
            in_eps=norm_eps(layer.input_layernorm) if pre else 0.0,
            qkv=qkv, qkv_bias=qkv_bias,
            q_norm=self._norm(lambda: attn.q_norm.weight) if has_qk else None,
            k_norm=self._norm(lambda: attn.k_norm.weight) if has_qk else None,
            qk_eps=norm_eps(attn.q_norm) if has_qk else 0.0,
            o=o,
            o_bias=self._own(lin(attn, "o_proj", "bias")) if lin(attn, "o_proj", "bias")() is not None else None,
            post_norm=self._norm(lambda: layer.post_attention_layernorm.weight),
            post_eps=norm_eps(layer.post_attention_layernorm),
            gate_up=gate_up, gate_up_bias=gate_up_bias,
            down=down,
            down_bias=self._own(lin(mlp, "down_proj", "bias")) if lin(mlp, "down_proj", "bias")() is not None else None,
            scaling=float(getattr(attn, "scaling", self.hd ** -0.5)), rope=bool(getattr(attn, "use_rope", True)),
            ff_norm=self._norm(lambda: layer.post_feedforward_layernorm.weight) if post else None,
            ff_eps=norm_eps(layer.post_feedforward_layernorm) if post else 0.0,
            mlp_norm=self._norm(lambda: layer.pre_feedforward_layernorm.weight) if both else None,
            mlp_eps=norm_eps(layer.pre_feedforward_layernorm) if both else 0.0,
            window=int(cfg.sliding_window) if kind == "sliding_attention" else 0, rope_table=table, spare=spare)

    def _bias_group(self, parent, names, lin):
        """Stacked biases of projections that share an input (a missing one is zeros of its
        rows), or None when none has a bias."""
        import torch
        weights = [lin(parent, n)() for n in names]
        finds = [lin(parent, n, "bias") for n in names]
        present = [f() for f in finds]
        if all(b is None for b in present):
            return None
        ref = next(b for b in present if b is not None)
        fused = torch.cat([b.detach() if b is not None else torch.zeros(w.shape[0], dtype=ref.dtype, device=ref.device)
                           for b, w in zip(present, weights)])
        off = 0
        for f, b, w in zip(finds, present, weights):
            n = w.shape[0]
            if b is not None:
                b.data = fused[off:off + n]
                self._slots.append(_Slot(f, b.data))
            off += n
        return fused

    def sync(self) -> int:
        """Bring the tensors the steps read up to date with the model's parameters; returns how
        many were replaced by the model since the last call (0: nothing to do).

        A parameter whose tensor is no longer ours (merging an adapter, loading weights, swapping a
        norm module) is copied into ours and re-pointed at it, so graphs captured earlier read the
        new values and memory stays as it was. A parameter changed in place needs nothing."""
        import torch
        changed = 0
        with torch.inference_mode(False), torch.no_grad():
            for slot in self._slots:
                p = slot.find()
                if p is None:
                    raise ValueError("a weight the fused step reads is gone from the model")
                if slot.derive is not None:
                    if (p.data_ptr(), p._version) != slot.seen:
                        if p.shape != slot.held.shape or p.device != slot.held.device:
                            raise ValueError(f"a weight changed shape or device ({tuple(slot.held.shape)} -> "
                                             f"{tuple(p.shape)})")
                        slot.held.copy_(slot.derive(p))
                        slot.seen = (p.data_ptr(), p._version)
                        changed += 1
                    continue
                if p.data_ptr() == slot.held.data_ptr() and p.shape == slot.held.shape:
                    continue
                if p.shape != slot.held.shape or p.dtype != slot.held.dtype or p.device != slot.held.device:
                    raise ValueError(f"a weight changed shape, dtype or device ({tuple(slot.held.shape)} "
                                     f"{slot.held.dtype} -> {tuple(p.shape)} {p.dtype})")
                slot.held.copy_(p.data)
                p.data = slot.held
                changed += 1
        return changed

    def rotary(self, length: int, long: bool = False):
        """(cos, sin) tables of positions 0..length-1 in the model's dtype, computed by the model's
        own rotary module (a lookup per step instead of its kernels): (length, rotary width), or with
        several rotary kinds (Gemma 3) each kind's table below the last, (kinds × length, width)
        (``llama_step.rotary_kinds`` takes them apart). LongRoPE: the short factors' tables up to
        ``long_from`` (past it the long ones, where only a request's spare steps land), or with
        ``long`` the long factors' everywhere; the module picks them by the last position it is
        given, so each part comes from a call that ends where it should."""
        import torch
        inner = decoder_of(self.model)
        dev = self.embed.device
        probe = torch.zeros(1, 1, dtype=self.dtype, device=dev)
        start = self.long_from
        if start is None:
            spans = [(0, length)]
        elif long:
            spans = [(0, max(length, start + 1))]
        else:
            spans = [(a, b) for a, b in ((0, min(length, start)), (start, length)) if b > a]

        def table(kind, a, b):
            positions = torch.arange(a, b, device=dev).view(1, b - a)
            cos, sin = (inner.rotary_emb(probe, positions) if kind is None
                        else inner.rotary_emb(probe, positions, kind))
            return cos.reshape(b - a, -1), sin.reshape(b - a, -1)
        per_kind = [[table(kind, a, b) for a, b in spans] for kind in self.rope_kinds]
        return tuple(torch.cat([torch.cat([p[i] for p in parts])[:length] for parts in per_kind]).contiguous()
                     for i in (0, 1))

    def rotary_for(self, holder, longest_prompt: int) -> None:
        """LongRoPE: ``holder``'s tables (a ``static_cache.Cache`` or ``paged_cache.Arena``) the
        short or the long factors', as the request's longest prompt asks (``long_rope_from``), copied
        in place, so the graphs captured on them read the new ones; nothing for another model."""
        if self.long_from is None:
            return
        long = longest_prompt > self.long_from
        if holder.rope_long != long:
            cos, sin = self.rotary(holder.cos.shape[0] // len(self.rope_kinds), long)
            holder.cos.copy_(cos)
            holder.sin.copy_(sin)
            holder.rope_long = long


def _cap(value) -> float | None:
    return float(value) if value else None
