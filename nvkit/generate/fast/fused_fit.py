"""Whether a model fits nvkit's fused steps, and the facts of its layout they read: the families
(``FUSABLE``) and how their layers differ from Llama's, the projection groups (``GROUPS``), the
decoder inside the causal LM (``decoder_of``), each layer's attention kind (``layer_kinds``), and
why a model does not fit (``fusable_why``, ``qk_norm_why``; the batch-invariant step fits what
the fused step fits, since every norm of its layouts runs in nvkit's row kernels). The weights
themselves, as the steps read them: ``fused_weights.FusedWeights``."""

from __future__ import annotations

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


def act_module(mlp):
    """The MLP's activation module (Phi-3 names it ``activation_fn``, the others ``act_fn``)."""
    return getattr(mlp, "act_fn", getattr(mlp, "activation_fn", None))


def activation(mlp) -> str | None:
    """The MLP's gate activation as the steps name it (``ACTIVATIONS``), or None for another one:
    SiLU, or GELU in its tanh form as torch computes it (transformers' ``gelu_pytorch_tanh``; its
    Python formula rounds otherwise)."""
    import functools

    import torch.nn as nn
    from transformers.activations import GELUTanh, SiLUActivation
    act = act_module(mlp)
    if isinstance(act, (SiLUActivation, nn.SiLU)):
        return "silu"
    if isinstance(act, GELUTanh) and isinstance(getattr(act, "act", None), functools.partial):
        return "gelu_tanh"
    return None


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
        mlp = getattr(layer, "mlp", None)
        mods = [base_layer(getattr(getattr(layer, GROUPS[g][0], None), n, None)) for g in GROUPS
                for n in group_names(layer, g)]
        if any(type(m) is not nn.Linear for m in mods):  # exact type: quantized layers compute otherwise
            return "its projections are not plain Linear layers"
        if activation(mlp) is None:
            return f"its MLP activation ({type(act_module(mlp)).__name__}) is neither SiLU nor GELU (tanh)"
        names = tuple(n for n in NORM_NAMES if hasattr(layer, n))
        if names not in (PRE_NORMS, POST_NORMS, BOTH_NORMS):
            return f"its layer norms ({', '.join(names)}) are neither Llama's, OLMo 2's nor Gemma 2's"
        for norm in (getattr(layer, n) for n in names):
            if norm_eps(norm) is None:
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


def norm_eps(norm) -> float | None:
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
        if any(norm_eps(n) is None for n in (attn.q_norm, attn.k_norm)) \
                or (attn.q_norm.weight.shape[0], attn.k_norm.weight.shape[0]) not in widths:
            return f"its q/k norm ({type(attn.q_norm).__name__}) is not an RMS norm per head or over all heads"
        if norm_eps(attn.q_norm) != norm_eps(attn.k_norm):
            return "its q and k norms use different epsilons"
    return None
