"""nvkit's own decode step for the Llama family (Llama, Mistral, Qwen2, Qwen3: ``FUSABLE``).

The q/k/v and gate/up projections become one matrix-vector product each: the modules' weights are
re-pointed at slices of one fused tensor (``FusedWeights``), so no memory is added and the model
computes exactly as before. Attention over the cache is a grouped-query product with no
``repeat_kv`` copy, or nvkit's Triton decode attention (``nvkit.generate.decode_attention``). At
batch 1 every kernel is tiny, so the number of kernels per token is what costs, and this step has
fewer than the model's own forward.
"""

from __future__ import annotations

from typing import Any, Callable

from ...memory.estimate import attention_dims

# Architectures whose decoder layer is exactly: RMSNorm, q/k/v (optional q/k RMSNorm), RoPE,
# attention, o, residual, RMSNorm, SiLU-gated MLP, residual (checked module by module in fusable_why).
FUSABLE = ("llama", "mistral", "qwen2", "qwen3")


def fusable_why(model) -> str | None:
    """Why the fused decode step does not fit ``model`` (None when it does)."""
    cfg = model.config.get_text_config()
    mtype = getattr(cfg, "model_type", None)
    if mtype not in FUSABLE:
        return f"model type {mtype!r} is not one of {', '.join(FUSABLE)}"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("layers", "embed_tokens", "norm", "rotary_emb")):
        return "the model does not have the usual decoder layout"
    if getattr(inner.rotary_emb, "rope_type", "default") in ("dynamic", "longrope"):
        return "its RoPE rescales with the length at run time"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"its MLP activation is {cfg.hidden_act!r}"
    import torch.nn as nn
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(m) is not nn.Linear for m in names):  # exact type: LoRA or quantized layers compute otherwise
            return "its projections are not plain Linear layers"
    return None


def qk_norms(attn):
    """(q_norm weight, k_norm weight, eps) of an attention layer; (None, None, 0.0) without norms."""
    if not hasattr(attn, "q_norm"):
        return None, None, 0.0
    return attn.q_norm.weight, attn.k_norm.weight, float(attn.q_norm.variance_epsilon)


def qk_norm_why(model, hd: int) -> str | None:
    """Why the per-head q/k norms are not the plain RMS norm the Triton kernel applies (None: they are)."""
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
            return "it normalises only one of q and k"
        if not hasattr(attn, "q_norm"):
            continue
        for norm in (attn.q_norm, attn.k_norm):
            w = getattr(norm, "weight", None)
            if not type(norm).__name__.endswith("RMSNorm") or w is None or tuple(w.shape) != (hd,) \
                    or not hasattr(norm, "variance_epsilon"):
                return f"its q/k norm ({type(norm).__name__}) is not a per-head RMS norm"
        if attn.q_norm.variance_epsilon != attn.k_norm.variance_epsilon:
            return "its q and k norms use different epsilons"
    return None


def _fuse(mods) -> tuple[Any, Any]:
    """One (weight, bias) for Linear layers that read the same input, stacked by output rows.

    The layers' parameters are re-pointed at slices of the new tensors, so memory stays as it was
    and the layers compute what they did. Called again after the weights were replaced (merging an
    adapter, loading new weights), it fuses the new ones."""
    import torch
    # Fusing happens inside generation, under inference_mode; tensors made there could never be
    # used for training again ("Inference tensors cannot be saved for backward"). The fused
    # tensors must be ordinary ones.
    with torch.inference_mode(False), torch.no_grad():
        ws = [m.weight for m in mods]
        fused_w = torch.cat([w.detach() for w in ws])
        off = 0
        for m, w in zip(mods, ws):
            n = w.shape[0]
            m.weight.data = fused_w[off:off + n]
            off += n
        fused_b = None
        if any(m.bias is not None for m in mods):
            fused_b = torch.cat([m.bias.detach() if m.bias is not None else
                                 torch.zeros(m.weight.shape[0], dtype=fused_w.dtype, device=fused_w.device)
                                 for m in mods])
            off = 0
            for m in mods:
                n = m.weight.shape[0]
                if m.bias is not None:
                    m.bias.data = fused_b[off:off + n]
                off += n
    return fused_w, fused_b


def _still_fused(mods, fused_w) -> bool:
    off = 0
    for m in mods:
        w = m.weight
        if off + w.shape[0] > fused_w.shape[0] or w.data_ptr() != fused_w[off].data_ptr():
            return False
        off += w.shape[0]
    return off == fused_w.shape[0]


class FusedWeights:
    """The fused q/k/v and gate/up projections of every layer (see ``_fuse``)."""

    def __init__(self, model):
        self.groups = []
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.groups.append(((a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)))
        self.fuse()

    def fuse(self):
        self.qkv, self.gate_up = [], []
        for qkv, gu in self.groups:
            self.qkv.append(_fuse(qkv))
            self.gate_up.append(_fuse(gu)[0])

    def valid(self) -> bool:
        """False once a module's weight was replaced (an adapter merged, new weights loaded)."""
        return all(_still_fused(qkv, w) and _still_fused(gu, g)
                   for (qkv, gu), (w, _), g in zip(self.groups, self.qkv, self.gate_up))


def fused_step(model, fused: FusedWeights, cache, attention: str = "matmul") -> Callable:
    """The decode step for one token: the model's forward, with one product for q/k/v and one for
    gate/up and grouped-query attention without copies. Reads and advances ``cache.pos``; writes
    the new key and value into the static cache; returns (1, vocab) float logits.

    ``attention``: "matmul" (two batched products, masked by the position), "triton" (nvkit's
    split-cache decode kernel: two small kernels per layer, nothing read past the position) or
    "triton-fused" (the same kernels also apply the q/k norms and RoPE and write the new key and
    value into the cache, which the other kinds do in kernels of their own)."""
    import torch
    import torch.nn.functional as F
    inner = model.model
    nh, nkv, hd = attention_dims(model.config)
    groups = nh // nkv
    layers = list(inner.layers)
    caches = cache.kv.layers
    dtype = model.dtype
    neg = torch.finfo(torch.float32).min
    if attention == "triton":
        from ..decode_attention import decode_attention
    if attention == "triton-fused":
        from ..decode_attention import decode_attention_rope
        norms = [qk_norms(layer.self_attn) for layer in layers]

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def step(tok):
        pos = cache.pos
        h = inner.embed_tokens(tok)                                    # (1, 1, hidden)
        cos, sin = inner.rotary_emb(h, pos.view(1, 1))                 # (1, 1, hd)
        cos, sin = cos.view(1, hd), sin.view(1, hd)
        mask = torch.where(cache.arange <= pos, 0.0, neg)              # (length,) float32
        where = pos.view(1)
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            w, bias = fused.qkv[i]
            qkv = F.linear(x, w, bias).view(nh + 2 * nkv, hd)
            keys, values = caches[i].keys, caches[i].values            # (1, nkv, length, hd)
            if attention == "triton-fused":
                qw, kw, eps = norms[i]
                o = decode_attention_rope(qkv, qw, kw, cos.view(hd), sin.view(hd), keys[0], values[0], pos,
                                          float(attn.scaling), eps).reshape(1, 1, nh * hd)
            else:
                q, k, v = qkv.split((nh, nkv, nkv))
                if hasattr(attn, "q_norm"):
                    q, k = attn.q_norm(q), attn.k_norm(k)
                q, k = rope(q, cos, sin), rope(k, cos, sin)
                keys.index_copy_(2, where, k.view(1, nkv, 1, hd))
                values.index_copy_(2, where, v.view(1, nkv, 1, hd))
                if attention == "triton":
                    o = decode_attention(q.reshape(nh, hd), keys[0], values[0], pos,
                                         float(attn.scaling)).reshape(1, 1, nh * hd)
                else:
                    scores = torch.matmul(q.view(nkv, groups, hd), keys[0].transpose(1, 2)).float() * attn.scaling + mask
                    probs = scores.softmax(-1).to(dtype)
                    o = torch.matmul(probs, values[0]).reshape(1, 1, nh * hd)
            h = h + attn.o_proj(o)
            x = layer.post_attention_layernorm(h)
            gate, up = F.linear(x, fused.gate_up[i]).chunk(2, dim=-1)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        cache.pos.add_(1)
        return model.lm_head(inner.norm(h))[:, -1, :].float()

    return step
