"""The Llama family's weights as nvkit's fused steps read them (``FusedWeights``), and whether a
model fits those steps (``fusable_why``, ``qk_norm_why``).

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

# Architectures whose decoder layer is exactly: RMSNorm, q/k/v (optional q/k RMSNorm), RoPE,
# attention, o, residual, RMSNorm, gated MLP, residual (checked module by module in fusable_why).
# SmolLM3 leaves RoPE out of some layers (``LayerWeights.rope``); Granite scales the embeddings, each
# residual branch and the logits by constants of its config (``FusedWeights.embed_scale`` etc.);
# OLMo 2 norms each branch's output instead of its input, and q and k over all heads at once
# (``LayerWeights.in_norm`` None, ``ff_norm``; ``FusedWeights.weight_first``). The Gemma family
# multiplies its norms by 1 + w in float32 (``unit_offset_norms``), scales the embeddings by
# sqrt(hidden) rounded to the weights' dtype and gates its MLP with GELU (tanh form); Gemma 2 and 3
# norm each branch before and after it (four norms, ``LayerWeights.mlp_norm``), keep some layers to a
# sliding window (``LayerWeights.window``), Gemma 2 soft-caps the attention scores and the logits, and
# Gemma 3 gives its sliding layers a rotary table of their own (``LayerWeights.rope_table``).
# Phi-3 (and Phi-4-mini) computes q/k/v and gate/up as one module each (``GROUPS``) and rotates
# only part of each head (the rotary tables are narrower than the head: ``llama_step.rope``); with
# LongRoPE its tables are the short or the long factors' by the request (``FusedWeights.rotary_for``).
FUSABLE = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "granite", "olmo2", "gemma", "gemma2", "gemma3_text",
           "phi3")
# the layer norms of the three layouts: before attention and MLP (Llama), after them (OLMo 2),
# before and after both (Gemma 2/3)
PRE_NORMS = ("input_layernorm", "post_attention_layernorm")
POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm")
BOTH_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
NORM_NAMES = BOTH_NORMS
#: the MLP's gate activations the steps compute (``activation``): name -> transformers' function
ACTIVATIONS = ("silu", "gelu_tanh")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: the projections that meet the same input, one product each in the steps: group -> (the layer's
#: part, the forms its modules take: Llama's names, or one module for the whole group as Phi-3's)
GROUPS = {"qkv": ("self_attn", (("q_proj", "k_proj", "v_proj"), ("qkv_proj",))),
          "o": ("self_attn", (("o_proj",),)),
          "gate_up": ("mlp", (("gate_proj", "up_proj"), ("gate_up_proj",))),
          "down": ("mlp", (("down_proj",),))}


def group_names(layer, group: str) -> tuple[str, ...]:
    """The names of ``layer``'s modules in projection group ``group`` (``GROUPS``), in the order
    their rows stack: Llama's separate projections, or the one module that computes the group."""
    part, forms = GROUPS[group]
    owner = getattr(layer, part, None)
    return next((names for names in forms if owner is not None and all(hasattr(owner, n) for n in names)), forms[0])


def decoder_of(model):
    """The text decoder of a causal LM (its ``layers``, ``embed_tokens``, ``norm``, ``rotary_emb``):
    ``model.model``, or for a vision-language model that generates text (Gemma 3 from 4B up)
    its language model, ``model.model.language_model``; None when it has neither."""
    inner = getattr(model, "model", None)
    if inner is not None and not hasattr(inner, "layers"):
        inner = getattr(inner, "language_model", None)
    return inner


def base_layer(module):
    """The plain layer under a PEFT LoRA wrapper (the module itself when it is not wrapped)."""
    return getattr(module, "base_layer", module)


def weight_first_norms(cfg) -> bool:
    """OLMo 2's and the Gemma family's norms: the weight multiplied in float32 before rounding
    (Llama's round first). OLMo 2's apply to whole branches' outputs and to all heads' q and k at once."""
    return getattr(cfg, "model_type", None) == "olmo2" or unit_offset_norms(cfg)


def unit_offset_norms(cfg) -> bool:
    """The Gemma family's norms: they multiply by 1 + w (w stored as an offset from one), in float32."""
    return getattr(cfg, "model_type", None) in ("gemma", "gemma2", "gemma3_text")


def long_rope_from(cfg) -> int | None:
    """A LongRoPE model's original context (Phi-3 128k, Phi-3.5, Phi-4-mini): a text up to that
    long is rotated with the short factors, a longer one with the long factors from its first
    position (transformers encodes the whole text again where it grows past it). None for another
    RoPE, or a LongRoPE whose rotary parameters differ by layer."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if params.get("rope_type") != "longrope":
        return None
    start = params.get("original_max_position_embeddings") or getattr(cfg, "original_max_position_embeddings", None)
    return int(start) if start else None


def activation(mlp) -> str | None:
    """The MLP's gate activation as the steps name it (``ACTIVATIONS``), or None for another one:
    SiLU, or GELU in its tanh form as torch computes it (transformers' ``gelu_pytorch_tanh``; its
    Python formula rounds otherwise)."""
    import functools

    import torch.nn as nn
    from transformers.activations import GELUTanh, SiLUActivation
    act = getattr(mlp, "act_fn", getattr(mlp, "activation_fn", None))  # Phi-3 names it activation_fn
    if isinstance(act, (SiLUActivation, nn.SiLU)):
        return "silu"
    if isinstance(act, GELUTanh) and isinstance(getattr(act, "act", None), functools.partial):
        return "gelu_tanh"
    return None


def invariant_why(model) -> str | None:
    """Why the batch-invariant rows step (``deterministic=True``, ``rows_invariant``) does not fit
    ``model`` (None when it does): the fused step must, in a layout whose every norm runs in nvkit's
    row kernels; OLMo 2's run in torch's reductions, whose order follows the number of rows."""
    why = fusable_why(model)
    cfg = model.config.get_text_config()
    if why is None and unit_offset_norms(cfg):
        why = "the Gemma family's norms (times 1 + w in float32) run in torch's reductions, which follow the row count"
    elif why is None and weight_first_norms(cfg):
        why = "OLMo 2's norms (over whole branches and all heads) run in torch's reductions, which follow the row count"
    return why


def fusable_why(model) -> str | None:
    """Why the fused steps do not fit ``model`` (None when they do). ``model`` is the causal LM
    itself, not a PEFT wrapper (``lora.lora_why`` judges the adapters)."""
    cfg = model.config.get_text_config()
    mtype = getattr(cfg, "model_type", None)
    if mtype not in FUSABLE:
        return f"model type {mtype!r} is not one of {', '.join(FUSABLE)}"
    inner = decoder_of(model)
    if inner is None or not all(hasattr(inner, a) for a in ("layers", "embed_tokens", "norm", "rotary_emb")) \
            or not hasattr(model, "lm_head"):
        return "the model does not have the usual decoder layout"
    rope_types = getattr(inner.rotary_emb, "rope_type", "default")
    rope_types = set(rope_types.values() if isinstance(rope_types, dict) else [rope_types])
    if "dynamic" in rope_types or ("longrope" in rope_types and long_rope_from(cfg) is None):
        return "its RoPE rescales with the length at run time"
    other = sorted(set(layer_kinds(cfg)) - {"full_attention", "sliding_attention"})
    if other:
        return f"it has attention layers of kind {', '.join(other)}"
    if getattr(cfg, "use_bidirectional_attention", False):
        return "its attention is bidirectional"
    import torch.nn as nn
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        mods = [base_layer(getattr(getattr(layer, GROUPS[g][0], None), n, None)) for g in GROUPS
                for n in group_names(layer, g)]
        if any(type(m) is not nn.Linear for m in mods):  # exact type: quantized layers compute otherwise
            return "its projections are not plain Linear layers"
        if activation(mlp) is None:
            act = getattr(mlp, "act_fn", getattr(mlp, "activation_fn", None))
            return f"its MLP activation ({type(act).__name__}) is neither SiLU nor GELU (tanh)"
        names = tuple(n for n in NORM_NAMES if hasattr(layer, n))
        if names not in (PRE_NORMS, POST_NORMS, BOTH_NORMS):
            return f"its layer norms ({', '.join(names)}) are neither Llama's, OLMo 2's nor Gemma 2's"
        for norm in (getattr(layer, n) for n in names):
            if _norm_eps(norm) is None:
                return f"its layer norm ({type(norm).__name__}) is not an RMS norm with a weight"
    return None


def layer_kinds(cfg) -> list[str]:
    """Each decoder layer's attention as the model's forward applies it: transformers' own
    ``layer_types`` where the config has them, else every layer sliding where the config sets a
    ``sliding_window`` (the Mistral and Phi-3 families mask every layer to it); a window at least as
    long as the model's context is full attention."""
    window = getattr(cfg, "sliding_window", None)
    context = getattr(cfg, "max_position_embeddings", None)
    unbounded = not window or (context is not None and window >= context)
    types = getattr(cfg, "layer_types", None)
    if not types:
        types = ["full_attention" if unbounded else "sliding_attention"] * int(getattr(cfg, "num_hidden_layers", 1) or 1)
    return ["full_attention" if t == "sliding_attention" and unbounded else t for t in types]


def _norm_eps(norm) -> float | None:
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if w is None or eps is None or w.dim() != 1 or "RMSNorm" not in type(norm).__name__:
        return None
    return float(eps)


def qk_norm_why(model, hd: int) -> str | None:
    """Why the per-head q/k norms are not the plain RMS norm the Triton kernel applies (None: they
    are). Norms over all heads at once (OLMo 2's) are applied by the steps before the kernel."""
    nh, nkv, _ = attention_dims(model.config)
    for layer in decoder_of(model).layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
            return "it normalises only one of q and k"
        if not hasattr(attn, "q_norm"):
            continue
        widths = {(hd, hd), (nh * hd, nkv * hd)}
        if any(_norm_eps(n) is None for n in (attn.q_norm, attn.k_norm)) \
                or (attn.q_norm.weight.shape[0], attn.k_norm.weight.shape[0]) not in widths:
            return f"its q/k norm ({type(attn.q_norm).__name__}) is not an RMS norm per head or over all heads"
        if _norm_eps(attn.q_norm) != _norm_eps(attn.k_norm):
            return "its q and k norms use different epsilons"
    return None


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
            self.norm_eps = _norm_eps(inner.norm)
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
            in_eps=_norm_eps(layer.input_layernorm) if pre else 0.0,
            qkv=qkv, qkv_bias=qkv_bias,
            q_norm=self._norm(lambda: attn.q_norm.weight) if has_qk else None,
            k_norm=self._norm(lambda: attn.k_norm.weight) if has_qk else None,
            qk_eps=_norm_eps(attn.q_norm) if has_qk else 0.0,
            o=o,
            o_bias=self._own(lin(attn, "o_proj", "bias")) if lin(attn, "o_proj", "bias")() is not None else None,
            post_norm=self._norm(lambda: layer.post_attention_layernorm.weight),
            post_eps=_norm_eps(layer.post_attention_layernorm),
            gate_up=gate_up, gate_up_bias=gate_up_bias,
            down=down,
            down_bias=self._own(lin(mlp, "down_proj", "bias")) if lin(mlp, "down_proj", "bias")() is not None else None,
            scaling=float(getattr(attn, "scaling", self.hd ** -0.5)), rope=bool(getattr(attn, "use_rope", True)),
            ff_norm=self._norm(lambda: layer.post_feedforward_layernorm.weight) if post else None,
            ff_eps=_norm_eps(layer.post_feedforward_layernorm) if post else 0.0,
            mlp_norm=self._norm(lambda: layer.pre_feedforward_layernorm.weight) if both else None,
            mlp_eps=_norm_eps(layer.pre_feedforward_layernorm) if both else 0.0,
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
