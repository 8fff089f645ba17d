"""nvkit's decode attention kernels timed for several launch shapes in one process (``python -m
nvkit.benchmarks.attention``; on a GPU machine): the batched path's paged kernel (``paged``, the
default) and the batch-1 kernel over a static cache at short and long positions (``batch1``,
``--batch1``: a long prompt's decode reads the cache at every step, and this says at what rate).

One call is one layer's attention of one decode step: every row at its own position over a pool of
scattered pages, as the batched fast path runs it. The rows' lengths are drawn like the decode
benchmark's mixed prompts (``lo``–``hi`` prompt tokens) plus half the new tokens, a step in the
middle of a request. Each shape's output is checked against an fp32 reference in plain torch
before it is timed (``max_err``; a shape much further from it than the default launch is marked
"wrong", not ranked: ``tl.dot`` rounds q and the weights to bf16 as a bf16 matmul does), then
timed with CUDA events over ``repeats`` calls; the rows name the shape, µs per call, ms per decode
step (× the model's layers), the KV bytes the call must read and the rate it read them at.
``device="cpu"`` runs the same under Triton's interpreter (``TRITON_INTERPRET=1``), to check the
benchmark itself; its times say nothing about a GPU.

The references in plain torch (``paged_attend_rope_reference``, ``attend_rope_reference`` and the
two they are built from) live here, not in the kernels' modules: this benchmark checks every
shape against them, and tests/generate/kernels/ check the kernels against them too.
"""

from __future__ import annotations

import random
import sys

from ..checks import positive_int, whole_number
from ..errors import NvkitError, require
from .kernel_timing import L2_OVERFLOW, events_us, graph_us, kernel_device
from .tables import table_text

# (splits, pages per loop step, warps, tl.dot, stages); None: the kernel's own choice. The first
# is the product's launch (``paged_launch``'s defaults, which depend on the cache's dtype); the
# second the fp32 products with Triton's own launch.
SHAPES = ((None, None, None, None, None), (None, 1, None, False, None), (None, 1, 2, False, None), (None, 1, 8, False, None),
          (None, 2, 4, False, None), (None, 2, 8, False, None), (None, 4, 8, False, None),
          (2, 1, None, False, None), (4, 1, None, False, None), (2, 2, 8, False, None), (4, 2, 8, False, None),
          (None, 1, 4, True, None), (None, 2, 4, True, 3), (None, 2, 8, True, 3), (4, 2, 4, True, 3),
          (8, 1, 4, True, 3))
TOLERANCE = 2e-2  # from the fp32 reference, for bf16 outputs of O(1): a few ulps (or 4 × the default's own)
#: the batch-1 kernel's launches ``batch1`` times, as (splits, blocks of ``BLOCK_L`` positions per
#: loop step, warps, tl.dot, stages), None the op's own for the cache (``default_launch``); the
#: first is the op's own launch
BATCH1_SHAPES = ((None, None, None, None, None), (32, 1, None, False, None), (64, 1, None, False, None),
                 (128, 1, None, False, None), (64, 2, 4, False, None), (128, 2, 4, False, None),
                 (None, 2, 4, True, 3), (32, 2, 4, True, 3), (64, 2, 4, True, 3), (128, 2, 4, True, 3),
                 (64, 4, 4, True, 3), (64, 4, 8, True, 3), (128, 4, 4, True, 3), (256, 2, 4, True, 3),
                 (64, 1, 4, True, 2), (128, 1, 4, True, 3))
#: the positions ``batch1`` attends over by default: a chat turn's, a long prompt's, a longer one's
BATCH1_LENGTHS = (1024, 8192, 16384)


def _shape_name(shape, unit: str = "page", default=None) -> str:
    splits, pages, warps, dot, stages = shape
    if shape == (default or SHAPES[0]):
        return "default"
    per_step = "the op's" if pages is None else f"{pages} {unit}{'s' if pages > 1 else ''}"
    return (f"splits {splits if splits is not None else 'auto'} · {per_step}/step"
            f" · warps {warps if warps is not None else 'default'}{' · tl.dot' if dot else ''}"
            f"{f' · {stages} stages' if stages is not None else ''}")


def paged(model: str = "qwen3-0.6b", rows=(64, 256), lo: int = 16, hi: int = 512, new_tokens: int = 128,
          shapes=SHAPES, repeats: int = 50, seed: int = 0, device: str = "cuda"):
    """A DataFrame, one row per (rows, launch shape): see the module docstring. ``model``: a shape
    name of ``nvkit.demo.SHAPES`` (its attention layout and layer count; random values)."""
    import pandas as pd
    import torch

    from ..demo import SHAPES as MODEL_SHAPES
    from ..generate.kernels import paged_attention as pa
    from ..generate.fast.paged_cache import PAGE
    from ..generate.fast.schedule import pages_for

    require(isinstance(model, str) and model.lower() in MODEL_SHAPES,
            f"model must be one of {sorted(MODEL_SHAPES)}, not {model!r}.")
    require(isinstance(rows, (list, tuple)) and rows, f"rows must be a list of row counts, e.g. (64, 256), not {rows!r}.")
    for n in rows:
        whole_number("rows", n, 1, 4096)
    for name, v in (("lo", lo), ("hi", hi), ("new_tokens", new_tokens), ("repeats", repeats)):
        positive_int(name, v)
    require(lo <= hi, f"lo ({lo}) must not be more than hi ({hi}).")
    require(isinstance(shapes, (list, tuple)) and shapes and all(isinstance(s, tuple) and len(s) == 5 for s in shapes),
            "shapes must be a list of (splits, pages per step, warps, dot, stages) tuples.")
    nh, nkv, hd, layers, dev, dt = _setting(model, device)
    rng = random.Random(f"attention:{seed}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for n in rows:
        lengths = [rng.randint(lo, hi) + new_tokens // 2 for _ in range(n)]
        width = max(pages_for(x, PAGE) for x in lengths)
        need = sum(pages_for(x, PAGE) for x in lengths)
        pages = need + 1  # page 0: the scratch page the batched path keeps
        order = (torch.randperm(need, generator=gen) + 1).tolist()
        table = torch.zeros((n, width), dtype=torch.int32)
        at = 0
        for b, x in enumerate(lengths):
            k_pages = pages_for(x, PAGE)
            table[b, :k_pages] = torch.tensor(order[at:at + k_pages], dtype=torch.int32)
            at += k_pages
        table = table.to(dev)
        pos = torch.tensor([x - 1 for x in lengths], dtype=torch.long, device=dev)
        k = torch.randn((pages * PAGE, nkv, hd), generator=gen).to(dev, dt)
        v = torch.randn((pages * PAGE, nkv, hd), generator=gen).to(dev, dt)
        qkv = torch.randn((n, nh + 2 * nkv, hd), generator=gen).to(dev, dt)
        qw = (torch.rand(hd, generator=gen) + 0.5).to(dev, dt)
        kw = (torch.rand(hd, generator=gen) + 0.5).to(dev, dt)
        ang = torch.randn((width * PAGE, hd // 2), generator=gen).repeat(1, 2)
        cos, sin = ang.cos().to(dev, dt), ang.sin().to(dev, dt)
        read = sum(lengths) * nkv * hd * 2 * k.element_size()  # K and V of every row's positions

        def call(shape):
            splits, per_step, warps, dot, stages = shape
            return pa.paged_launch(qkv, qw, kw, cos, sin, k, v, pos, table, PAGE, hd ** -0.5, 1e-6,
                                   splits=splits, pages_per_step=per_step, num_warps=warps, dot=dot,
                                   num_stages=stages)

        # fp32 reference in plain torch, row by row (on copies: it writes the new keys too)
        ref = paged_attend_rope_reference(qkv, qw, kw, cos, sin, k.clone(), v.clone(), pos.cpu(), table.cpu(),
                                          PAGE, hd ** -0.5, 1e-6).float()
        out += _checked_and_timed(call, ref, SHAPES[0], shapes, _shape_name, read, layers, "ms_per_step", repeats, dev,
                                  {"rows": n, "shape": None, "positions": sum(lengths), "kv_mib": read / 2**20})
        del k, v, qkv
    df = pd.DataFrame(out)
    cuda = dev.type == "cuda"
    df.attrs.update(model=model, layers=layers, heads=(nh, nkv, hd), page=PAGE,
                    gpu=torch.cuda.get_device_name(dev) if cuda else "cpu (Triton's interpreter)",
                    sms=torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 0,
                    new_tokens=new_tokens, lo=lo, hi=hi, repeats=repeats)
    return df


def batch1(model: str = "qwen3-0.6b", lengths=BATCH1_LENGTHS, shapes=BATCH1_SHAPES, repeats: int = 20,
           seed: int = 0, device: str = "cuda", cache: int | None = None):
    """A DataFrame, one row per (positions, launch shape) of the batch-1 kernel
    (``decode_attention.decode_launch``, the q/k norms and RoPE fused in, as the fused step runs
    it): one layer's attention of one token at position ``length - 1`` over a static cache of the
    size class such a request gets (``cache``: one size for every length, e.g. a short chat in a
    long prompt's cache), each shape checked against the fp32 reference first, as ``paged`` does;
    the rows give µs per call, ms per token (× the model's layers), the KV bytes read and the rate.
    ``shapes``: (splits, blocks per loop step, warps, dot, stages) tuples.

    Timed as the step runs it: calls captured in a CUDA graph (``kernel_timing.graph_us``; one call
    is a few microseconds of GPU work, which launches from Python would hide), cycling through
    copies of the cache that together overflow the L2 cache, so every call reads from memory."""
    import pandas as pd
    import torch

    from ..demo import SHAPES as MODEL_SHAPES
    from ..generate.kernels import decode_attention as da
    from ..generate.kernels.common import next_pow2

    require(isinstance(model, str) and model.lower() in MODEL_SHAPES,
            f"model must be one of {sorted(MODEL_SHAPES)}, not {model!r}.")
    require(isinstance(lengths, (list, tuple)) and lengths,
            f"lengths must be a list of positions, e.g. (1024, 8192), not {lengths!r}.")
    for n in lengths:
        whole_number("lengths", n, 1, 1 << 20)
    positive_int("repeats", repeats)
    require(isinstance(shapes, (list, tuple)) and shapes and all(isinstance(s, tuple) and len(s) == 5 for s in shapes),
            "shapes must be a list of (splits, blocks per step, warps, dot, stages) tuples.")
    if cache is not None:
        whole_number("cache", cache, 1, 1 << 21)
        require(cache & (cache - 1) == 0 and cache >= max(lengths),
                f"cache must be a power of two of at least the longest length ({max(lengths)}), not {cache}.")
    nh, nkv, hd, layers, dev, dt = _setting(model, device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    fixed = cache
    for n in lengths:
        # the size class of a request of n positions and a few hundred new tokens
        cache = fixed or next_pow2(n + 512)
        nbytes = 2 * nkv * cache * hd * torch.finfo(dt).bits // 8
        copies = max(1, -(-L2_OVERFLOW // nbytes)) if dev.type == "cuda" else 1
        caches = [(torch.randn((nkv, cache, hd), generator=gen).to(dev, dt),
                   torch.randn((nkv, cache, hd), generator=gen).to(dev, dt)) for _ in range(copies)]
        k, v = caches[0]
        qkv = torch.randn((nh + 2 * nkv, hd), generator=gen).to(dev, dt)
        qw = (torch.rand(hd, generator=gen) + 0.5).to(dev, dt)
        kw = (torch.rand(hd, generator=gen) + 0.5).to(dev, dt)
        ang = torch.randn(hd // 2, generator=gen).repeat(2)
        cos, sin = ang.cos().to(dev, dt), ang.sin().to(dev, dt)
        pos = torch.tensor(n - 1, device=dev)
        read = n * nkv * hd * 2 * k.element_size()  # K and V of the positions up to pos

        def call(shape, kv=caches[0]):
            splits, per_step, warps, dot, stages = shape
            return da.decode_launch(qkv, qw, kw, cos, sin, kv[0], kv[1], pos, hd ** -0.5, 1e-6, splits=splits,
                                    blocks_per_step=per_step, dot=dot, num_warps=warps, num_stages=stages)

        ref = attend_rope_reference(qkv, qw, kw, cos, sin, k.clone(), v.clone(), pos, hd ** -0.5, 1e-6).float()
        out += _checked_and_timed(call, ref, BATCH1_SHAPES[0], shapes,
                                  lambda shape: _shape_name(shape, "block", BATCH1_SHAPES[0]), read, layers,
                                  "ms_per_token", repeats, dev,
                                  {"positions": n, "cache": cache, "shape": None, "kv_mib": read / 2**20},
                                  timer=lambda shape: graph_us(lambda kv: call(shape, kv), caches, repeats, dev))
        del k, v, caches
    df = pd.DataFrame(out)
    cuda = dev.type == "cuda"
    df.attrs.update(model=model, layers=layers, heads=(nh, nkv, hd), repeats=repeats,
                    gpu=torch.cuda.get_device_name(dev) if cuda else "cpu (Triton's interpreter)",
                    sms=torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 0)
    return df


def _checked_and_timed(call, ref, default, shapes, name, read: int, layers: int, per_step: str, repeats: int, dev,
                       row: dict, timer=None) -> list[dict]:
    """One row per launch shape (``row`` filled in): ``call(shape)``'s output checked against the
    fp32 reference ``ref`` first (a shape much further from it than the ``default`` launch is a
    row marked "wrong", not timed), then timed: µs per call (``timer(shape)``; by default the calls
    back to back between CUDA events), ``per_step`` (ms for every layer's call) and the rate it
    read its ``read`` bytes at. A shape that fails is a row that says so."""
    base_err = (call(default).float() - ref).abs().max().item()
    bound = max(TOLERANCE, 4 * base_err)
    rows = []
    for shape in shapes:
        r = {**row, "shape": name(shape)}
        try:
            err = (call(shape).float() - ref).abs().max().item()  # the first call compiles the kernel for it
            r["max_err"] = err
            if not err <= bound:
                r["note"] = f"wrong: {err:.3g} from the fp32 reference, where the default launch is {base_err:.3g} from it"
            else:
                us = timer(shape) if timer else events_us(lambda: call(shape), repeats, dev)
                r.update(us_per_call=us, **{per_step: us * layers / 1000}, read_gb_s=read / (us * 1e-6) / 1e9)
        except Exception as e:  # noqa: BLE001 - a shape the GPU cannot run is a row that says so
            r["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        rows.append(r)
    return rows


def _setting(model: str, device: str) -> tuple:
    """(query heads, KV heads, head_dim, layers, device, dtype) of a run on ``model``'s attention
    layout: bf16 on a GPU, float32 in Triton's interpreter (``kernel_timing.kernel_device``)."""
    import torch

    from ..demo import shaped_config
    from ..memory.estimate import attention_dims
    dev = kernel_device(device, "attention")
    cfg = shaped_config(model.lower())
    nh, nkv, hd = attention_dims(cfg)
    layers = int(cfg.get_text_config().num_hidden_layers)
    return nh, nkv, hd, layers, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32


# --- the kernels' references in plain torch (fp32) ---------------------------------------------
# What the benchmarks check every launch shape against; tests/generate/kernels/ check the attention
# kernels against the same functions.

def rope_reference(x, weight, cos, sin, eps: float):
    """RMS norm per row over the whole head (when ``weight`` is given) and rotate-half RoPE, in
    fp32. Tables narrower than the head (r of head_dim values) are partial rotary embedding as
    transformers' Phi-3 applies it: the first r dims rotate (rotate-half over r), the rest pass."""
    import torch
    x = x.float()
    if weight is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    out = x_rot * cos.float() + torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1) * sin.float()
    return torch.cat((out, x_pass), dim=-1) if rot < x.shape[-1] else out


def attend_reference(q, k, v, pos, scale: float, window: int = 0, softcap: float = 0.0):
    """``kernels.decode_attention.decode_attention`` in plain torch (fp32 softmax): one query per
    head, q (heads, head_dim), over k, v (KV heads, length, head_dim) at positions 0..pos, or with
    ``window`` > 0 at pos - window + 1..pos; with ``softcap`` > 0 the scores are
    softcap · tanh(score / softcap) before the mask, as transformers' Gemma 2 attention has them."""
    import torch
    nh, hd = q.shape
    nkv, length, _ = k.shape
    groups = nh // nkv
    scores = torch.matmul(q.view(nkv, groups, hd).float(), k.float().transpose(1, 2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    at = torch.arange(length, device=k.device)
    hidden = at > pos
    if window:
        hidden = hidden | (at <= pos - window)
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.matmul(scores.softmax(-1), v.float()).reshape(nh, hd).to(q.dtype)


def attend_rope_reference(qkv, q_weight, k_weight, cos, sin, k, v, pos, scale: float, eps: float,
                          window: int = 0, softcap: float = 0.0):
    """``kernels.decode_attention.decode_attention_rope`` in plain torch (writes into ``k``/``v`` the
    same way); ``cos``/``sin`` (r,) with r < head_dim rotate the first r dims only (``rope_reference``)."""
    nkv = k.shape[0]
    nh = qkv.shape[0] - 2 * nkv
    q = rope_reference(qkv[:nh], q_weight, cos, sin, eps)
    k[:, int(pos)] = rope_reference(qkv[nh:nh + nkv], k_weight, cos, sin, eps).to(k.dtype)
    v[:, int(pos)] = qkv[nh + nkv:]
    return attend_reference(q, k, v, pos, scale, window, softcap).to(qkv.dtype)


def paged_attend_rope_reference(qkv, q_weight, k_weight, cos, sin, k, v, pos, table, page: int, scale: float,
                                eps: float, window: int = 0, softcap: float = 0.0):
    """``kernels.paged_attention.paged_decode_attention`` in plain torch, row by row (writes into
    ``k``/``v`` the same way); ``window`` and ``softcap`` as ``attend_reference`` takes them, the
    (positions, r) tables as ``rope_reference`` (r < head_dim: partial rotation). It gathers every
    position up to each row's own, so the whole table must point at real pages."""
    import torch
    rows, width, hd = qkv.shape
    nkv = k.shape[1]
    nh = width - 2 * nkv
    outs = []
    for b in range(rows):
        p = int(pos[b])
        where = torch.tensor([int(table[b, t // page]) * page + t % page for t in range(p + 1)])
        qb = rope_reference(qkv[b, :nh], q_weight, cos[p], sin[p], eps)
        k[where[-1]] = rope_reference(qkv[b, nh:nh + nkv], k_weight, cos[p], sin[p], eps).to(k.dtype)
        v[where[-1]] = qkv[b, nh + nkv:]
        kb, vb = k[where].transpose(0, 1), v[where].transpose(0, 1)  # (kv heads, p + 1, head_dim)
        outs.append(attend_reference(qb, kb, vb, torch.tensor(p), scale, window, softcap).to(qkv.dtype))
    return torch.stack(outs) if outs else qkv.new_empty((0, nh, hd))


def parse_shapes(text: str) -> tuple:
    """'auto/1/auto,2/2/8/dot/3' -> ((None, 1, None, False, None), (2, 2, 8, True, 3)): per shape
    splits/pages per step/warps, then optionally 'dot' (or 'sum') and the stages."""
    out = []
    for part in text.split(","):
        bits = [b.strip() for b in part.strip().split("/")]
        if not 3 <= len(bits) <= 5:
            raise NvkitError(f"A launch shape is splits/pages/warps[/dot|sum[/stages]] (e.g. auto/1/8 or 2/2/4/dot/3), "
                             f"not {part.strip()!r}.")
        dot = False
        if len(bits) >= 4:
            if bits[3] not in ("dot", "sum"):
                raise NvkitError(f"{bits[3]!r} in {part.strip()!r}: the fourth part is 'dot' or 'sum'.")
            dot = bits[3] == "dot"
        vals = []
        for b in bits[:3] + bits[4:]:
            if b == "auto":
                vals.append(None)
            elif b.isdigit() and int(b) >= 1:
                vals.append(int(b))
            else:
                raise NvkitError(f"{b!r} in {part.strip()!r}: each number is a whole number ≥ 1 or 'auto'.")
        if vals[1] is None:
            raise NvkitError(f"pages per step is a number (1, 2, 4…), not 'auto', in {part.strip()!r}.")
        out.append((vals[0], vals[1], vals[2], dot, vals[3] if len(vals) > 3 else None))
    return tuple(out)


def main(argv=None) -> int:
    """``python -m nvkit.benchmarks.attention [--rows 64,256] [--shapes auto/1/auto,2/2/8/dot/3] [--csv F]``, or
    ``... --batch1 [--lengths 1024,8192,16384] [--shapes ...]`` for the batch-1 kernel."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nvkit.benchmarks.attention", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--batch1", action="store_true", help="the batch-1 kernel over a static cache (default: the "
                                                         "batched path's paged kernel)")
    p.add_argument("--rows", default="64,256", help="comma-separated row counts (the paged kernel)")
    p.add_argument("--lengths", default=",".join(map(str, BATCH1_LENGTHS)),
                   help="comma-separated positions attended over (--batch1)")
    p.add_argument("--cache", type=int, default=None, help="one cache size for every length (--batch1; default: "
                                                            "each length's size class)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=None, help="calls timed (default 50; --batch1: 20 graph cycles)")
    p.add_argument("--shapes", default=None, help="splits/pages/warps[/dot|sum[/stages]],... (default: the built-in "
                                                  "list; with --batch1 the second number is blocks of 32 positions)")
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    try:
        if a.batch1:
            lengths = tuple(int(x) for x in a.lengths.split(",") if x.strip())
            df = batch1(model=a.model, lengths=lengths, repeats=a.repeats or 20, cache=a.cache,
                        shapes=parse_shapes(a.shapes) if a.shapes else BATCH1_SHAPES)
        else:
            rows = tuple(int(x) for x in a.rows.split(",") if x.strip())
            df = paged(model=a.model, rows=rows, new_tokens=a.new_tokens, repeats=a.repeats or 50,
                       shapes=parse_shapes(a.shapes) if a.shapes else SHAPES)
    except (NvkitError, ValueError) as e:
        print(f"NvkitError: {e}")
        return 2
    at = df.attrs
    if a.batch1:
        print(f"batch-1 decode attention · {at['model']} (heads {at['heads']}, {at['layers']} layers) · "
              f"{at['gpu']} ({at['sms']} SMs) · {at['repeats']} calls")
    else:
        print(f"paged decode attention · {at['model']} (heads {at['heads']}, {at['layers']} layers) · "
              f"page {at['page']} · prompts {at['lo']}-{at['hi']} + {at['new_tokens'] // 2} · {at['gpu']} "
              f"({at['sms']} SMs) · {at['repeats']} calls")
    print(table_text(df.round(3)))
    if a.csv:
        df.to_csv(a.csv, index=False)
    return 1 if "note" in df.columns and df["note"].astype(str).str.startswith("wrong").any() else 0


if __name__ == "__main__":
    sys.exit(main())
