"""The rows prefill's per-head work in one Triton launch: every prompt token's query and key heads
RMS-normed per head (where the model has q/k norms) and rotated (RoPE, partial rotary too), the
queries written for the attention, each key and value written into the paged KV pool at the token's
index, and the keys also where the attention reads them.

Why: in torch's operations this is about a dozen launches a layer (two norms, two rotations of
five operations each, two index copies into the pool), and an eager prefill is paced by the host
issuing them, not by the GPU running them. The arithmetic is the decode kernels' (``common.rope_lanes``
and ``common.norm_rope``: float32, rounded once to the output's dtype), so a prompt's keys are the
ones its decode steps would have written. The torch reference is in
tests/generate/kernels/test_prefill_rope.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import norm_rope, rope_lanes
from .launch import launch


@triton.jit(do_not_specialize=["length"])  # one compile for every prompt length
def _prefill_rope_kernel(QKV, QW, KW, COS, SIN, FLAT, Q, K, KEYS, VALUES, eps, length, stride_t,
                         stride_ks, stride_kh, stride_vs, stride_vh,
                         NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, LANES: tl.constexpr,
                         ROT: tl.constexpr, HAS_NORM: tl.constexpr):
    t = tl.program_id(0)     # the token: row t // length, position t % length
    head = tl.program_id(1)  # query heads, then key heads, then value heads
    # LANES: HD rounded up to a power of two (Triton's blocks are); the lanes past HD are pass
    # lanes of the rotation (rope_lanes over LANES with ROT <= HD), read as 0 and never stored
    d = tl.arange(0, LANES)
    live = d < HD
    src = QKV + t.to(tl.int64) * stride_t + head * HD
    slot = tl.load(FLAT + t).to(tl.int64)
    if head < NH + NKV:
        pos = t % length
        rd, sign, cos, sin = rope_lanes(COS + pos * ROT, SIN + pos * ROT, d, LANES, ROT)
        x = tl.load(src + d, mask=live, other=0.0).to(tl.float32)[None, :]
        xr = tl.load(src + rd, mask=live, other=0.0).to(tl.float32)[None, :]
        if head < NH:
            y = norm_rope(x, xr, QW, d, rd, sign, cos, sin, eps, HAS_NORM, HD)
            tl.store(Q + (t.to(tl.int64) * NH + head) * HD + d[None, :], y.to(Q.dtype.element_ty), mask=live[None, :])
        else:
            kh = head - NH
            y = norm_rope(x, xr, KW, d, rd, sign, cos, sin, eps, HAS_NORM, HD)
            tl.store(K + (t.to(tl.int64) * NKV + kh) * HD + d[None, :], y.to(K.dtype.element_ty), mask=live[None, :])
            tl.store(KEYS + slot * stride_ks + kh * stride_kh + d[None, :], y.to(KEYS.dtype.element_ty),
                     mask=live[None, :])
    else:
        vh = head - NH - NKV
        tl.store(VALUES + slot * stride_vs + vh * stride_vh + d,
                 tl.load(src + d, mask=live, other=0.0).to(VALUES.dtype.element_ty), mask=live)


def fits(hd: int, q_norm) -> bool:
    """Whether ``prefill_rope`` takes heads of ``hd`` with the q/k norm weights ``q_norm`` (None, or
    one weight per head dim: norms over all heads are applied before it). Heads of any even width
    without per-head norms (Phi-3/4-mini's 96); with them, power-of-two heads, as the decode
    kernels' norm (``common.norm_rope``) reads its weight on every lane."""
    if hd < 2 or hd % 2:
        return False
    return q_norm is None or (hd & (hd - 1) == 0 and q_norm.shape[0] == hd)


def prefill_rope(qkv: torch.Tensor, q_norm, k_norm, cos: torch.Tensor, sin: torch.Tensor, flat: torch.Tensor,
                 keys: torch.Tensor, values: torch.Tensor, eps: float, nh: int, nkv: int, hd: int):
    """(q, k, v) of the stacked projection ``qkv`` ((rows, length, (nh + 2 nkv) · hd)): q (rows,
    length, nh, hd) and k (rows, length, nkv, hd) normed (``q_norm``/``k_norm``: per-head RMS
    weights, or both None) and rotated by the tables ``cos``/``sin`` (positions 0..length-1, ``rot``
    values each: (1, length, 1, rot) or (length, rot)), v a view of ``qkv``; and each token's key and
    value written into ``keys``/``values`` ((slots, nkv, hd)) at its slot in ``flat``
    ((rows · length,)), as ``index_copy_`` would."""
    if not fits(hd, q_norm) or (q_norm is None) != (k_norm is None):
        raise ValueError(f"prefill_rope takes heads of an even width without per-head q/k norms, or power-of-two "
                         f"heads with both norms (head_dim {hd}, q norm {q_norm is not None}, k norm "
                         f"{k_norm is not None})")
    if keys.shape[1:] != (nkv, hd) or values.shape[1:] != (nkv, hd) or keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError(f"prefill_rope writes pools of (slots, {nkv}, {hd}) with each head's values side by side, "
                         f"not {tuple(keys.shape)} / {tuple(values.shape)}")
    rows, length = qkv.shape[0], qkv.shape[1]
    qkv = qkv.contiguous()
    rot = cos.shape[-1]
    cos, sin = cos.reshape(-1, rot)[:length].contiguous(), sin.reshape(-1, rot)[:length].contiguous()
    if cos.shape[0] != length or rot % 2 or rot > hd:
        raise ValueError(f"prefill_rope needs rotary tables of {length} positions and an even width ≤ {hd}, "
                         f"not {tuple(cos.shape)}")
    q = torch.empty((rows, length, nh, hd), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((rows, length, nkv, hd), dtype=qkv.dtype, device=qkv.device)
    if rows * length:
        norm = q_norm is not None
        launch(_prefill_rope_kernel, (rows * length, nh + 2 * nkv),
               qkv, q_norm if norm else qkv, k_norm if norm else qkv, cos, sin, flat, q, k, keys, values, eps, length,
               qkv.stride(1), keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
               NH=nh, NKV=nkv, HD=hd, LANES=triton.next_power_of_2(hd), ROT=rot, HAS_NORM=norm,
               num_warps=1 if hd <= 128 else 2)
    v = qkv.view(rows, length, nh + 2 * nkv, hd)[:, :, nh + nkv:]
    return q, k, v
