"""nvkit's own decode and prefill steps for the Llama family (Llama, Mistral, Qwen2, Qwen3: ``FUSABLE``).

The steps read every weight from ``FusedWeights``, never through the model's modules: the q/k/v
and gate/up projections become one product each (the modules' weights are re-pointed at slices of
one fused tensor, so no memory is added and the model computes exactly as before), and a module
wrapped later (a LoRA layer) or swapped (another RMSNorm implementation) changes nothing the
captured graphs read. ``FusedWeights.sync`` copies weights the model replaced (an adapter merged,
new weights loaded) into the tensors the graphs read, so no capture is repeated for that.

Attention over the cache is a grouped-query product with no ``repeat_kv`` copy, masked by the
position, or nvkit's Triton decode attention (``nvkit.generate.decode_attention``), which reads the
position from the device and nothing past it; either way one graph serves every length that fits
the cache. At batch 1 every kernel is tiny, so the number of kernels per token is what costs, and
this step has fewer than the model's own forward.

LoRA adapters (``lora.LoraSlots``) add their low-rank products inside the same steps, from device
buffers the host refills when the adapters change. With spare rows (``FusedWeights(spare=...)``,
``FastOptions.lora_fold``) the batch-1 step can fold an adapter's first product into the base one:
the A matrices sit below the weights they adapt, and one reduction gives both (``linear``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...memory.estimate import attention_dims

# Architectures whose decoder layer is exactly: RMSNorm, q/k/v (optional q/k RMSNorm), RoPE,
# attention, o, residual, RMSNorm, SiLU-gated MLP, residual (checked module by module in fusable_why).
FUSABLE = ("llama", "mistral", "qwen2", "qwen3")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def base_layer(module):
    """The plain layer under a PEFT LoRA wrapper (the module itself when it is not wrapped)."""
    return getattr(module, "base_layer", module)


def fusable_why(model) -> str | None:
    """Why the fused steps do not fit ``model`` (None when they do). ``model`` is the causal LM
    itself, not a PEFT wrapper (``lora.lora_why`` judges the adapters)."""
    cfg = model.config.get_text_config()
    mtype = getattr(cfg, "model_type", None)
    if mtype not in FUSABLE:
        return f"model type {mtype!r} is not one of {', '.join(FUSABLE)}"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("layers", "embed_tokens", "norm", "rotary_emb")) \
            or not hasattr(model, "lm_head"):
        return "the model does not have the usual decoder layout"
    if getattr(inner.rotary_emb, "rope_type", "default") in ("dynamic", "longrope"):
        return "its RoPE rescales with the length at run time"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"its MLP activation is {cfg.hidden_act!r}"
    import torch.nn as nn
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        mods = [base_layer(getattr(attn, n, None)) for n in PROJECTIONS[:4]]
        mods += [base_layer(getattr(mlp, n, None)) for n in PROJECTIONS[4:]]
        if any(type(m) is not nn.Linear for m in mods):  # exact type: quantized layers compute otherwise
            return "its projections are not plain Linear layers"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if _norm_eps(norm) is None:
                return f"its layer norm ({type(norm).__name__}) is not an RMS norm with a weight"
    return None


def _norm_eps(norm) -> float | None:
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if w is None or eps is None or w.dim() != 1 or "RMSNorm" not in type(norm).__name__:
        return None
    return float(eps)


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
            if _norm_eps(norm) is None or tuple(w.shape) != (hd,):
                return f"its q/k norm ({type(norm).__name__}) is not a per-head RMS norm"
        if _norm_eps(attn.q_norm) != _norm_eps(attn.k_norm):
            return "its q and k norms use different epsilons"
    return None


# --- the weights the steps read ----------------------------------------------------------------

@dataclass
class _Slot:
    """One weight the steps read: how to find the model's current tensor, and the tensor (or the
    slice of a fused tensor) the captured graphs read."""
    find: Callable[[], Any]   # -> the model's nn.Parameter now
    held: Any


@dataclass
class LayerWeights:
    in_norm: Any
    in_eps: float
    qkv: Any          # (q + 2 kv rows, hidden): q, k and v stacked
    qkv_bias: Any
    q_norm: Any       # per-head RMS norm weights (Qwen3), else None
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
        inner = model.model
        self.nh, self.nkv, self.hd = attention_dims(model.config)
        self.dtype = model.dtype
        self._slots: list[_Slot] = []
        # Fusing can happen inside generation, under inference_mode; tensors made there could never
        # be used for training again ("Inference tensors cannot be saved for backward"). The fused
        # tensors must be ordinary ones.
        with torch.inference_mode(False), torch.no_grad():
            self.embed = self._own(lambda: inner.embed_tokens.weight)
            self.norm = self._own(lambda: inner.norm.weight)
            self.norm_eps = _norm_eps(inner.norm)
            self.lm_head = self._own(lambda: model.lm_head.weight)
            self.layers = [self._layer(layer) for layer in inner.layers]

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

    def _layer(self, layer) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp

        def lin(parent, name, what="weight"):
            return lambda: getattr(base_layer(getattr(parent, name)), what)

        qkv, qkv_spare = self._fused([lin(attn, n) for n in ("q_proj", "k_proj", "v_proj")])
        qkv_bias = self._bias_group(attn, ("q_proj", "k_proj", "v_proj"), lin)
        gate_up, gate_up_spare = self._fused([lin(mlp, n) for n in ("gate_proj", "up_proj")])
        gate_up_bias = self._bias_group(mlp, ("gate_proj", "up_proj"), lin)
        has_qk = hasattr(attn, "q_norm")
        spare = None
        if self.spare:
            (o, o_spare), (down, down_spare) = self._fused([lin(attn, "o_proj")]), self._fused([lin(mlp, "down_proj")])
            spare = (qkv_spare, o_spare, gate_up_spare, down_spare)
        else:
            o, down = self._own(lin(attn, "o_proj")), self._own(lin(mlp, "down_proj"))
        return LayerWeights(
            in_norm=self._own(lambda: layer.input_layernorm.weight), in_eps=_norm_eps(layer.input_layernorm),
            qkv=qkv, qkv_bias=qkv_bias,
            q_norm=self._own(lambda: attn.q_norm.weight) if has_qk else None,
            k_norm=self._own(lambda: attn.k_norm.weight) if has_qk else None,
            qk_eps=_norm_eps(attn.q_norm) if has_qk else 0.0,
            o=o,
            o_bias=self._own(lin(attn, "o_proj", "bias")) if lin(attn, "o_proj", "bias")() is not None else None,
            post_norm=self._own(lambda: layer.post_attention_layernorm.weight),
            post_eps=_norm_eps(layer.post_attention_layernorm),
            gate_up=gate_up, gate_up_bias=gate_up_bias,
            down=down,
            down_bias=self._own(lin(mlp, "down_proj", "bias")) if lin(mlp, "down_proj", "bias")() is not None else None,
            scaling=float(getattr(attn, "scaling", self.hd ** -0.5)), spare=spare)

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
                if p.data_ptr() == slot.held.data_ptr() and p.shape == slot.held.shape:
                    continue
                if p.shape != slot.held.shape or p.dtype != slot.held.dtype or p.device != slot.held.device:
                    raise ValueError(f"a weight changed shape, dtype or device ({tuple(slot.held.shape)} "
                                     f"{slot.held.dtype} -> {tuple(p.shape)} {p.dtype})")
                slot.held.copy_(p.data)
                p.data = slot.held
                changed += 1
        return changed

    def rotary(self, length: int):
        """(cos, sin) tables of positions 0..length-1, (length, head_dim) in the model's dtype,
        computed by the model's own rotary module (a lookup per step instead of its kernels)."""
        import torch
        inner = self.model.model
        dev = self.embed.device
        probe = torch.zeros(1, 1, dtype=self.dtype, device=dev)
        cos, sin = inner.rotary_emb(probe, torch.arange(length, device=dev).view(1, length))
        return cos.view(length, -1).contiguous(), sin.view(length, -1).contiguous()


# --- the steps ---------------------------------------------------------------------------------

def rms_norm(x, weight, eps: float):
    """The Llama-family RMSNorm, in the same operations (so the same rounding) as transformers'."""
    import torch
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rope(x, cos, sin):
    import torch
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def linear(x, weight, bias, lora=None):
    """``x @ weight.T + bias``, plus the LoRA products ``(x A.T) B.T`` when ``lora`` = (A, B) is
    given (scaling folded into B), summed in the adapter's dtype as PEFT does.

    ``lora`` = (A, B, stacked) folds the first product into the base one, for one token: stacked
    holds the weight's rows, then A split into a high and a low half in the weight's dtype (their
    sum is A to about 16 bits, the products are exact in float32), so one float32 reduction over
    the input gives the output and x A.T at once, where the unfolded form launches a kernel more."""
    import torch.nn.functional as F
    if lora is not None and len(lora) == 3:
        return _folded(x, weight, bias, *lora)
    y = F.linear(x, weight, bias)
    if lora is None:
        return y
    a, b = lora
    return (y + F.linear(F.linear(x.to(a.dtype), a), b)).to(y.dtype)


def _folded(x, weight, bias, a, b, stacked):
    import torch
    n, r = weight.shape[0], a.shape[0]
    # written as products and a sum (what inductor makes of a one-row matrix product), in float32,
    # so the rows of A keep their precision instead of rounding to the weight's dtype
    full = (x.to(torch.float32).unsqueeze(-2) * stacked.to(torch.float32)).sum(-1)   # (1, n + 2r)
    y = full[..., :n] if bias is None else full[..., :n] + bias.to(torch.float32)
    y = y.to(x.dtype)
    t = (full[..., n:n + r] + full[..., n + r:n + 2 * r]).to(a.dtype)               # x A.T
    lo = (t.to(torch.float32).unsqueeze(-2) * b.to(torch.float32)).sum(-1).to(a.dtype)
    return (y + lo).to(y.dtype)


def layer_args(w: LayerWeights, lo, fold: bool = False) -> tuple:
    """The weights of layer ``w`` and its adapter buffers ``lo`` (a ``lora.LayerLora``, or None)
    in the order the per-layer functions (``decode_layer``, ``fused_rows.prefill_rows_layer``)
    take them: tensors only, so one compile of such a function serves every layer. ``fold``:
    the adapters folded into the base products where ``lo`` has them so (one token only)."""
    if fold and lo is not None and lo.folded is not None:
        loras = tuple(pair + (stacked,) for pair, stacked in zip((lo.qkv, lo.o, lo.gate_up, lo.down), lo.folded))
    else:
        loras = (lo and lo.qkv, lo and lo.o, lo and lo.gate_up, lo and lo.down)
    return (w.in_norm, w.in_eps, w.qkv, w.qkv_bias, w.q_norm, w.k_norm, w.qk_eps, w.o, w.o_bias, w.post_norm,
            w.post_eps, w.gate_up, w.gate_up_bias, w.down, w.down_bias, w.scaling, *loras)


def decode_layer(nh: int, nkv: int, hd: int, dtype, attention: str, kernels: bool = False) -> Callable:
    """One layer of the decode step for one token, on tensors only: ``layer(h, delta, pos, where,
    cos, sin, mask, keys, values, *layer_args(w, lo))`` -> (h, delta). The layer's input is
    ``h + delta`` (the residual and the previous layer's MLP output, added here so that the sum
    and this layer's norm stay one kernel when the layer is compiled on its own); its output is
    the residual after attention and its MLP's output, added by the next layer or ``decode_head``.

    ``kernels``: the sums with their norms and the activation in nvkit's Triton kernels
    (``step_kernels``; CUDA only), for a step that is not compiled."""
    import torch
    import torch.nn.functional as F
    groups = nh // nkv
    proj = linear
    if kernels:
        from .step_kernels import add_rms_norm, silu_mul
        from .step_kernels import linear as proj
    if attention == "triton":
        from ..decode_attention import decode_attention
    if attention == "triton-fused":
        from ..decode_attention import decode_attention_rope

    def layer(h, delta, pos, where, cos, sin, mask, keys, values, in_norm, in_eps, qkv_w, qkv_bias, q_norm, k_norm,
              qk_eps, o_w, o_bias, post_norm, post_eps, gate_up_w, gate_up_bias, down_w, down_bias, scaling,
              lo_qkv, lo_o, lo_gate_up, lo_down):
        if kernels:
            h, x = add_rms_norm(h, delta, in_norm, in_eps)
        else:
            h = h + delta
            x = rms_norm(h, in_norm, in_eps)
        qkv = proj(x, qkv_w, qkv_bias, lo_qkv).view(nh + 2 * nkv, hd)  # keys, values: (nkv, length, hd)
        if attention == "triton-fused":
            o = decode_attention_rope(qkv, q_norm, k_norm, cos.view(hd), sin.view(hd), keys, values, pos,
                                      scaling, qk_eps)
        else:
            q, k, v = qkv.split((nh, nkv, nkv))
            if q_norm is not None:
                q, k = rms_norm(q, q_norm, qk_eps), rms_norm(k, k_norm, qk_eps)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            keys.index_copy_(1, where, k.view(nkv, 1, hd))
            values.index_copy_(1, where, v.view(nkv, 1, hd))
            if attention == "triton":
                o = decode_attention(q, keys, values, pos, scaling)
            else:
                scores = torch.matmul(q.view(nkv, groups, hd), keys.transpose(1, 2)).float() * scaling + mask
                o = torch.matmul(scores.softmax(-1).to(dtype), values)
        if kernels:
            h, x = add_rms_norm(h, proj(o.reshape(1, nh * hd), o_w, o_bias, lo_o), post_norm, post_eps)
            return h, proj(silu_mul(proj(x, gate_up_w, gate_up_bias, lo_gate_up)), down_w, down_bias, lo_down)
        h = h + proj(o.reshape(1, nh * hd), o_w, o_bias, lo_o)
        x = rms_norm(h, post_norm, post_eps)
        gate, up = proj(x, gate_up_w, gate_up_bias, lo_gate_up).chunk(2, dim=-1)
        return h, proj(F.silu(gate) * up, down_w, down_bias, lo_down)

    return layer


def decode_head(fw: FusedWeights, kernels: bool = False) -> Callable:
    """``head(h, delta)`` -> (1, vocab) float logits: the last layer's sum, the final norm, the LM
    head (``kernels``: the sum and norm in nvkit's Triton kernel, as ``decode_layer``)."""
    import torch.nn.functional as F
    if kernels:
        from .step_kernels import add_rms_norm

        def head(h, delta):
            return F.linear(add_rms_norm(h, delta, fw.norm, fw.norm_eps)[1], fw.lm_head).float()
        return head

    def head(h, delta):
        return F.linear(rms_norm(h + delta, fw.norm, fw.norm_eps), fw.lm_head).float()

    return head


def decode_step(fw: FusedWeights, cache, attention: str = "matmul", lora=None, layer: Callable | None = None,
                head: Callable | None = None, kernels: bool = False) -> Callable:
    """One decode step for one token: reads ``cache.tok`` at position ``cache.pos``, writes its key
    and value into the cache, advances ``cache.pos`` and returns (1, vocab) float logits.

    ``attention``: "matmul" (two batched products, masked by the position), "triton" (nvkit's
    split-cache decode kernel: two small kernels per layer, nothing read past the position) or
    "triton-fused" (the same kernels also apply the q/k norms and RoPE and write the new key and
    value into the cache, which the other kinds do in kernels of their own). ``lora``: a
    ``lora.LoraSlots`` whose products are added to every projection. ``layer`` and ``head``: the
    functions of ``decode_layer`` and ``decode_head`` to run (default: those, eager), e.g.
    compiled on their own. ``kernels``: the default layer and head with nvkit's Triton kernels,
    and the adapters' products apart (their folded form is written for inductor to fuse)."""
    import torch
    import torch.nn.functional as F
    neg = torch.finfo(torch.float32).min
    layer = layer or decode_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, attention, kernels)
    head = head or decode_head(fw, kernels)
    fold = not kernels
    matmul = attention not in ("triton", "triton-fused")

    def step(tok):
        pos = cache.pos
        where = pos.view(1)
        h = F.embedding(tok.view(1), fw.embed)                        # (1, hidden)
        cos, sin = cache.cos.index_select(0, where), cache.sin.index_select(0, where)  # (1, hd)
        mask = torch.where(cache.arange <= pos, 0.0, neg) if matmul else None  # (length,) float32
        delta = torch.zeros_like(h)
        for i, w in enumerate(fw.layers):
            lo = lora.layers[i] if lora is not None else None
            h, delta = layer(h, delta, pos, where, cos, sin, mask, cache.keys[i], cache.values[i],
                             *layer_args(w, lo, fold=fold))
        cache.pos.add_(1)
        return head(h, delta)

    return step


def prefill_step(fw: FusedWeights, cache, lora=None) -> Callable:
    """The prompt's forward from position 0: ``prefill(ids)`` takes the prompt's ids ((L,), padded
    at the end or not), writes keys and values of positions 0..L-1 into the cache and returns the
    (1, vocab) float logits of position ``cache.last`` (the prompt's last token).

    Padding the prompt to a few length classes lets one CUDA graph per class serve every prompt;
    the padded positions come after the prompt, so causal attention keeps them out of the prompt's
    own results, and the decode steps overwrite their cache entries before reading them."""
    import torch
    import torch.nn.functional as F
    nh, nkv, hd = fw.nh, fw.nkv, fw.hd
    groups = nh // nkv

    def prefill(ids):
        length = ids.shape[0]
        h = F.embedding(ids, fw.embed)                                 # (L, hidden)
        cos, sin = cache.cos[:length].unsqueeze(1), cache.sin[:length].unsqueeze(1)  # (L, 1, hd)
        for i, w in enumerate(fw.layers):
            lo = lora.layers[i] if lora is not None else None
            x = rms_norm(h, w.in_norm, w.in_eps)
            qkv = linear(x, w.qkv, w.qkv_bias, lo and lo.qkv).view(length, nh + 2 * nkv, hd)
            q, k, v = qkv.split((nh, nkv, nkv), dim=1)
            if w.q_norm is not None:
                q, k = rms_norm(q, w.q_norm, w.qk_eps), rms_norm(k, w.k_norm, w.qk_eps)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k, v = k.transpose(0, 1), v.transpose(0, 1)                # (nkv, L, hd)
            cache.keys[i][:, :length].copy_(k)
            cache.values[i][:, :length].copy_(v)
            # each KV head repeated for its query heads, as transformers' repeat_kv does
            k = k[:, None].expand(nkv, groups, length, hd).reshape(nh, length, hd)
            v = v[:, None].expand(nkv, groups, length, hd).reshape(nh, length, hd)
            o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                               is_causal=True, scale=w.scaling)  # (1, nh, L, hd)
            h = h + linear(o[0].transpose(0, 1).reshape(length, nh * hd), w.o, w.o_bias, lo and lo.o)
            x = rms_norm(h, w.post_norm, w.post_eps)
            gate, up = linear(x, w.gate_up, w.gate_up_bias, lo and lo.gate_up).chunk(2, dim=-1)
            h = h + linear(F.silu(gate) * up, w.down, w.down_bias, lo and lo.down)
        last = h.index_select(0, cache.last.view(1))                  # (1, hidden)
        return F.linear(rms_norm(last, fw.norm, fw.norm_eps), fw.lm_head).float()

    return prefill
