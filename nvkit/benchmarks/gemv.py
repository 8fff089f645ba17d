"""A batch-1 decoder layer's projections as the uncompiled step runs them now (nvkit's norm and
activation kernels beside cuBLAS's products) against ``kernels.gemv``'s fused forms, timed in one
process (``python -m nvkit.benchmarks.gemv``; on a GPU machine).

Per model shape (random weights of its published layout) and per projection, one row each:

- ``now``: the kernels the uncompiled step launches for it (q/k/v: the sum and norm, then the
  product; o: the product; gate/up: the sum and norm, the product, the activation; down: the
  product; and once a token the LM head: the sum and final norm, the product);
- ``cuBLAS``: the product alone (``F.linear``), the bandwidth cuBLAS reaches on that shape;
- ``fused``: ``gemv``'s one kernel for the same work with its automatic launch, ``fused best``:
  the fastest of a few other launches (rows per program, inputs per step, warps), and ``fused pdl``
  (a Hopper GPU on): the automatic launch with Programmatic Dependent Launch, each call starting
  while the one before ends.

Why measured this way: a decode step replays its kernels from a CUDA graph, each reading weights
that are not in the L2 cache (the whole model streams through it every token). So each row is
timed as a CUDA graph that calls its kernels on enough copies of the weights to overflow the L2
cache, one copy after another, and the time per call is the graph's over the calls; the read rate
counts the weight bytes. Every fused launch is checked against the ``now`` kernels' output first.
``device="cpu"`` runs the same under Triton's interpreter (``TRITON_INTERPRET=1``), without graphs,
to check the benchmark itself; its times say nothing about a GPU.
"""

from __future__ import annotations

import sys

from ..checks import positive_int
from ..errors import NvkitError, require
from .kernel_timing import L2_OVERFLOW, graph_us, kernel_device
from .tables import table_text

#: the shapes timed by default: the three issue 38 sets its targets on
MODELS = ("qwen3-0.6b", "llama-3.2-1b", "qwen3-4b")
#: the other launches ``fused best`` picks from: (rows per program, inputs per step, warps)
LAUNCHES = ((2, 1024, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8),
            (32, 256, 8))
#: every launch ``--every`` times (rows per program, inputs per step, warps), to fit ``gemv_launch`` to
GRID = tuple((r, bk, w) for r in (1, 2, 4, 8, 16) for bk in (512, 1024, 2048) for w in (4, 8)
             if r * bk <= 16384) + ((16, 256, 4), (32, 256, 4), (32, 512, 8))
#: a layer's projections, then the LM head with the final norm before it (once a token: not in the layer sums)
LAYER_FORMS = ("qkv", "o", "gate_up", "down")
FORMS = LAYER_FORMS + ("head",)
#: kernels the uncompiled step launches for each (the sums are the next norm's: add_rms_norm's)
NOW_KERNELS = {"qkv": 2, "o": 1, "gate_up": 3, "down": 1, "head": 2}
TOLERANCE = 2e-2  # from the ``now`` kernels' output, bf16 values of O(1): a few ulps


def run(models=MODELS, repeats: int = 20, device: str = "cuda", seed: int = 0, launches=LAUNCHES, forms=FORMS,
        every: bool = False):
    """A DataFrame, one row per (model, projection, variant): see the module docstring.
    ``launches``: the (rows per program, inputs per step, warps) ``fused best`` picks from;
    ``forms``: some of ``FORMS``; ``every``: a row for each of ``launches`` (``GRID`` is the list
    ``--every`` times), each with PDL where the GPU has it, as the step launches them, instead of
    the fastest alone."""
    import pandas as pd
    import torch

    from ..demo import SHAPES, shaped_config
    require(isinstance(models, (list, tuple)) and models and all(isinstance(m, str) for m in models),
            f"models must be a list of shape names, e.g. ('qwen3-0.6b',), not {models!r}.")
    for m in models:
        require(m.lower() in SHAPES, f"Unknown shape {m!r}: one of {sorted(SHAPES)}.")
    positive_int("repeats", repeats)
    require(isinstance(forms, (list, tuple)) and forms and set(forms) <= set(FORMS),
            f"forms must be some of {FORMS}, not {forms!r}.")
    require(isinstance(launches, (list, tuple)) and all(isinstance(x, tuple) and len(x) == 3 for x in launches),
            f"launches must be a list of (rows per program, inputs per step, warps) tuples, not {launches!r}.")
    require(isinstance(every, bool), f"every must be True or False, not {every!r}.")
    from ..generate.kernels.gemv import sm_count
    dev = kernel_device(device, "GEMV")
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for model in models:
        cfg = shaped_config(model.lower()).get_text_config()
        for form in forms:
            rows += _form_rows(model, form, cfg, dev, dt, gen, repeats, launches, every)
    df = pd.DataFrame(rows)
    df.attrs.update(gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton's interpreter)",
                    repeats=repeats, sms=sm_count(dev))
    return df


def _dims(form: str, cfg) -> tuple[int, int]:
    """(output rows of the weight, inputs) of a projection of ``cfg``'s layers."""
    from ..memory.estimate import attention_dims
    nh, nkv, hd = attention_dims(cfg)
    hidden, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
    return {"qkv": ((nh + 2 * nkv) * hd, hidden), "o": (hidden, nh * hd), "gate_up": (2 * inter, hidden),
            "down": (hidden, inter), "head": (int(cfg.vocab_size), hidden)}[form]


def _form_rows(model, form, cfg, dev, dt, gen, repeats, launches, every=False) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from ..generate.kernels.add_rms_norm import add_rms_norm
    from ..generate.kernels.common import pdl_why
    from ..generate.kernels.gemv import gemv, gemv_launch, sm_count
    from ..generate.kernels.silu_mul import silu_mul
    rows_w, k = _dims(form, cfg)
    n = rows_w // 2 if form == "gate_up" else rows_w
    nbytes = rows_w * k * torch.finfo(dt).bits // 8
    copies = max(1, -(-L2_OVERFLOW // nbytes)) if dev.type == "cuda" else 1
    ws = [(torch.randn((rows_w, k), generator=gen) / k ** 0.5).to(dev, dt) for _ in range(copies)]
    x = torch.randn(k, generator=gen).to(dev, dt)
    res = torch.randn((1, n), generator=gen).to(dev, dt)
    nw = (torch.rand(k, generator=gen) + 0.5).to(dev, dt)
    norm = form in ("qkv", "gate_up", "head")
    eps = float(getattr(cfg, "rms_norm_eps", 1e-6))

    zeros = torch.zeros((1, k), device=dev, dtype=dt)

    def now(w):
        # the uncompiled step's kernels for this projection; its residual sum is the next norm's
        # (add_rms_norm's), so the o and down products are the product alone
        xin = add_rms_norm(zeros, x.view(1, -1), nw, eps)[1] if norm else x.view(1, -1)
        y = F.linear(xin, w)
        return silu_mul(y, "silu") if form == "gate_up" else y

    def fused(w, launch=None, pdl=False):
        bn, bk, warps = launch or (None, None, None)
        return gemv(x, w, norm=nw if norm else None, eps=eps, glu=form == "gate_up",
                    residual=res if form in ("o", "down") else None, block_n=bn, block_k=bk, num_warps=warps,
                    pdl=pdl)

    ref = now(ws[0]).float()
    if form in ("o", "down"):
        ref = ref + res.float()
    label = dict(model=model, form=form, n=n, k=k, weight_mib=nbytes / 2**20)
    out = [dict(label, variant="now", kernels=NOW_KERNELS[form],
                us_per_call=graph_us(now, ws, repeats, dev)),
           dict(label, variant="cuBLAS", kernels=1, us_per_call=graph_us(lambda w: F.linear(x.view(1, -1), w), ws,
                                                                          repeats, dev))]
    auto = gemv_launch(n, k, sm_count(dev))
    pdl = every and pdl_why(dev) is None  # every launch as the step launches it
    best = None
    for launch in (None,) + tuple(l for l in launches if every or l != auto):
        if launch is not None and (launch[0] * launch[1] > 4 * 8192 or launch[1] > 2 * max(16, 1 << (k - 1).bit_length())):
            continue  # more than a program can hold, or far more inputs per step than there are
        try:
            err = (fused(ws[0], launch, pdl).float() - ref).abs().max().item()
        except Exception as e:  # noqa: BLE001 - a launch the GPU cannot run is a row that says so
            out.append(dict(label, variant=f"fused {launch}", note=f"failed: {type(e).__name__}"))
            continue
        if not err <= TOLERANCE * (1 + ref.abs().max().item()):
            out.append(dict(label, variant=f"fused {launch or auto}", max_err=err, note="wrong"))
            continue
        us = graph_us(lambda w, launch=launch: fused(w, launch, pdl), ws, repeats, dev)
        row = dict(label, variant="fused" if launch is None else launch_variant(*launch),
                   kernels=1, us_per_call=us, max_err=err, pdl=pdl)
        if launch is None:
            row["variant"] = f"fused ({auto[0]}x{auto[1]} w{auto[2]})"
            out.append(row)
        elif every:
            out.append(row)
        elif best is None or us < best["us_per_call"]:
            best = row
    if best is not None:
        best["variant"] = best["variant"].replace("fused", "fused best", 1)
        out.append(best)
    if pdl_why(dev) is None and not every:  # each call launched while the one before ends, its first weights loaded early
        err = (fused(ws[0], pdl=True).float() - ref).abs().max().item()
        out.append(dict(label, variant=f"fused pdl ({auto[0]}x{auto[1]} w{auto[2]})", kernels=1, max_err=err,
                        us_per_call=graph_us(lambda w: fused(w, pdl=True), ws, repeats, dev),
                        **({} if err <= TOLERANCE * (1 + ref.abs().max().item()) else {"note": "wrong"})))
    for r in out:
        if r.get("us_per_call"):
            r["weight_gb_s"] = nbytes / (r["us_per_call"] * 1e-6) / 1e9
    return out


def dev_sms(df) -> int:
    """The SM count of the GPU a ``run`` table was measured on (1 in the interpreter)."""
    return int(df.attrs.get("sms", 1))


def layer_summary(df):
    """Per model: a layer's four projections as the step runs them now against the fused forms
    (each form's faster fused launch), µs per layer and kernels."""
    import pandas as pd
    out = []
    for model, d in df.groupby("model", sort=False):
        d = d[d.form.isin(LAYER_FORMS)]
        now = d[d.variant == "now"]
        fused = d[d.variant.str.startswith("fused") & d.us_per_call.notna()] if "us_per_call" in d else d[:0]
        best = fused.groupby("form").us_per_call.min()
        out.append(dict(model=model, now_us=now.us_per_call.sum(), now_kernels=int(now.kernels.sum()),
                        fused_us=best.sum() if len(best) == len(now) else None, fused_kernels=len(best)))
    return pd.DataFrame(out)


#: the launch rules ``fit`` tries: inputs per step up to ``cap`` (``long_cap`` for inputs of
#: ``kernels.gemv.LONG_K`` or more), rows per program for about ``per_sm`` programs per SM, 8 warps
#: for tiles of more than ``wide`` weights (4 below)
RULES = tuple(dict(cap=cap, per_sm=c, wide=w, long_cap=lc) for cap in (512, 1024, 2048) for c in (1, 2, 4, 8, 16)
              for w in (2048, 4096, 8192, 1 << 30) for lc in (512, 1024, 2048) if lc >= cap)


def rule_launch(n: int, k: int, sms: int, cap: int, per_sm: int, wide: int,
                long_cap: int | None = None) -> tuple[int, int, int]:
    """The (rows per program, inputs per step, warps) one of ``RULES`` gives ``n`` outputs over
    ``k`` inputs on ``sms`` SMs: ``kernels.gemv.gemv_launch`` with that rule's values (``long_cap``
    None: ``cap``)."""
    from ..generate.kernels.gemv import gemv_launch
    return gemv_launch(n, k, sms, cap=cap, per_sm=per_sm, wide=wide, long_cap=long_cap or cap)


def launch_variant(bn: int, bk: int, warps: int) -> str:
    """The ``variant`` of a ``run(every=True)`` row timed at this launch."""
    return f"fused {bn}x{bk} w{warps}"


def timed_launches(df):
    """A ``run(every=True)`` table's rows of timed launches (``launch_variant``'s), each form's
    automatic launch and the failed or wrong ones left out."""
    return df[df.variant.str.fullmatch(r"fused \d+x\d+ w\d+") & df.us_per_call.notna()]


def fit(df, sms: int):
    """The rule of ``RULES`` whose launches give the least µs over the table's forms, from a
    ``run(every=True)`` table (one row per form and launch); a DataFrame of the rules that have
    a timed launch for every form, best first: the rule, its total and its worst form's share
    over that form's fastest launch."""
    import pandas as pd
    timed = timed_launches(df)
    us = {(r.model, r.form, r.variant): r.us_per_call for r in timed.itertuples()}
    best = timed.groupby(["model", "form"]).us_per_call.min()
    dims = {(r.model, r.form): (int(r.n), int(r.k)) for r in timed.itertuples()}
    out = []
    for rule in RULES:
        got = []
        for (model, form), (n, k) in dims.items():
            got.append((us.get((model, form, launch_variant(*rule_launch(n, k, sms, **rule)))), best[(model, form)]))
        if all(t is not None for t, _ in got):
            out.append(dict(rule, total_us=sum(t for t, _ in got), worst=max(t / b for t, b in got)))
    return (pd.DataFrame(out).sort_values(["total_us", "worst"], kind="stable").reset_index(drop=True) if out
            else pd.DataFrame())


def main(argv=None) -> int:
    """``python -m nvkit.benchmarks.gemv [--models qwen3-0.6b,qwen3-4b] [--repeats N] [--csv F]``;
    ``--fit A.csv,B.csv --sms N`` ranks ``RULES`` over ``--every`` tables saved before (several
    models' at once), on no GPU."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m nvkit.benchmarks.gemv", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--every", action="store_true", help="time every launch of GRID (with PDL where the GPU has it), "
                                                        "a row each")
    p.add_argument("--csv", default=None)
    p.add_argument("--fit", default=None, metavar="CSV,...",
                   help="rank the launch rules over these --every tables (no GPU needed); with --sms")
    p.add_argument("--sms", type=int, default=None, help="the SM count of the GPU the --fit tables were timed on")
    a = p.parse_args(argv)
    if a.fit is not None:
        return _fit_saved(a.fit, a.sms)
    try:
        df = run(models=tuple(m.strip() for m in a.models.split(",") if m.strip()), repeats=a.repeats,
                 **(dict(every=True, launches=GRID) if a.every else {}))
    except (NvkitError, ValueError) as e:
        print(f"NvkitError: {e}")
        return 2
    print(f"a layer's projections at batch 1 · {df.attrs['gpu']} · CUDA graphs of {df.attrs['repeats']} cycles "
          "over weights that overflow the L2 cache")
    print(table_text(df.round(3)))
    print(table_text(layer_summary(df).round(2)))
    if a.every and dev_sms(df):
        fitted = fit(df, dev_sms(df))
        if len(fitted):
            print(f"launch rules by total µs over these forms (fastest launches' sum "
                  f"{df[df.variant.str.startswith('fused ')].groupby(['model', 'form']).us_per_call.min().sum():.1f}):")
            print(table_text(fitted.head(8).round(3)))
    if a.csv:
        df.to_csv(a.csv, index=False)
    return 1 if "note" in df.columns and (df["note"] == "wrong").any() else 0


def _fit_saved(paths: str, sms: int | None) -> int:
    """``--fit``: the rules ranked over saved ``--every`` tables, and the fitted rule's launch for
    each of their forms beside that form's fastest."""
    import pandas as pd
    files = [f.strip() for f in paths.split(",") if f.strip()]
    if not files or sms is None or sms < 1:
        print("NvkitError: --fit takes one or more CSV files saved by --every --csv, and --sms the SM count of "
              "the GPU they were timed on (132 on an H100 or H200 SXM)")
        return 2
    try:
        df = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    except (OSError, ValueError) as e:
        print(f"NvkitError: cannot read the tables ({e})")
        return 2
    need = {"model", "form", "n", "k", "variant", "us_per_call"}
    fitted = fit(df, sms) if need <= set(df.columns) else pd.DataFrame()
    if not len(fitted):
        print(f"NvkitError: no rule has a timed launch for every form in {', '.join(files)} (tables from --every, "
              f"with the columns {', '.join(sorted(need))})")
        return 2
    print(f"launch rules by total µs over {df.model.nunique()} model(s)' forms, {sms} SMs:")
    print(table_text(fitted.head(8).round(3)))
    top = fitted.iloc[0]
    rule = {name: int(top[name]) for name in ("cap", "per_sm", "wide", "long_cap") if name in top}
    rows = []
    for (model, form), d in timed_launches(df).groupby(["model", "form"], sort=False):
        name = launch_variant(*rule_launch(int(d.n.iloc[0]), int(d.k.iloc[0]), sms, **rule))
        fastest = d.loc[d.us_per_call.idxmin()]
        rows.append(dict(model=model, form=form, rule=name.removeprefix("fused "),
                         rule_us=d[d.variant == name].us_per_call.iloc[0],
                         fastest=fastest.variant.removeprefix("fused "), fastest_us=fastest.us_per_call))
    print(table_text(pd.DataFrame(rows).round(2)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
