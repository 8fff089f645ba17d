"""nvkit's fused Llama-family steps over many sequences at once, on a paged KV cache (the
batched fast path, ``batched.BatchedDecoder``).

The same layer as ``llama_step.decode_step`` (the same weights, norms, RoPE and LoRA products, so the
same rounding), with a row axis: row b feeds ``tok[b]`` at its own position ``pos[b]`` and reads
and writes its keys and values through its page table ``table[b]`` (see
``kernels.paged_attention.paged_decode_attention``). Every layer's keys are one (pool positions, KV heads,
head_dim) tensor. Every size that varies from one request to the next (rows, table width, pool,
rotary tables) is an argument, so one compile serves every batch-size class and pool.

Attention: "paged" (nvkit's paged kernel: q/k norms, RoPE, the cache write and the attention of
every row in two kernels) or "matmul" (plain torch: each row's cache gathered through its table
and masked at its position; the CPU path, and the fallback where the kernel cannot run).
"""

from __future__ import annotations

from typing import Callable

from ... import events
from ...errors import error_summary

from .llama_step import (attend_scores, embed, full_qk_norm, layer_args, layer_ends, linear, lm_logits,
                         prefill_attention, projection, rope, rms_norm, rotaries, rotary_kinds, window_masks)
from .fused_weights import FusedWeights


def paged_positions(table, page: int, length: int):
    """(rows, length) pool indices of each row's positions 0..length-1 through its page table."""
    import torch
    offsets = torch.arange(length, device=table.device)
    return table.long().gather(1, (offsets // page).expand(table.shape[0], -1)) * page + offsets % page


def decode_rows_layer(nh: int, nkv: int, hd: int, dtype, attention: str, page: int, kernels: bool = False,
                      residual: float | None = None, weight_first: bool = False, invariant: bool = False,
                      act: str = "silu", softcap: float | None = None, paged: Callable | None = None) -> Callable:
    """One layer of the rows decode step, on tensors only: ``layer(h, delta, pos, table, cos, sin,
    c, s, where, here, mask, keys, values, *layer_args(w, lo))`` -> (h, delta), the residual
    carried as ``llama_step.decode_layer`` carries it (the layer's input is ``h + delta``). "paged"
    reads ``pos``, ``table`` and the rotary tables ``cos``/``sin``; "matmul" reads the rows'
    rotary values ``c``/``s``, their pool indices ``where``, new positions ``here`` and ``mask``
    (``decode_rows_step`` makes them once per step). ``kernels``: the sums with their norms, the
    activation and the adapters' products in nvkit's Triton kernels (``nvkit.generate.kernels``), for a
    step that is not compiled. ``residual``, ``weight_first``, ``act``, ``softcap``, the layer's
    window and a layer without ``in_norm`` (OLMo 2's): as ``llama_step.decode_layer`` (``mask`` is
    the layer's own, ``window_masks``). ``invariant`` (with ``kernels`` and "paged"): every
    product and the attention computed for each row as for that row alone (``kernels.invariant_linear``,
    the paged kernel's fixed slices): the batch-invariant step. ``paged``: what "paged" calls in
    place of ``paged_decode_attention`` (same arguments; ``compile_ahead`` runs the layer on meta
    tensors, where the op's fake implementation would launch nothing)."""
    import torch
    groups = nh // nkv
    cap = softcap or 0.0  # the kernel's form of "no cap"
    enter, leave = layer_ends(kernels, residual, weight_first, invariant, act)
    splits = 0
    if attention == "paged":
        from ..kernels.paged_attention import INVARIANT_SPLITS, paged_decode_attention
        splits = INVARIANT_SPLITS if invariant else 0
        paged = paged or paged_decode_attention
    proj = projection(kernels, invariant)

    def layer(h, delta, pos, table, cos, sin, c, s, where, here, mask, keys, values, in_norm, in_eps, qkv_w,
              qkv_bias, q_norm, k_norm, qk_eps, o_w, o_bias, post_norm, post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps,
              gate_up_w, gate_up_bias, down_w, down_bias, scaling, window, lo_qkv, lo_o, lo_gate_up, lo_down):
        h, x = enter(h, delta, in_norm, in_eps)
        # norms over all heads (OLMo 2) here, not in the kernel
        qkv, q_norm, k_norm = full_qk_norm(proj(x, qkv_w, qkv_bias, lo_qkv), q_norm, k_norm, qk_eps, hd, weight_first,
                                           kernels)
        qkv = qkv.view(-1, nh + 2 * nkv, hd)
        if attention == "paged":
            o = paged(qkv, q_norm, k_norm, cos, sin, keys, values, pos, table, page, scaling, qk_eps, splits, window,
                      cap)
        else:
            q, k, v = qkv.split((nh, nkv, nkv), dim=1)
            if q_norm is not None:
                q, k = rms_norm(q, q_norm, qk_eps, weight_first), rms_norm(k, k_norm, qk_eps, weight_first)
            q, k = rope(q, c, s), rope(k, c, s)
            keys.index_copy_(0, here, k)
            values.index_copy_(0, here, v)
            kk = keys[where].transpose(1, 2)                           # (rows, nkv, length, hd)
            vv = values[where].transpose(1, 2)
            scores = attend_scores(torch.matmul(q.view(-1, nkv, groups, hd), kk.transpose(2, 3)), scaling, softcap)
            scores = scores + mask[:, None, None, :]
            o = torch.matmul(scores.softmax(-1).to(dtype), vv)         # (rows, nkv, groups, hd)
        return leave(h, proj(o.reshape(-1, nh * hd), o_w, o_bias, lo_o), post_norm, post_eps, ff_norm, ff_eps,
                     mlp_norm, mlp_eps, gate_up_w, gate_up_bias, down_w, down_bias, lo_gate_up, lo_down)

    return layer


def model_decode_rows_layer(fw: FusedWeights, attention: str, page: int, kernels: bool = False,
                            invariant: bool = False) -> Callable:
    """``decode_rows_layer`` for the model whose weights ``fw`` holds."""
    return decode_rows_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, attention, page, kernels, fw.residual_scale,
                             fw.weight_first, invariant, fw.activation, fw.attn_softcap)


def decode_rows_step(fw: FusedWeights, attention: str, page: int, lora=None, layer: Callable | None = None,
                     head: Callable | None = None, kernels: bool = False, invariant: bool = False) -> Callable:
    """``step(tok, pos, table, cos, sin, keys, values)`` -> (rows, vocab) float logits: one decode
    step of every row (``tok``, ``pos``: (rows,) int64; ``table``: (rows, blocks) int32 page ids;
    ``cos``/``sin``: ``FusedWeights.rotary``'s tables, (positions, rotary width) per rotary kind;
    ``keys``/``values``: one pool tensor per layer). Writes each row's new key and value at its
    position; the caller advances ``pos``.

    ``layer`` and ``head``: the functions of ``decode_rows_layer`` and ``llama_step.decode_head`` to run
    (default: those, eager). Given, they are compiled ones, and the sizes that change from one
    batch class or pool to the next are marked dynamic before each call. ``kernels``: the default
    layer and head with nvkit's Triton kernels (``decode_rows_layer``), the adapters' products folded
    as at batch 1 (``kernels.lora_add.folded_linear`` takes any number of rows); ``invariant`` with
    it: the batch-invariant ones (``rows_invariant``), the products apart."""
    import torch
    from .llama_step import decode_head
    neg = torch.finfo(torch.float32).min
    regional = layer is not None
    fold = kernels and not invariant and not regional  # torch's folded form is written for one row
    layer = layer or model_decode_rows_layer(fw, attention, page, kernels, invariant)
    head = head or decode_head(fw, kernels, invariant)

    def step(tok, pos, table, cos, sin, keys, values):
        h = embed(fw, tok)                                             # (rows, hidden)
        where = here = None
        masks: dict = {}
        if attention == "paged":  # the kernel looks the rows' positions up in the whole tables
            tables = [(cs, sn, None, None) for cs, sn in rotaries(fw, rotary_kinds(fw, cos, sin))]
        else:
            picked = [(c.index_select(0, pos).unsqueeze(1), s.index_select(0, pos).unsqueeze(1))  # (rows, 1, hd)
                      for c, s in rotary_kinds(fw, cos, sin)]
            tables = [(None, None, cs, sn) for cs, sn in rotaries(fw, picked)]
            length = table.shape[1] * page
            where = paged_positions(table, page, length)               # (rows, length) pool indices
            here = where.gather(1, pos.unsqueeze(1)).squeeze(1)        # (rows,) each row's new position
            masks = window_masks(fw, torch.arange(length, device=pos.device).unsqueeze(0), pos.unsqueeze(1), neg)
        delta = torch.zeros_like(h)
        for i, (w, (cs, sn, c, s)) in enumerate(zip(fw.layers, tables)):
            lo = lora.layers[i] if lora is not None else None
            mask = masks.get(w.window)
            if regional:
                mark_layer_rows_dynamic(h, delta, pos, table, cs, sn, c, s, where, here, mask, keys[i], values[i])
            h, delta = layer(h, delta, pos, table, cs, sn, c, s, where, here, mask, keys[i], values[i],
                             *layer_args(w, lo, fold=fold))
        if regional:
            mark_layer_rows_dynamic(h, delta)
        return head(h, delta)

    return step


def mark_layer_rows_dynamic(h, delta, pos=None, table=None, cos=None, sin=None, c=None, s=None, where=None,
                            here=None, mask=None, keys=None, values=None) -> None:
    """The sizes of a compiled rows layer's (or head's) inputs that change from one batch class or
    pool to the next, dynamic for ``torch.compile``: rows, table width, pool positions, rotary
    positions. None entries (what the layer's attention does not read) are skipped."""
    import torch._dynamo
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (h, delta, pos, cos, sin, c, s, here, keys, values):
        if t is not None:
            mark(t, 0)
    for t in (table, where, mask):
        if t is not None:
            mark(t, 0)
            mark(t, 1)


def mark_dynamic(tok, pos, table, cos, sin, keys, values) -> None:
    """Mark the sizes that change between batch classes and pools as dynamic for ``torch.compile``,
    so the compile of the first class serves every other (a size of 1 is still specialised)."""
    import torch._dynamo
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (tok, pos, table, cos, sin, *keys, *values):
        mark(t, 0)
    mark(table, 1)


def prefill_rows_layer(nh: int, nkv: int, hd: int, residual: float | None = None,
                       weight_first: bool = False, act: str = "silu", softcap: float | None = None,
                       kernels: bool = False, attend: Callable | None = None) -> Callable:
    """One decoder layer of the rows prefill, on tensors only: ``layer(h, cos, sin, flat, keys,
    values, *layer_args(w, lo))`` -> the layer's output h. ``h``: (rows, length, hidden);
    ``cos``/``sin``: (1, length, 1, rotary width); ``flat``: (rows * length,) pool indices where the
    layer's keys and values go; ``keys``/``values``: this layer's pool tensors.

    Why a layer and not the whole forward: every layer is the same code on other tensors, so one
    compile of this function serves all of them (and every group shape), where a compile of the
    whole forward unrolls every layer into one graph and takes about as many times longer as the
    model has layers. The layer boundary costs nothing here: the host issues a layer's few fused
    kernels far faster than the GPU runs a group's matrix products. ``residual``, ``weight_first``,
    ``act``, ``softcap``, the layer's window and a layer without ``in_norm`` (OLMo 2's): as
    ``llama_step.decode_layer``.

    ``kernels`` (CUDA, uncompiled): the norms, the residual sums before them and the activation
    in nvkit's Triton kernels (``layer_ends``), and the per-head q/k norms, RoPE and the pool's
    writes in one (``prefill_rope``, where it fits the heads), the projections still torch's. Why:
    the eager prefill launches each elementwise operation as a kernel of its own (a norm is eight,
    a Gemma layer has six norms, RoPE is five per tensor), which the host issues more slowly than
    the GPU runs the layer's matrix products; the compiled prefill fuses them itself and traces
    this layer with ``kernels`` False.

    ``attend(q, k, v, scaling, window, softcap)``: the attention of (rows, heads, length, head dim)
    tensors, torch's fused attention by default; ``compile_ahead`` runs the layer on meta tensors in
    a thread of its own and stands in a tensor of the right shape, since ``sdpa_kernel`` below
    switches torch's attention backends for the whole process, not for one thread."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    groups = nh // nkv
    _, leave = layer_ends(kernels, residual, weight_first, act=act, products=False)
    if kernels:
        from ..kernels.add_rms_norm import rms_norm as norm
        from ..kernels.prefill_rope import fits, prefill_rope
    else:
        norm = rms_norm
    # Not cuDNN's attention: it builds a plan for every new shape (tens of milliseconds each), and
    # PyTorch keeps those plans per thread. Group shapes follow the prompts' lengths, so nearly
    # every request meets new ones, and a thread that has not run them (a new worker, the main
    # thread) builds them all again: that was most of a many-prompt request's prefill. Flash and
    # memory-efficient attention plan nothing; math stays as the last resort.
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def fused_attention(q, k, v, scaling, window, softcap):
        with sdpa_kernel(backends):
            return prefill_attention(q, k, v, scaling, window, softcap)
    attend = attend or fused_attention

    def layer(h, cos, sin, flat, keys, values, in_norm, in_eps, qkv_w, qkv_bias, q_norm, k_norm, qk_eps, o_w,
              o_bias, post_norm, post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps, gate_up_w, gate_up_bias, down_w,
              down_bias, scaling, window, lo_qkv, lo_o, lo_gate_up, lo_down):
        rows, length = h.shape[0], h.shape[1]
        x = h if in_norm is None else norm(h, in_norm, in_eps, weight_first)
        qkv, q_norm, k_norm = full_qk_norm(linear(x, qkv_w, qkv_bias, lo_qkv), q_norm, k_norm, qk_eps, hd, weight_first,
                                           kernels)
        if kernels and fits(hd, q_norm):
            q, k, v = prefill_rope(qkv, q_norm, k_norm, cos, sin, flat, keys, values, qk_eps, nh, nkv, hd)
        else:
            q, k, v = prefill_heads(qkv, q_norm, k_norm, cos, sin, flat, keys, values, qk_eps, nh, nkv, hd, norm=norm,
                                    weight_first=weight_first)
        # each KV head repeated for its query heads, as transformers' repeat_kv does
        kk = k.transpose(1, 2)[:, :, None].expand(rows, nkv, groups, length, hd).reshape(rows, nh, length, hd)
        vv = v.transpose(1, 2)[:, :, None].expand(rows, nkv, groups, length, hd).reshape(rows, nh, length, hd)
        o = attend(q.transpose(1, 2), kk, vv, scaling, window, softcap)
        h, m = leave(h, linear(o.transpose(1, 2).reshape(rows, length, nh * hd), o_w, o_bias, lo_o), post_norm,
                     post_eps, ff_norm, ff_eps, mlp_norm, mlp_eps, gate_up_w, gate_up_bias, down_w, down_bias,
                     lo_gate_up, lo_down)
        return h + m

    return layer


def prefill_heads(qkv, q_norm, k_norm, cos, sin, flat, keys, values, eps: float, nh: int, nkv: int, hd: int, *,
                  norm: Callable = rms_norm, weight_first: bool = False):
    """(q, k, v) heads of a prefill group's stacked projection ``qkv`` ((rows, length, width)) in
    torch's operations: q and k normed per head (``norm``, where the model has q/k norms) and
    rotated, each token's key and value written into ``keys``/``values`` at its pool index in
    ``flat``. ``kernels.prefill_rope`` is the same in one launch (its test holds it to this)."""
    rows, length = qkv.shape[0], qkv.shape[1]
    q, k, v = qkv.view(rows, length, nh + 2 * nkv, hd).split((nh, nkv, nkv), dim=2)
    if q_norm is not None:
        q, k = norm(q, q_norm, eps, weight_first), norm(k, k_norm, eps, weight_first)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    keys.index_copy_(0, flat, k.reshape(rows * length, nkv, hd))
    values.index_copy_(0, flat, v.reshape(rows * length, nkv, hd))
    return q, k, v


def mark_layer_dynamic(h, cos, sin, flat, keys, values) -> None:
    """The sizes that change from one prefill group (or pool) to the next, dynamic for
    ``torch.compile``: rows and length, the pool's positions."""
    import torch._dynamo
    mark = torch._dynamo.maybe_mark_dynamic
    mark(h, 0)
    mark(h, 1)
    mark(cos, 1)
    mark(sin, 1)
    mark(flat, 0)
    mark(keys, 0)
    mark(values, 0)


class RowsPrefillStep:
    """``prefill(ids, last, where, cos, sin, keys, values)`` -> (rows, vocab) float logits: the
    prompts of ``ids`` ((rows, length), each padded at its end) from position 0, their keys and
    values written at the pool indices ``where`` ((rows, length): a padded position's index points
    into the scratch page), and the logits of each row's position ``last[b]`` (its prompt's last
    token). Padding at the end leaves the prompt's own results as they are (causal attention), as
    ``llama_step.prefill_step`` relies on too.

    The layers run through ``eager_layer`` (default: ``prefill_rows_layer``'s function, with
    nvkit's kernels where ``kernels``); ``with_layer(fn)`` is the same prefill through ``fn`` instead
    (``traced_layer``, the layer of torch's operations, compiled), with the sizes that vary marked
    dynamic before each layer. Where nvkit's kernels fail (a GPU or Triton release they do not
    build for), the prefill runs torch's operations from then on and ``kernel_error`` says why: a
    list's prefill runs before its step is captured, so the step's own fallback comes too late."""

    def __init__(self, fw: FusedWeights, lora=None, eager_layer: Callable | None = None, kernels: bool = False):
        self.fw, self.lora = fw, lora

        def layer(with_kernels: bool) -> Callable:
            return prefill_rows_layer(fw.nh, fw.nkv, fw.hd, fw.residual_scale, fw.weight_first, fw.activation,
                                      fw.attn_softcap, with_kernels)
        self.eager_layer = eager_layer or layer(kernels)
        #: what torch.compile traces: torch's operations, which inductor fuses (not nvkit's kernels)
        self.traced_layer = layer(False) if kernels and eager_layer is None else self.eager_layer
        self.layer = self.eager_layer
        self.dynamic = False
        self.kernel_error: str | None = None

    def with_layer(self, layer: Callable) -> "RowsPrefillStep":
        import copy
        other = copy.copy(self)
        other.layer, other.dynamic = layer, True
        return other

    def __call__(self, ids, last, where, cos, sin, keys, values):
        if self.layer is not self.eager_layer or self.eager_layer is self.traced_layer:  # not nvkit's kernels
            return self._forward(ids, last, where, cos, sin, keys, values)
        try:
            return self._forward(ids, last, where, cos, sin, keys, values)
        except Exception as e:  # noqa: BLE001 - torch's operations compute the same; say why and go on
            self.kernel_error = error_summary(e)
            events.record("compile", f"fast batch: nvkit's kernels failed in the prompt prefill ({self.kernel_error}); "
                                     "it runs torch's operations")
            self.layer = self.eager_layer = self.traced_layer
            return self._forward(ids, last, where, cos, sin, keys, values)  # every key written again

    def _forward(self, ids, last, where, cos, sin, keys, values):
        import torch
        fw, lora = self.fw, self.lora
        rows, length = ids.shape
        h = embed(fw, ids)                                             # (rows, length, hidden)
        tables = rotaries(fw, [(c[:length].view(1, length, 1, -1), s[:length].view(1, length, 1, -1))
                               for c, s in rotary_kinds(fw, cos, sin)])
        flat = where.reshape(-1)
        for i, (w, (c, s)) in enumerate(zip(fw.layers, tables)):
            lo = lora.layers[i] if lora is not None else None
            if self.dynamic:
                mark_layer_dynamic(h, c, s, flat, keys[i], values[i])
            h = self.layer(h, c, s, flat, keys[i], values[i], *layer_args(w, lo))
        lasts = h[torch.arange(rows, device=ids.device), last]         # (rows, hidden)
        return lm_logits(fw, rms_norm(lasts, fw.norm, fw.norm_eps, fw.weight_first))


def prefill_rows_step(fw: FusedWeights, lora=None, kernels: bool = False) -> RowsPrefillStep:
    """The eager rows prefill (``RowsPrefillStep``) of ``fw`` with the adapter buffers ``lora``;
    ``kernels``: its norms and activation in nvkit's kernels (``prefill_rows_layer``)."""
    return RowsPrefillStep(fw, lora, kernels=kernels)
