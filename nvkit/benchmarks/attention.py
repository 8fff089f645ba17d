"""The batched path's paged decode attention, timed for several launch shapes of its kernel in one
process (``python -m nvkit.benchmarks.attention``; on a GPU machine).

One call is one layer's attention of one decode step: every row at its own position over a pool of
scattered pages, as the batched fast path runs it. The rows' lengths are drawn like the decode
benchmark's mixed prompts (``lo``–``hi`` prompt tokens) plus half the new tokens, a step in the
middle of a request. Each shape is checked against the default launch's output before it is timed
(a shape that computes something else is marked, not ranked), then timed with CUDA events over
``repeats`` calls; the rows name the shape, µs per call, ms per decode step (× the model's layers),
the KV bytes the call must read and the rate it read them at.
"""

from __future__ import annotations

import random
import sys

from ..errors import NvkitError, require
from .tables import table_text

# (splits, pages per loop step, warps); None: the kernel's own choice (the product's launch)
SHAPES = ((None, 1, None), (None, 1, 2), (None, 1, 8), (None, 2, 4), (None, 2, 8), (None, 4, 8),
          (2, 1, None), (4, 1, None), (2, 2, 8), (4, 2, 8))
TOLERANCE = 2e-2  # bf16 outputs of O(1): a few ulps


def _shape_name(shape) -> str:
    splits, pages, warps = shape
    if shape == SHAPES[0]:
        return "default"
    return (f"splits {splits if splits is not None else 'auto'} · {pages} page{'s' if pages > 1 else ''}/step"
            f" · warps {warps if warps is not None else 'default'}")


def paged(model: str = "qwen3-0.6b", rows=(64, 256), lo: int = 16, hi: int = 512, new_tokens: int = 128,
          shapes=SHAPES, repeats: int = 50, seed: int = 0):
    """A DataFrame, one row per (rows, launch shape): see the module docstring. ``model``: a shape
    name of ``nvkit.demo.SHAPES`` (its attention layout and layer count; random values)."""
    import pandas as pd
    import torch

    from ..demo import SHAPES as MODEL_SHAPES
    from ..demo import shaped_config
    from ..generate import decode_attention as da
    from ..generate.fast.arena import PAGE
    from ..memory.estimate import attention_dims

    require(isinstance(model, str) and model.lower() in MODEL_SHAPES,
            f"model must be one of {sorted(MODEL_SHAPES)}, not {model!r}.")
    require(isinstance(rows, (list, tuple)) and rows and all(isinstance(n, int) and not isinstance(n, bool)
                                                             and 1 <= n <= 4096 for n in rows),
            f"rows must be a list of whole numbers from 1 to 4096, e.g. (64, 256), not {rows!r}.")
    for name, v in (("lo", lo), ("hi", hi), ("new_tokens", new_tokens), ("repeats", repeats)):
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{name} must be a whole number ≥ 1, not {v!r}.")
    require(lo <= hi, f"lo ({lo}) must not be more than hi ({hi}).")
    require(isinstance(shapes, (list, tuple)) and shapes and all(isinstance(s, tuple) and len(s) == 3 for s in shapes),
            "shapes must be a list of (splits, pages per step, warps) triples.")
    if not torch.cuda.is_available():
        raise NvkitError("The attention benchmark times a Triton kernel on a CUDA GPU; none is visible here.")

    cfg = shaped_config(model.lower())
    nh, nkv, hd = attention_dims(cfg)
    layers = int(cfg.get_text_config().num_hidden_layers)
    dev, dt = torch.device("cuda"), torch.bfloat16
    rng = random.Random(f"attention:{seed}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for n in rows:
        lengths = [rng.randint(lo, hi) + new_tokens // 2 for _ in range(n)]
        width = max(-(-x // PAGE) for x in lengths)
        need = sum(-(-x // PAGE) for x in lengths)
        pages = need + 1  # page 0: the scratch page the batched path keeps
        order = (torch.randperm(need, generator=gen) + 1).tolist()
        table = torch.zeros((n, width), dtype=torch.int32)
        at = 0
        for b, x in enumerate(lengths):
            k_pages = -(-x // PAGE)
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
            splits, per_step, warps = shape
            return da.paged_launch(qkv, qw, kw, cos, sin, k, v, pos, table, PAGE, hd ** -0.5, 1e-6,
                                   splits=splits, pages_per_step=per_step, num_warps=warps)

        ref = call(SHAPES[0]).float()
        for shape in shapes:
            row = {"rows": n, "shape": _shape_name(shape), "positions": sum(lengths), "kv_mib": read / 2**20}
            try:
                got = call(shape)  # compiles the kernel for this shape
                err = (got.float() - ref).abs().max().item()
                row["max_err"] = err
                if not err <= TOLERANCE:
                    row["note"] = f"wrong: differs from the default launch by {err:.3g}"
                    out.append(row)
                    continue
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(repeats):
                    call(shape)
                end.record()
                end.synchronize()
                us = start.elapsed_time(end) * 1000 / repeats
                row.update(us_per_call=us, ms_per_step=us * layers / 1000, read_gb_s=read / (us * 1e-6) / 1e9)
            except Exception as e:  # noqa: BLE001 - a shape the GPU cannot run is a row that says so
                row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            out.append(row)
        del k, v, qkv
    df = pd.DataFrame(out)
    df.attrs.update(model=model, layers=layers, heads=(nh, nkv, hd), page=PAGE, gpu=torch.cuda.get_device_name(),
                    sms=torch.cuda.get_device_properties(0).multi_processor_count, new_tokens=new_tokens,
                    lo=lo, hi=hi, repeats=repeats)
    return df


def parse_shapes(text: str) -> tuple:
    """'auto/1/auto,2/2/8' -> ((None, 1, None), (2, 2, 8)): splits/pages per step/warps per shape."""
    out = []
    for part in text.split(","):
        bits = part.strip().split("/")
        if len(bits) != 3:
            raise NvkitError(f"A launch shape is splits/pages/warps (e.g. auto/1/8), not {part.strip()!r}.")
        vals = []
        for b in bits:
            b = b.strip()
            if b == "auto":
                vals.append(None)
            elif b.isdigit() and int(b) >= 1:
                vals.append(int(b))
            else:
                raise NvkitError(f"{b!r} in {part.strip()!r}: each part is a whole number ≥ 1 or 'auto'.")
        if vals[1] is None:
            raise NvkitError(f"pages per step is a number (1, 2, 4…), not 'auto', in {part.strip()!r}.")
        out.append(tuple(vals))
    return tuple(out)


def main(argv=None) -> int:
    """``python -m nvkit.benchmarks.attention [--rows 64,256] [--shapes auto/1/auto,2/2/8] [--csv F]``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nvkit.benchmarks.attention", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--rows", default="64,256", help="comma-separated row counts")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--shapes", default=None, help="splits/pages/warps,... (default: the built-in list)")
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
