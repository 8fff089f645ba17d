"""nvkit's own decode and prefill steps for the Llama family (Llama, Mistral, Qwen2, Qwen3, and the
layers that differ from Llama's by a little: SmolLM3's NoPE layers, Granite's constant multipliers,
OLMo 2's norms after each branch, the Gemma family's norms, GELU, sliding windows and soft-caps:
``FUSABLE``).

The steps read every weight from ``fused_weights.FusedWeights``, never through the model's modules,
so a module wrapped later (a LoRA layer) or swapped changes nothing the captured graphs read.

Attention over the cache is a grouped-query product with no ``repeat_kv`` copy, masked by the
position, or nvkit's Triton decode attention (``nvkit.generate.kernels.decode_attention``), which reads the
position from the device and nothing past it; either way one graph serves every length that fits
the cache. At batch 1 every kernel is tiny, so the number of kernels per token is what costs, and
this step has fewer than the model's own forward.

LoRA adapters (``lora.LoraSlots``) add their low-rank products inside the same steps, from device
buffers the host refills when the adapters change. With spare rows (``FusedWeights(spare=...)``,
``FastOptions.lora_fold``) the batch-1 step can fold an adapter's first product into the base one:
the A matrices sit below the weights they adapt, and one reduction gives both (``linear``).
"""

from __future__ import annotations

from typing import Callable

from .fused_weights import FusedWeights, LayerWeights

# --- the steps ---------------------------------------------------------------------------------

def rms_norm(x, weight, eps: float, weight_first: bool = False):
    """The Llama-family RMSNorm, in the same operations (so the same rounding) as transformers';
    ``weight_first``: OLMo 2's, which multiplies by the weight in float32 and rounds after."""
    import torch
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h).to(dtype) if weight_first else weight * h.to(dtype)


def full_qk_norm(qkv, q_norm, k_norm, eps: float, hd: int, weight_first: bool, kernels: bool = False):
    """(qkv, q_norm, k_norm) for the per-head part of a step: where the q/k norms span all heads at
    once (OLMo 2), q and k of the stacked projection ``qkv`` (..., (q + k + v) width) normed here,
    before the heads split, and no per-head norms left; else everything as it is. ``kernels``: each
    norm in nvkit's Triton kernel (``layer_ends``)."""
    if q_norm is None or q_norm.shape[0] == hd:
        return qkv, q_norm, k_norm
    import torch
    if kernels:
        from ..kernels.add_rms_norm import rms_norm as norm
    else:
        norm = rms_norm
    nq, nk = q_norm.shape[0], k_norm.shape[0]
    q, k, v = qkv.split((nq, nk, qkv.shape[-1] - nq - nk), dim=-1)
    qkv = torch.cat((norm(q, q_norm, eps, weight_first), norm(k, k_norm, eps, weight_first), v), dim=-1)
    return qkv, None, None


def rope(x, cos, sin):
    """``x`` rotated by the tables, in ``x``'s dtype: tables in a wider dtype (OLMo 2's rotary
    module returns float32 ones) compute in it and round once at the end, as that model does.
    Tables narrower than the head (Phi-3's partial rotary) rotate its first dims only, the rest
    passing as they are, as transformers' Phi-3 does."""
    import torch
    rot = cos.shape[-1]
    if rot != x.shape[-1]:
        return torch.cat((rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    half = rot // 2
    return (x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin).to(x.dtype)


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


def projection(kernels: bool = False, invariant: bool = False) -> Callable:
    """The ``linear`` a step's projections run: torch's (``linear``), with the adapters' products in
    nvkit's kernels (``kernels``: ``kernels.lora_add.linear``), or with the product itself computed
    for each row as alone too (``invariant``: ``kernels.invariant_linear.linear``)."""
    if not kernels:
        return linear
    if invariant:
        from ..kernels.invariant_linear import linear as invariant_linear
        return invariant_linear
    from ..kernels.lora_add import linear as kernel_linear
    return kernel_linear


def embed(fw: FusedWeights, ids):
    """The embeddings of ``ids``, times the family's embedding multiplier where it has one."""
    import torch.nn.functional as F
    h = F.embedding(ids, fw.embed)
    return h if fw.embed_scale is None else h * fw.embed_scale


def lm_logits(fw: FusedWeights, x, invariant: bool = False):
    """Float logits of the normed hidden states ``x``, divided by the family's logits divisor or
    soft-capped (Gemma 2) where it has one (in the model's dtype, before the float copy, as its
    forward does). ``invariant``: the product in ``kernels.invariant_linear`` (each row as alone)."""
    if invariant:
        from ..kernels.invariant_linear import invariant_linear
        y = invariant_linear(x, fw.lm_head)
    else:
        import torch.nn.functional as F
        y = F.linear(x, fw.lm_head)
    if fw.logits_softcap is not None:
        import torch
        y = torch.tanh(y / fw.logits_softcap) * fw.logits_softcap
    return (y if fw.logits_scale is None else y / fw.logits_scale).float()


def rotary_kinds(fw: FusedWeights, cos, sin) -> list:
    """The rotary tables ``FusedWeights.rotary`` made, one (cos, sin) pair of (positions, ...) views
    per rotary kind (one for every model but Gemma 3, whose sliding layers have a table of their own)."""
    kinds = len(fw.rope_kinds)
    if kinds == 1:
        return [(cos, sin)]
    return list(zip(cos.view(kinds, -1, *cos.shape[1:]).unbind(0), sin.view(kinds, -1, *sin.shape[1:]).unbind(0)))


def rotaries(fw: FusedWeights, tables: list) -> list:
    """Each layer's rotary tables: its kind's pair of ``tables`` (``rotary_kinds``, or those pairs
    at the step's positions), or for a layer without RoPE tables of ones and zeros of their shape
    (``rope`` then leaves q and k exactly as they are), so every layer runs the same code and one
    compile of a layer still serves all of them."""
    if not fw.nope:
        return [tables[w.rope_table] for w in fw.layers]
    import torch
    cos, sin = tables[0]
    ident = (torch.ones_like(cos), torch.zeros_like(sin))
    return [tables[w.rope_table] if w.rope else ident for w in fw.layers]


def window_masks(fw: FusedWeights, arange, pos, neg: float) -> dict:
    """Additive float32 masks over the cache positions ``arange`` for queries at ``pos`` (a 0-dim
    tensor, or (rows, 1) for rows), one per window among the layers (0: every position up to the
    query's; a window w: the positions p - w < j <= p, as transformers' sliding layers see)."""
    import torch
    seen = arange <= pos
    return {w: torch.where(seen if not w else seen & (arange > pos - w), 0.0, neg)
            for w in sorted({lw.window for lw in fw.layers})}


def attend_scores(scores, scaling: float, softcap: float | None):
    """Attention scores as float32 (the products times ``scaling``), soft-capped where the family
    caps them (Gemma 2: cap · tanh(s / cap), before the mask)."""
    import torch
    scores = scores.float() * scaling
    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def prefill_attention(q, k, v, scaling: float, window: int = 0, softcap: float | None = None):
    """Causal attention of a prompt (q (..., heads, L, hd), k and v repeated to its heads), kept to
    the layer's ``window`` and soft-capped where the family does so: torch's fused attention, which
    takes a window as a mask; the scores written out where they are capped (no fused kernel caps)."""
    import torch
    import torch.nn.functional as F
    length = q.shape[-2]
    if not window and softcap is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)
    at = torch.arange(length, device=q.device)
    keep = at[None, :] <= at[:, None]
    if window:
        keep = keep & (at[None, :] > at[:, None] - window)
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scaling)
    scores = attend_scores(torch.matmul(q, k.transpose(-1, -2)), scaling, softcap)
    scores = scores.masked_fill(~keep, torch.finfo(torch.float32).min)
    return torch.matmul(scores.softmax(-1).to(q.dtype), v)


def branch_scale(residual: float | None) -> Callable:
    """What a residual branch's output goes through before its sum: times ``residual`` (Granite's
    multiplier), or unchanged."""
    if residual is None:
        return lambda t: t
    return lambda t: t * residual


def layer_ends(kernels: bool = False, residual: float | None = None, weight_first: bool = False,
               invariant: bool = False, act: str = "silu", products: bool | None = None):
    """(enter, leave): what every step's layer does around its attention, in the family's layout.
    ``enter(h, delta, in_norm, in_eps)`` -> (h, x): the layer's input ``h + delta`` and what its
    q/k/v product reads (normed, or as it is where the layer has no ``in_norm``: OLMo 2).
    ``leave(h, a, post_norm, post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps, gate_up_w, gate_up_bias,
    down_w, down_bias, lo_gate_up, lo_down)`` -> (h, delta) from the o-projection's output ``a``:
    Llama's layout adds ``a`` and norms the sum for the MLP; OLMo 2's (``ff_norm`` given) norms ``a``
    and the MLP's output before their sums; Gemma 2's (``ff_norm`` and ``mlp_norm``) norms the MLP's
    input too. ``residual``: both branches' multiplier (Granite); ``weight_first``: the norms'
    rounding (``rms_norm``); ``act``: the MLP's gate activation (``fused_weights.ACTIVATIONS``);
    ``kernels``: the sums with the norms that follow them, the activation and the adapters' products
    in nvkit's Triton kernels (CUDA only, uncompiled steps); ``invariant`` (with ``kernels``): the
    projections too (``kernels.invariant_linear``), so each row is computed as it is alone.
    ``products`` False: the projections (and the adapters' products) in torch's ``linear`` even with
    ``kernels`` (a prompt's many tokens, where cuBLAS's matrix products beat row-by-row kernels)."""
    import torch.nn.functional as F
    proj = projection(kernels if products is None else products, invariant)
    scaled = branch_scale(residual)
    if kernels:
        from ..kernels.add_rms_norm import add_rms_norm, rms_norm as norm_kernel
        from ..kernels.silu_mul import silu_mul

    def gate(g):
        return F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")

    def mlp(x, gate_up_w, gate_up_bias, down_w, down_bias, lo_gate_up, lo_down):
        if kernels:
            return proj(silu_mul(proj(x, gate_up_w, gate_up_bias, lo_gate_up), act), down_w, down_bias, lo_down)
        g, up = proj(x, gate_up_w, gate_up_bias, lo_gate_up).chunk(2, dim=-1)
        return proj(gate(g) * up, down_w, down_bias, lo_down)

    def add_norm(h, delta, weight, eps):
        """(h + delta, its norm)."""
        if kernels:
            return add_rms_norm(h, delta, weight, eps, weight_first)
        h = h + delta
        return h, rms_norm(h, weight, eps, weight_first)

    def enter(h, delta, in_norm, in_eps):
        if in_norm is None:
            h = h + delta
            return h, h
        return add_norm(h, delta, in_norm, in_eps)

    def norm(x, weight, eps):
        return norm_kernel(x, weight, eps, weight_first) if kernels else rms_norm(x, weight, eps, weight_first)

    def leave(h, a, post_norm, post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps, gate_up_w, gate_up_bias, down_w,
              down_bias, lo_gate_up, lo_down):
        a = scaled(a)
        if ff_norm is not None:
            if kernels:  # the branch's norm, the sum and the MLP's input norm in one kernel
                h, x = add_rms_norm(h, a, mlp_norm, mlp_eps, weight_first, delta_norm=post_norm, delta_eps=post_eps)
            else:
                a = rms_norm(a, post_norm, post_eps, weight_first)
                if mlp_norm is None:
                    h = h + a
                    x = h
                else:
                    h, x = add_norm(h, a, mlp_norm, mlp_eps)
            return h, norm(mlp(x, gate_up_w, gate_up_bias, down_w, down_bias, lo_gate_up, lo_down), ff_norm, ff_eps)
        h, x = add_norm(h, a, post_norm, post_eps)
        return h, scaled(mlp(x, gate_up_w, gate_up_bias, down_w, down_bias, lo_gate_up, lo_down))

    return enter, leave


def layer_args(w: LayerWeights, lo, fold: bool = False) -> tuple:
    """The weights of layer ``w`` and its adapter buffers ``lo`` (a ``lora.LayerLora``, or None)
    in the order the per-layer functions (``decode_layer``, ``llama_rows_step.prefill_rows_layer``)
    take them: tensors only, so one compile of such a function serves every layer. ``fold``:
    the adapters folded into the base products where ``lo`` has them so (one token only)."""
    if fold and lo is not None and lo.folded is not None:
        loras = tuple(pair + (stacked,) for pair, stacked in zip((lo.qkv, lo.o, lo.gate_up, lo.down), lo.folded))
    else:
        loras = (lo and lo.qkv, lo and lo.o, lo and lo.gate_up, lo and lo.down)
    return (w.in_norm, w.in_eps, w.qkv, w.qkv_bias, w.q_norm, w.k_norm, w.qk_eps, w.o, w.o_bias, w.post_norm,
            w.post_eps, w.ff_norm, w.ff_eps, w.mlp_norm, w.mlp_eps, w.gate_up, w.gate_up_bias, w.down, w.down_bias,
            w.scaling, w.window, *loras)


def decode_layer(nh: int, nkv: int, hd: int, dtype, attention: str, kernels: bool = False,
                 residual: float | None = None, weight_first: bool = False, act: str = "silu",
                 softcap: float | None = None) -> Callable:
    """One layer of the decode step for one token, on tensors only: ``layer(h, delta, pos, where,
    cos, sin, mask, keys, values, *layer_args(w, lo))`` -> (h, delta). The layer's input is
    ``h + delta`` (the residual and the previous layer's MLP output, added here so that the sum
    and this layer's norm stay one kernel when the layer is compiled on its own); its output is
    the residual after attention and its MLP's output, added by the next layer or ``decode_head``.
    ``mask``: the layer's own (``window_masks``: a sliding layer's keeps it to its window), read
    by "matmul" only; the kernels keep a sliding layer to its window (``LayerWeights.window``) themselves.

    ``kernels``, ``residual``, ``weight_first``, ``act`` and the layouts around the attention:
    ``layer_ends``; ``softcap``: the attention scores' soft-cap (Gemma 2), None for none."""
    import torch
    groups = nh // nkv
    cap = softcap or 0.0  # the kernels' form of "no cap"
    enter, leave = layer_ends(kernels, residual, weight_first, act=act)
    proj = projection(kernels)
    if attention == "triton-split":
        from ..kernels.decode_attention import decode_attention
    if attention == "triton-fused":
        from ..kernels.decode_attention import decode_attention_rope

    def layer(h, delta, pos, where, cos, sin, mask, keys, values, in_norm, in_eps, qkv_w, qkv_bias, q_norm, k_norm,
              qk_eps, o_w, o_bias, post_norm, post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps, gate_up_w, gate_up_bias,
              down_w, down_bias, scaling, window, lo_qkv, lo_o, lo_gate_up, lo_down):
        h, x = enter(h, delta, in_norm, in_eps)
        # norms over all heads (OLMo 2) here, not in the kernel
        qkv, q_norm, k_norm = full_qk_norm(proj(x, qkv_w, qkv_bias, lo_qkv), q_norm, k_norm, qk_eps, hd, weight_first,
                                           kernels)
        qkv = qkv.view(nh + 2 * nkv, hd)  # keys, values: (nkv, length, hd)
        if attention == "triton-fused":
            o = decode_attention_rope(qkv, q_norm, k_norm, cos.view(-1), sin.view(-1), keys, values, pos,
                                      scaling, qk_eps, window, cap)
        else:
            q, k, v = qkv.split((nh, nkv, nkv))
            if q_norm is not None:
                q, k = rms_norm(q, q_norm, qk_eps, weight_first), rms_norm(k, k_norm, qk_eps, weight_first)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            keys.index_copy_(1, where, k.view(nkv, 1, hd))
            values.index_copy_(1, where, v.view(nkv, 1, hd))
            if attention == "triton-split":
                o = decode_attention(q, keys, values, pos, scaling, window, cap)
            else:
                scores = attend_scores(torch.matmul(q.view(nkv, groups, hd), keys.transpose(1, 2)), scaling, softcap)
                o = torch.matmul((scores + mask).softmax(-1).to(dtype), values)
        return leave(h, proj(o.reshape(1, nh * hd), o_w, o_bias, lo_o), post_norm, post_eps, ff_norm, ff_eps,
                     mlp_norm, mlp_eps, gate_up_w, gate_up_bias, down_w, down_bias, lo_gate_up, lo_down)

    return layer


def model_decode_layer(fw: FusedWeights, attention: str, kernels: bool = False) -> Callable:
    """``decode_layer`` for the model whose weights ``fw`` holds."""
    return decode_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, attention, kernels, fw.residual_scale, fw.weight_first,
                        fw.activation, fw.attn_softcap)


def decode_head(fw: FusedWeights, kernels: bool = False, invariant: bool = False) -> Callable:
    """``head(h, delta)`` -> (1, vocab) float logits: the last layer's sum, the final norm, the LM
    head (``kernels``: the sum and norm in nvkit's Triton kernel, as ``decode_layer``; ``invariant``
    with it: the LM head's product in ``kernels.invariant_linear``)."""
    if kernels:
        from ..kernels.add_rms_norm import add_rms_norm

        def head(h, delta):
            return lm_logits(fw, add_rms_norm(h, delta, fw.norm, fw.norm_eps, fw.weight_first)[1], invariant)
        return head

    def head(h, delta):
        return lm_logits(fw, rms_norm(h + delta, fw.norm, fw.norm_eps, fw.weight_first))

    return head


def decode_step(fw: FusedWeights, cache, attention: str = "matmul", lora=None, layer: Callable | None = None,
                head: Callable | None = None, kernels: bool = False) -> Callable:
    """One decode step for one token: reads ``static_cache.tok`` at position ``static_cache.pos``, writes its key
    and value into the cache, advances ``static_cache.pos`` and returns (1, vocab) float logits.

    ``attention``: "matmul" (two batched products, masked by the position), "triton-split" (nvkit's
    split-cache decode kernel: two small kernels per layer, nothing read past the position) or
    "triton-fused" (the same kernels also apply the q/k norms and RoPE and write the new key and
    value into the cache, which the other kinds do in kernels of their own). ``lora``: a
    ``lora.LoraSlots`` whose products are added to every projection. ``layer`` and ``head``: the
    functions of ``decode_layer`` and ``decode_head`` to run (default: those, eager), e.g.
    compiled on their own. ``kernels``: the default layer and head with nvkit's Triton kernels,
    and the adapters' folded products in ``kernels.lora_add.folded_linear`` (one float32 product
    and one kernel; apart where the device gives no float32 products)."""
    import torch
    neg = torch.finfo(torch.float32).min
    layer = layer or model_decode_layer(fw, attention, kernels)
    head = head or decode_head(fw, kernels)
    matmul = attention not in ("triton-split", "triton-fused")

    def step(tok):
        pos = cache.pos
        where = pos.view(1)
        h = embed(fw, tok.view(1))                                     # (1, hidden)
        tables = [(c.index_select(0, where), s.index_select(0, where))  # (1, hd) each
                  for c, s in rotary_kinds(fw, cache.cos, cache.sin)]
        masks = window_masks(fw, cache.arange, pos, neg) if matmul else {}  # (length,) float32 each
        delta = torch.zeros_like(h)
        for i, (w, (c, s)) in enumerate(zip(fw.layers, rotaries(fw, tables))):
            lo = lora.layers[i] if lora is not None else None
            h, delta = layer(h, delta, pos, where, c, s, masks.get(w.window), cache.keys[i], cache.values[i],
                             *layer_args(w, lo, fold=True))
        cache.pos.add_(1)
        return head(h, delta)

    return step


def prefill_step(fw: FusedWeights, cache, lora=None) -> Callable:
    """The prompt's forward from position 0: ``prefill(ids)`` takes the prompt's ids ((L,), padded
    at the end or not), writes keys and values of positions 0..L-1 into the cache and returns the
    (1, vocab) float logits of position ``static_cache.last`` (the prompt's last token).

    Padding the prompt to a few length classes lets one CUDA graph per class serve every prompt;
    the padded positions come after the prompt, so causal attention keeps them out of the prompt's
    own results, and the decode steps overwrite their cache entries before reading them."""
    nh, nkv, hd = fw.nh, fw.nkv, fw.hd
    groups = nh // nkv
    _, leave = layer_ends(False, fw.residual_scale, fw.weight_first, act=fw.activation)

    def prefill(ids):
        length = ids.shape[0]
        h = embed(fw, ids)                                             # (L, hidden)
        tables = rotaries(fw, [(c[:length].unsqueeze(1), s[:length].unsqueeze(1))  # (L, 1, hd) each
                               for c, s in rotary_kinds(fw, cache.cos, cache.sin)])
        for i, (w, (cos, sin)) in enumerate(zip(fw.layers, tables)):
            lo = lora.layers[i] if lora is not None else None
            x = h if w.in_norm is None else rms_norm(h, w.in_norm, w.in_eps, fw.weight_first)
            qkv, q_norm, k_norm = full_qk_norm(linear(x, w.qkv, w.qkv_bias, lo and lo.qkv), w.q_norm, w.k_norm,
                                               w.qk_eps, hd, fw.weight_first)
            q, k, v = qkv.view(length, nh + 2 * nkv, hd).split((nh, nkv, nkv), dim=1)
            if q_norm is not None:
                q, k = rms_norm(q, q_norm, w.qk_eps, fw.weight_first), rms_norm(k, k_norm, w.qk_eps, fw.weight_first)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k, v = k.transpose(0, 1), v.transpose(0, 1)                # (nkv, L, hd)
            cache.keys[i][:, :length].copy_(k)
            cache.values[i][:, :length].copy_(v)
            # each KV head repeated for its query heads, as transformers' repeat_kv does
            k = k[:, None].expand(nkv, groups, length, hd).reshape(nh, length, hd)
            v = v[:, None].expand(nkv, groups, length, hd).reshape(nh, length, hd)
            o = prefill_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), w.scaling,
                                  w.window, fw.attn_softcap)                  # (1, nh, L, hd)
            h, m = leave(h, linear(o[0].transpose(0, 1).reshape(length, nh * hd), w.o, w.o_bias, lo and lo.o),
                         w.post_norm, w.post_eps, w.ff_norm, w.ff_eps, w.mlp_norm, w.mlp_eps, w.gate_up,
                         w.gate_up_bias, w.down, w.down_bias, lo and lo.gate_up, lo and lo.down)
            h = h + m
        last = h.index_select(0, cache.last.view(1))                  # (1, hidden)
        return lm_logits(fw, rms_norm(last, fw.norm, fw.norm_eps, fw.weight_first))

    return prefill
