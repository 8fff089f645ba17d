"""The batched path's paged decode attention, timed for several launch shapes of its kernel in one
process (``python -m nvkit.benchmarks.attention``; on a GPU machine).

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

The references in plain torch (``paged_attend_rope_reference`` and the two it is built from) live
here, not in the kernels' modules: this benchmark checks every shape against them, and
tests/generate/kernels/ check the kernels against them too.
"""

from __future__ import annotations

import os
import random
import sys

from ..checks import positive_int, whole_number
from ..errors import NvkitError, require
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


def _shape_name(shape) -> str:
    splits, pages, warps, dot, stages = shape
    if shape == SHAPES[0]:
        return "default"
    return (f"splits {splits if splits is not None else 'auto'} · {pages} page{'s' if pages > 1 else ''}/step"
            f" · warps {warps if warps is not None else 'default'}{' · tl.dot' if dot else ''}"
            f"{f' · {stages} stages' if stages is not None else ''}")


def paged(model: str = "qwen3-0.6b", rows=(64, 256), lo: int = 16, hi: int = 512, new_tokens: int = 128,
          shapes=SHAPES, repeats: int = 50, seed: int = 0, device: str = "cuda"):
    """A DataFrame, one row per (rows, launch shape): see the module docstring. ``model``: a shape
    name of ``nvkit.demo.SHAPES`` (its attention layout and layer count; random values)."""
    import pandas as pd
    import torch

    from ..demo import SHAPES as MODEL_SHAPES
    from ..demo import shaped_config
    from ..generate.kernels import paged_attention as pa
    from ..generate.fast.paged_cache import PAGE
    from ..generate.fast.schedule import pages_for
    from ..memory.estimate import attention_dims

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
    require(device in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu', not {device!r}.")
    if device == "cuda" and not torch.cuda.is_available():
        raise NvkitError("The attention benchmark times a Triton kernel on a CUDA GPU; none is visible here "
                         "(device='cpu' with TRITON_INTERPRET=1 checks the benchmark itself).")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise NvkitError("device='cpu' runs the kernel in Triton's interpreter: start Python with TRITON_INTERPRET=1.")

    cfg = shaped_config(model.lower())
    nh, nkv, hd = attention_dims(cfg)
    layers = int(cfg.get_text_config().num_hidden_layers)
    dev = torch.device(device)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
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
        base_err = (call(SHAPES[0]).float() - ref).abs().max().item()
        bound = max(TOLERANCE, 4 * base_err)
        for shape in shapes:
            row = {"rows": n, "shape": _shape_name(shape), "positions": sum(lengths), "kv_mib": read / 2**20}
            try:
                got = call(shape)  # compiles the kernel for this shape
                err = (got.float() - ref).abs().max().item()
                row["max_err"] = err
                if not err <= bound:
                    row["note"] = (f"wrong: {err:.3g} from the fp32 reference, where the default launch is "
                                   f"{base_err:.3g} from it")
                    out.append(row)
                    continue
                us = _time_us(lambda: call(shape), repeats, dev)
                row.update(us_per_call=us, ms_per_step=us * layers / 1000, read_gb_s=read / (us * 1e-6) / 1e9)
            except Exception as e:  # noqa: BLE001 - a shape the GPU cannot run is a row that says so
                row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            out.append(row)
        del k, v, qkv
    df = pd.DataFrame(out)
    cuda = dev.type == "cuda"
    df.attrs.update(model=model, layers=layers, heads=(nh, nkv, hd), page=PAGE,
                    gpu=torch.cuda.get_device_name(dev) if cuda else "cpu (Triton's interpreter)",
                    sms=torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 0,
                    new_tokens=new_tokens, lo=lo, hi=hi, repeats=repeats)
    return df


def _time_us(fn, repeats: int, dev) -> float:
    """Microseconds per call of ``fn`` over ``repeats`` calls (CUDA events on a GPU)."""
    import time

    import torch
    if dev.type != "cuda":
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t) * 1e6 / repeats
    torch.cuda.synchronize(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


# --- the kernels' references in plain torch (fp32) ---------------------------------------------
# What the benchmark checks every launch shape against; tests/generate/kernels/ check the attention
# kernels against the same functions (the reference of ``decode_attention_rope`` is there).

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
    """``python -m nvkit.benchmarks.attention [--rows 64,256] [--shapes auto/1/auto,2/2/8/dot/3] [--csv F]``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nvkit.benchmarks.attention", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--rows", default="64,256", help="comma-separated row counts")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--shapes", default=None, help="splits/pages/warps[/dot|sum[/stages]],... (default: the built-in list)")
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    try:
        rows = tuple(int(x) for x in a.rows.split(",") if x.strip())
        df = paged(model=a.model, rows=rows, new_tokens=a.new_tokens, repeats=a.repeats,
                   shapes=parse_shapes(a.shapes) if a.shapes else SHAPES)
    except (NvkitError, ValueError) as e:
        print(f"NvkitError: {e}")
        return 2
    at = df.attrs
    print(f"paged decode attention · {at['model']} (heads {at['heads']}, {at['layers']} layers) · page {at['page']} · "
          f"prompts {at['lo']}-{at['hi']} + {at['new_tokens'] // 2} · {at['gpu']} ({at['sms']} SMs) · {at['repeats']} calls")
    print(table_text(df.round(3)))
    if a.csv:
        df.to_csv(a.csv, index=False)
    return 1 if "note" in df.columns and df["note"].astype(str).str.startswith("wrong").any() else 0


if __name__ == "__main__":
    sys.exit(main())
