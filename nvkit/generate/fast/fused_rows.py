"""nvkit's fused Llama-family steps over many sequences at once, on a paged KV cache (the
batched fast path, ``batched.BatchedDecoder``).

The same layer as ``fused.decode_step`` (the same weights, norms, RoPE and LoRA products, so the
same rounding), with a row axis: row b feeds ``tok[b]`` at its own position ``pos[b]`` and reads
and writes its keys and values through its page table ``table[b]`` (see
``decode_attention.paged_decode_attention``). Every layer's keys are one (pool positions, KV heads,
head_dim) tensor. Every size that varies from one request to the next (rows, table width, pool,
rotary tables) is an argument, so one compile serves every batch-size class and pool.

Attention: "triton" (nvkit's paged kernel: q/k norms, RoPE, the cache write and the attention of
every row in two kernels) or "matmul" (plain torch: each row's cache gathered through its table
and masked at its position; the CPU path, and the fallback where the kernel cannot run).
"""

from __future__ import annotations

from typing import Callable

from .fused import FusedWeights, linear, rope, rms_norm


def paged_positions(table, page: int, length: int):
    """(rows, length) pool indices of each row's positions 0..length-1 through its page table."""
    import torch
    offsets = torch.arange(length, device=table.device)
    return table.long().gather(1, (offsets // page).expand(table.shape[0], -1)) * page + offsets % page


def decode_rows_step(fw: FusedWeights, attention: str, page: int, lora=None) -> Callable:
    """``step(tok, pos, table, cos, sin, keys, values)`` -> (rows, vocab) float logits: one decode
    step of every row (``tok``, ``pos``: (rows,) int64; ``table``: (rows, blocks) int32 page ids;
    ``cos``/``sin``: (positions, head_dim); ``keys``/``values``: one pool tensor per layer). Writes
    each row's new key and value at its position; the caller advances ``pos``."""
    import torch
    import torch.nn.functional as F
    nh, nkv, hd = fw.nh, fw.nkv, fw.hd
    groups = nh // nkv
    neg = torch.finfo(torch.float32).min
    if attention == "triton":
        from ..decode_attention import paged_decode_attention

    def step(tok, pos, table, cos, sin, keys, values):
        h = F.embedding(tok, fw.embed)                                 # (rows, hidden)
        if attention != "triton":
            c, s = cos.index_select(0, pos).unsqueeze(1), sin.index_select(0, pos).unsqueeze(1)  # (rows, 1, hd)
            length = table.shape[1] * page
            where = paged_positions(table, page, length)               # (rows, length) pool indices
            here = where.gather(1, pos.unsqueeze(1)).squeeze(1)        # (rows,) each row's new position
            mask = torch.where(torch.arange(length, device=pos.device).unsqueeze(0) <= pos.unsqueeze(1), 0.0, neg)
        for i, w in enumerate(fw.layers):
            lo = lora.layers[i] if lora is not None else None
            x = rms_norm(h, w.in_norm, w.in_eps)
            qkv = linear(x, w.qkv, w.qkv_bias, lo and lo.qkv).view(-1, nh + 2 * nkv, hd)
            if attention == "triton":
                o = paged_decode_attention(qkv, w.q_norm, w.k_norm, cos, sin, keys[i], values[i], pos, table, page,
                                           w.scaling, w.qk_eps)
            else:
                q, k, v = qkv.split((nh, nkv, nkv), dim=1)
                if w.q_norm is not None:
                    q, k = rms_norm(q, w.q_norm, w.qk_eps), rms_norm(k, w.k_norm, w.qk_eps)
                q, k = rope(q, c, s), rope(k, c, s)
                keys[i].index_copy_(0, here, k)
                values[i].index_copy_(0, here, v)
                kk = keys[i][where].transpose(1, 2)                    # (rows, nkv, length, hd)
                vv = values[i][where].transpose(1, 2)
                scores = torch.matmul(q.view(-1, nkv, groups, hd), kk.transpose(2, 3)).float() * w.scaling
                scores = scores + mask[:, None, None, :]
                o = torch.matmul(scores.softmax(-1).to(fw.dtype), vv)  # (rows, nkv, groups, hd)
            h = h + linear(o.reshape(-1, nh * hd), w.o, w.o_bias, lo and lo.o)
            x = rms_norm(h, w.post_norm, w.post_eps)
            gate, up = linear(x, w.gate_up, w.gate_up_bias, lo and lo.gate_up).chunk(2, dim=-1)
            h = h + linear(F.silu(gate) * up, w.down, w.down_bias, lo and lo.down)
        return F.linear(rms_norm(h, fw.norm, fw.norm_eps), fw.lm_head).float()

    return step


def mark_dynamic(tok, pos, table, cos, sin, keys, values) -> None:
    """Mark the sizes that change between batch classes and pools as dynamic for ``torch.compile``,
    so the compile of the first class serves every other (a size of 1 is still specialised)."""
    import torch._dynamo
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (tok, pos, table, cos, sin, *keys, *values):
        mark(t, 0)
    mark(table, 1)


def prefill_rows_step(fw: FusedWeights, lora=None) -> Callable:
    """``prefill(ids, last, where, cos, sin, keys, values)`` -> (rows, vocab) float logits: the
    prompts of ``ids`` ((rows, length), each padded at its end) from position 0, their keys and
    values written at the pool indices ``where`` ((rows, length): a padded position's index points
    into the scratch page), and the logits of each row's position ``last[b]`` (its prompt's last
    token). Padding at the end leaves the prompt's own results as they are (causal attention), as
    ``fused.prefill_step`` relies on too."""
    import torch
    import torch.nn.functional as F
    nh, nkv, hd = fw.nh, fw.nkv, fw.hd
    groups = nh // nkv

    def prefill(ids, last, where, cos, sin, keys, values):
        rows, length = ids.shape
        h = F.embedding(ids, fw.embed)                                 # (rows, length, hidden)
        c, s = cos[:length].view(1, length, 1, hd), sin[:length].view(1, length, 1, hd)
        flat = where.reshape(-1)
        for i, w in enumerate(fw.layers):
            lo = lora.layers[i] if lora is not None else None
            x = rms_norm(h, w.in_norm, w.in_eps)
            qkv = linear(x, w.qkv, w.qkv_bias, lo and lo.qkv).view(rows, length, nh + 2 * nkv, hd)
            q, k, v = qkv.split((nh, nkv, nkv), dim=2)
            if w.q_norm is not None:
                q, k = rms_norm(q, w.q_norm, w.qk_eps), rms_norm(k, w.k_norm, w.qk_eps)
            q, k = rope(q, c, s), rope(k, c, s)
            keys[i].index_copy_(0, flat, k.reshape(rows * length, nkv, hd))
            values[i].index_copy_(0, flat, v.reshape(rows * length, nkv, hd))
            # each KV head repeated for its query heads, as transformers' repeat_kv does
            kk = k.transpose(1, 2)[:, :, None].expand(rows, nkv, groups, length, hd).reshape(rows, nh, length, hd)
            vv = v.transpose(1, 2)[:, :, None].expand(rows, nkv, groups, length, hd).reshape(rows, nh, length, hd)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, is_causal=True, scale=w.scaling)
            h = h + linear(o.transpose(1, 2).reshape(rows, length, nh * hd), w.o, w.o_bias, lo and lo.o)
            x = rms_norm(h, w.post_norm, w.post_eps)
            gate, up = linear(x, w.gate_up, w.gate_up_bias, lo and lo.gate_up).chunk(2, dim=-1)
            h = h + linear(F.silu(gate) * up, w.down, w.down_bias, lo and lo.down)
        lasts = h[torch.arange(rows, device=ids.device), last]         # (rows, hidden)
        return F.linear(rms_norm(lasts, fw.norm, fw.norm_eps), fw.lm_head).float()

    return prefill
