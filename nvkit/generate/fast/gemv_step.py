"""The uncompiled batch-1 decode step with a layer in six kernels (``StepVariant.gemv``): each
projection in ``kernels.gemv`` with the norm before it, the residual sum after it or the gated
activation fused in, and the attention in ``decode_attention_rope``'s two.

Why: at batch 1 a layer's time is its weights' bytes over the bandwidth plus, per kernel, a launch
and a ramp in which few bytes stream; the uncompiled step with nvkit's norm and activation kernels
runs the Llama layout's layer in nine. The layer's results are the uncompiled step's but for the
order of the products' sums (the same roundings: ``kernels.gemv``), so the session's tokens stay
the same wherever the products' last bits do not tip a greedy choice.

It runs the layers laid out as Llama's (a norm before each branch, none after; SiLU; per-head
q/k norms or none) on the triton-fused attention; ``gemv_why`` says why not elsewhere, and the
runner keeps its usual step there. An unmerged adapter's products (``lora.LoraSlots``) cost
each projection group a kernel more: x A.T in ``gemv`` with the same norm, then its B product
added in the projection's own kernel before the rest (``gemv(lora=)``), rounded where
``llama_step.linear`` rounds them (folded adapters run apart here: the fold is for cuBLAS).
The layer keeps ``llama_step.decode_layer``'s signature, so ``llama_step.decode_step`` runs it:
the residual stream it returns is whole (the sums are the products' epilogues), and the
``delta`` it is handed, zeros, passes through untouched.
"""

from __future__ import annotations

from typing import Callable

from .fused_weights import FusedWeights


def gemv_why(fw: FusedWeights | None, attention: str, lora=None) -> str | None:
    """Why the six-kernel layer does not run this model (None: it does), with the adapter buffers
    ``lora`` (a ``lora.LoraSlots``) when an adapter is on."""
    import torch
    if fw is None:
        return "it runs nvkit's fused step, which does not fit this model"
    if attention != "triton-fused":
        return f"it runs on the triton-fused attention, not {attention!r}"
    if fw.activation != "silu":
        return f"it computes a SiLU gate, and this model's gated activation is {fw.activation!r}"
    for w in fw.layers:
        if w.in_norm is None or w.ff_norm is not None or w.mlp_norm is not None:
            return "its layers norm before each branch and not after (the Llama layout)"
        if w.q_norm is not None and w.q_norm.shape[0] != fw.hd:
            return "its q/k norms are per head or absent"
    if lora is not None and lora.dtype not in (fw.embed.dtype, torch.float32):
        return f"its adapter's dtype is the model's or float32, not {lora.dtype}"
    return None


def gemv_decode_layer(fw: FusedWeights, pdl: bool = False) -> Callable:
    """``llama_step.decode_layer``'s layer in six kernels, for the model whose weights ``fw`` holds
    (``gemv_why`` None): ``layer(h, delta, pos, where, cos, sin, mask, keys, values,
    *llama_step.layer_args(w, None))`` -> (h, delta), ``h`` the whole residual stream. ``pdl``: the
    products and the attention launched with Programmatic Dependent Launch (``kernels.gemv``), so
    no kernel of the layer waits for the one before to end before it starts."""
    from functools import partial

    from ..kernels.decode_attention import decode_attention_rope
    from ..kernels.gemv import gemv as plain_gemv
    gemv = partial(plain_gemv, pdl=pdl)
    nh, nkv, hd, scale = fw.nh, fw.nkv, fw.hd, fw.residual_scale
    cap = fw.attn_softcap or 0.0
    wf = fw.weight_first

    def product(x, w, bias, lo, norm=None, eps=1e-6, **kw):
        # lo: (A, B) or, folded, (A, B, stacked): the products apart either way
        if lo is not None:
            kw["lora"] = (gemv(x, lo[0], norm=norm, eps=eps, weight_first=wf), lo[1])
        return gemv(x, w, bias, norm=norm, eps=eps, weight_first=wf, **kw)

    def layer(h, delta, pos, where, cos, sin, mask, keys, values, in_norm, in_eps, qkv_w, qkv_bias, q_norm, k_norm,
              qk_eps, o_w, o_bias, post_norm, post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps, gate_up_w, gate_up_bias,
              down_w, down_bias, scaling, window, lo_qkv, lo_o, lo_gate_up, lo_down):
        qkv = product(h, qkv_w, qkv_bias, lo_qkv, norm=in_norm, eps=in_eps)
        o = decode_attention_rope(qkv.view(nh + 2 * nkv, hd), q_norm, k_norm, cos.view(-1), sin.view(-1), keys,
                                  values, pos, scaling, qk_eps, window, cap, pdl)
        h = product(o.view(1, nh * hd), o_w, o_bias, lo_o, scale=scale, residual=h)
        m = product(h, gate_up_w, gate_up_bias, lo_gate_up, norm=post_norm, eps=post_eps, glu=True)
        return product(m, down_w, down_bias, lo_down, scale=scale, residual=h), delta

    return layer


def gemv_head(fw: FusedWeights) -> Callable:
    """``head(h, delta)`` -> (1, vocab) float logits for ``gemv_decode_layer``'s stream: the final
    norm in nvkit's kernel and the LM head (``delta``, the zeros the step started with, unread)."""
    from ..kernels.add_rms_norm import rms_norm
    from .llama_step import lm_logits

    def head(h, delta):
        return lm_logits(fw, rms_norm(h, fw.norm, fw.norm_eps, fw.weight_first))

    return head


def gemv_parts(fw: FusedWeights | None, attention: str, asked: bool, pdl: bool = False, lora=None) -> dict:
    """``llama_step.decode_step``'s ``layer`` and ``head`` for the six-kernel layer where it is
    ``asked`` for and runs (``gemv_why``, with the adapter buffers ``lora`` the step reads, if
    any); none (the usual step) elsewhere. ``pdl``: with Programmatic Dependent Launch where the
    GPU and Triton give it (``kernels.common.pdl_why``)."""
    if not asked or gemv_why(fw, attention, lora) is not None:
        return {}
    from ..kernels.common import pdl_why
    pdl = pdl and pdl_why(fw.embed.device) is None
    return {"layer": gemv_decode_layer(fw, pdl), "head": gemv_head(fw)}


def gemv_words(fw: FusedWeights | None, attention: str, pdl: bool, lora=None) -> str:
    """The stats line's words for the six-kernel layers asked for: where they run, or why not."""
    why = gemv_why(fw, attention, lora)
    if why:
        return f"six-kernel layers: {why}"
    from ..kernels.common import pdl_why
    return ("six-kernel layers: uncompiled" + (", the adapter's products apart" if lora is not None else "")
            + (", PDL" if pdl and pdl_why(fw.embed.device) is None else ""))
