"""``nvkit.bench``: attention backends and quantization side by side, in one process, on the same
prompts, against plain transformers with the same settings.

Each row loads the model (through ``nvkit.load``, the path users take), runs a greedy generate of
exactly ``new_tokens`` tokens (``min_new_tokens``: EOS cannot end it early) and times, inside that
one run, the first token (prefill: ``ttft_ms``, ``prefill_tok_s``) and the tokens after it
(``decode_tok_s``); ``tokens`` is what the run produced. It compares the greedy tokens with the
reference row: plain ``AutoModelForCausalLM`` + sdpa, no quantization, same dtype (bf16 on a GPU
from Ampere on). Prompts are random token ids from a fixed seed, so random-weight shapes
(``nvkit.demo.shaped("qwen3-0.6b")``) measure real speed offline. A rate that cannot be measured
stays empty and ``note`` says why; a row that failed says why in ``error``.

The bench needs the memory: it unloads the current session first.
"""

from __future__ import annotations

import argparse
import statistics
import os
import sys
import time

from ..checks import positive_int, whole_number
from ..errors import NvkitError, require
from ..memory.usage import release, rss_bytes
from ..model import precision, session as model_session
from ..units import fmt_bytes
from .tables import table_text

COLUMNS = ["row", "backend", "quantization", "tokens", "ttft_ms", "prefill_tok_s", "decode_tok_s",
           "peak_memory_bytes", "peak_memory", "match_rate", "error", "note"]


def _names(name, values, allow_none=False) -> list:
    if isinstance(values, str) or values is None:
        values = [values]
    require(isinstance(values, (list, tuple)) and len(values) > 0, f"{name} must be a non-empty list, not {values!r}.")
    for v in values:
        ok = isinstance(v, str) and v.strip() != "" or (allow_none and v is None)
        require(ok, f"{name}: each entry must be a name{' or None' if allow_none else ''}, not {v!r}.")
    return list(values)


def _sync(device):
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)


def _peak_reset(device):
    if device.type == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device, rss0: int) -> int:
    if device.type == "cuda":
        import torch
        return int(torch.cuda.max_memory_allocated(device))
    return max(0, rss_bytes() - rss0)  # CPU: growth of the process over the row (no allocator peak)


class _Clock:
    """A ``generate`` streamer that only notes when the first new token reached the host.
    transformers puts the prompt first, then each step's tokens after copying them to the CPU (a
    device sync), so the second put is the end of the prefill and its first token."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self):
        pass


def _measure(model, input_ids, attention_mask, new_tokens: int, repeats: int, pad_id) -> dict:
    """Greedy generates of exactly ``new_tokens`` tokens (EOS held back by ``min_new_tokens``): the
    time to the first token and the rate of the tokens after it, both from the same run (two runs
    timed apart could give a decode time below zero on a noisy machine); medians over ``repeats``."""
    import torch
    dev = input_ids.device
    kw = dict(attention_mask=attention_mask, do_sample=False, pad_token_id=pad_id,
              max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    b, p = input_ids.shape
    with torch.inference_mode():
        model.generate(input_ids, **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up (kernels, compile, caches)
        ttfts, decodes, out = [], [], None
        for _ in range(repeats):
            clock = _Clock()
            _sync(dev)
            t0 = time.perf_counter()
            out = model.generate(input_ids, streamer=clock, **kw)
            _sync(dev)
            t1 = time.perf_counter()
            ttfts.append((clock.first or t1) - t0)
            decodes.append(t1 - clock.first if clock.first is not None else 0.0)
    produced = int(out.shape[1] - p)  # per prompt; every row runs the same number of steps
    ttft, decode_s = statistics.median(ttfts), statistics.median(decodes)
    r = {"tokens": b * produced, "ttft_ms": ttft * 1000, "prefill_tok_s": b * p / ttft if ttft > 0 else float("nan"),
         "decode_tok_s": float("nan"), "note": "", "new": out[:, p:].cpu()}
    if produced != new_tokens:
        r["note"] = f"produced {produced} of {new_tokens} tokens per prompt"
    if produced < 2:
        r["note"] = (r["note"] + "; " if r["note"] else "") + "no token after the first: no decode rate"
    elif decode_s <= 0:
        r["note"] = (r["note"] + "; " if r["note"] else "") + "decode took no measurable time: no decode rate"
    else:
        r["decode_tok_s"] = b * (produced - 1) / decode_s
    return r


def _match(tokens, ref) -> float:
    if ref is None or tokens is None or tokens.shape != ref.shape:
        return float("nan")
    return float((tokens == ref).float().mean())


# The options each mode of ``bench`` takes (None = not given: the mode's own default). The decode
# and LoRA modes also take the keywords of their ``run`` (``nvkit.benchmarks.decode``, ``nvkit.benchmarks.lora``).
_SHARED = {"backends": ("compare",), "quantizations": ("compare",), "device_map": ("compare",),
           "prompt_len": ("compare", "decode"), "new_tokens": ("compare", "decode"), "repeats": ("compare", "decode"),
           "dtype": ("compare", "decode"), "seed": ("compare", "decode"), "batch_size": ("compare", "lora")}
MODES = ("compare", "decode", "lora")
_MODE_NAMES = {"compare": "the backend × quantization comparison", "decode": "the decode comparison (decode=True)",
               "lora": "the LoRA comparison (lora=True)"}


def _run_keywords(mode: str) -> set:
    if mode == "compare":
        return set()
    import inspect
    from . import decode as bench_decode, lora as bench_lora
    fn = bench_decode.run if mode == "decode" else bench_lora.run
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"model"}


def check_options(mode: str, names, spell=None, mode_names=None) -> None:
    """Raise NvkitError for the first option in ``names`` that ``mode`` does not take, saying which
    mode it belongs to. ``spell`` / ``mode_names``: how the caller's user writes options and modes
    (the CLI's ``--prompt-len`` and ``--lora``)."""
    spell = spell or (lambda n: n)
    mode_names = mode_names or _MODE_NAMES
    for n in names:
        ok = mode in _SHARED[n] if n in _SHARED else n in _run_keywords(mode)
        if ok:
            continue
        home = [m for m in MODES if (m in _SHARED[n] if n in _SHARED else n in _run_keywords(m))]
        if not home:
            raise NvkitError(f"Unknown bench option {spell(n)}.")
        raise NvkitError(f"{spell(n)} does not apply to {mode_names[mode]}: it belongs to "
                         f"{' and '.join(mode_names[m] for m in home)}.")


def bench(model: str = "demo", backends=None, quantizations=None, prompt_len: int | None = None,
          new_tokens: int | None = None, batch_size: int | None = None, decode: bool = False, lora: bool = False,
          repeats: int | None = None, device_map=None, dtype=None, seed: int | None = None, **kwargs):
    """A pandas DataFrame, one row per backend × quantization plus the plain-transformers row
    (defaults: sdpa, no quantization, 128-token prompts, 64 new tokens, batch 1, 3 repeats, dtype "auto").

    ``decode=True`` runs the fast-decode comparison (``nvkit.benchmarks.decode.run``: model, prompt_len,
    new_tokens, repeats, dtype, seed and its own keywords), ``lora=True`` the fine-tune one
    (``nvkit.benchmarks.lora.run``: model, batch_size and its own keywords). An option the chosen mode
    does not take raises NvkitError. Unavailable backends or quantizations give a row with
    ``error`` set instead of stopping the run."""
    require(isinstance(decode, bool) and isinstance(lora, bool), "decode and lora must be True or False.")
    require(not (decode and lora), "Choose one: decode=True or lora=True.")
    whole_number("seed", seed, 0, 2**64 - 1, allow_none=True)
    mode = "decode" if decode else "lora" if lora else "compare"
    given = {k: v for k, v in dict(backends=backends, quantizations=quantizations, prompt_len=prompt_len,
                                   new_tokens=new_tokens, batch_size=batch_size, repeats=repeats,
                                   device_map=device_map, dtype=dtype, seed=seed).items() if v is not None}
    check_options(mode, [*given, *kwargs])
    if decode:
        from . import decode as bench_decode
        return bench_decode.run(model=model, **given, **kwargs)
    if lora:
        from . import lora as bench_lora
        return bench_lora.run(model=model, **given, **kwargs)
    backends = _names("backends", ("sdpa",) if backends is None else backends)
    quantizations = _names("quantizations", quantizations, allow_none=True)
    prompt_len, new_tokens = given.get("prompt_len", 128), given.get("new_tokens", 64)
    batch_size, repeats, seed, dtype = given.get("batch_size", 1), given.get("repeats", 3), given.get("seed", 0), dtype or "auto"
    for name, v in (("prompt_len", prompt_len), ("new_tokens", new_tokens), ("batch_size", batch_size), ("repeats", repeats)):
        positive_int(name, v)

    import pandas as pd
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    _session = model_session
    path, _ = _session.resolve_model(model)
    dm, device_type = _session.resolve_device_map(device_map)
    capability = torch.cuda.get_device_capability(0) if device_type == "cuda" else None
    torch_dtype = precision.resolve_dtype(dtype, device_type, capability)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise NvkitError(f"nvkit.bench could not read the config of {model!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}. "
                         "Give 'demo', a local checkpoint directory, or a shape from nvkit.demo.shaped(...).") from e
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    require(vocab > 0, f"{path}: its config has no vocab_size, so nvkit can't make prompts for it.")
    pad = getattr(config, "pad_token_id", None)
    pad = pad if pad is not None else getattr(config, "eos_token_id", None)
    if isinstance(pad, list):
        pad = pad[0]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch_size, prompt_len), generator=gen)
    mask = torch.ones_like(ids)

    cur = _session.session(required=False)
    if cur is not None and cur.model is not None:
        print(f"nvkit.bench: unloading {cur.model_id} to measure on an empty device.")
        cur.unload()

    rows, ref_tokens = [], None

    def row(label, backend, quant, fn):
        nonlocal ref_tokens
        release()
        dev = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        _peak_reset(dev)
        rss0 = rss_bytes()
        r = {"row": label, "backend": backend, "quantization": quant or "none", "tokens": 0, "ttft_ms": float("nan"),
             "prefill_tok_s": float("nan"), "decode_tok_s": float("nan"), "peak_memory_bytes": None,
             "peak_memory": "", "match_rate": float("nan"), "error": "", "note": ""}
        try:
            m = fn()
            d = m.get_input_embeddings().weight.device
            res = _measure(m, ids.to(d), mask.to(d), new_tokens, repeats, pad)
            toks = res.pop("new")
            if ref_tokens is None:
                ref_tokens = toks
            r.update(res, match_rate=_match(toks, ref_tokens))
            r["peak_memory_bytes"] = _peak(dev, rss0)
            r["peak_memory"] = fmt_bytes(r["peak_memory_bytes"])
        except NvkitError as e:
            r["error"] = str(e).splitlines()[0]
        except torch.OutOfMemoryError as e:
            r["error"] = f"out of memory: {str(e).splitlines()[0]}"
        finally:
            s = _session.session(required=False)
            if s is not None and s.model is not None:
                s.unload()
            release()
        rows.append(r)

    def plain():
        # Reference: transformers alone, same dtype and placement, sdpa, no quantization.
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, device_map=dm, attn_implementation="sdpa")
        plain.model = m
        return m.eval()

    row("transformers (plain)", "sdpa", None, plain)
    plain.model = None
    for b in backends:
        for q in quantizations:
            label = f"nvkit {b}" + (f" + {q}" if q else "")
            row(label, b, q, lambda b=b, q=q: _session.load(path, dtype=dtype, device_map=device_map,
                                                           attn_implementation=b, quantization=q).model)
    return pd.DataFrame(rows, columns=COLUMNS)


def bench_chart(df):
    """A plotly bar chart of prefill and decode tokens/s per row (a plain Figure: shown once)."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    require(hasattr(df, "columns") and {"row", "prefill_tok_s", "decode_tok_s"} <= set(df.columns),
            "bench_chart takes the DataFrame nvkit.bench returned.")
    labels = [str(x) for x in df["row"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prefill tokens/s", "decode tokens/s"))
    fig.add_trace(go.Bar(x=labels, y=np.asarray(df["prefill_tok_s"], dtype="float64"), name="prefill"), 1, 1)
    fig.add_trace(go.Bar(x=labels, y=np.asarray(df["decode_tok_s"], dtype="float64"), name="decode"), 1, 2)
    fig.update_layout(showlegend=False, height=380, margin=dict(t=40, b=10), title="nvkit.bench")
    return fig


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


_CLI_MODES = {"compare": "the backend comparison (no --decode/--lora)", "decode": "--decode", "lora": "--lora"}
_SESSION_OPTIONS = ("phases", "session_dir", "csv", "plain", "static")


def _session_cli(a, chosen: str, options: dict, flags: dict) -> int:
    """``nvkit bench MODEL --session``: it takes only its own options (the others time other things)."""
    if chosen != "session":
        first = next(k for k in options if k in _SESSION_OPTIONS)
        raise NvkitError(f"{flags.get(first, first)} belongs to --session.")
    other = [k for k in options if k not in _SESSION_OPTIONS]
    if other:
        raise NvkitError(f"{flags.get(other[0], other[0])} does not apply to --session; it takes "
                         f"{', '.join(flags[k] for k in _SESSION_OPTIONS)}.")
    from . import session as bench_session
    model = a.model
    model = _model_path(model)
    # "none" on the command line is run()'s "" (no request on that path)
    paths = {k: ("" if v.strip().lower() == "none" else v) for k in ("plain", "static")
             if (v := getattr(a, k)) is not None}
    bench_session.run_phases(model=model, csv=a.csv, folder=a.session_dir, phases=tuple(a.phases or ("cold", "warm")),
                             **paths)
    return 0


def _model_path(model: str) -> str:
    """``shape:NAME`` built (or found) as a random-weight folder; any other name as given."""
    if model.startswith("shape:"):
        from .shapes import shape_folder
        return shape_folder(model.split(":", 1)[1])
    return model


_FAMILIES_OPTIONS = {"shapes": "shapes", "new_tokens": "new_tokens", "n_prompts": "n_prompts",
                     "batch_new_tokens": "list_tokens", "settle": "settle"}


def _families_cli(a, chosen: str, options: dict, flags: dict):
    """``nvkit bench --families``: its own options only; prints each family's row as it is done."""
    from . import families
    if chosen != "families":
        raise NvkitError(f"{'--shapes' if 'shapes' in options else '--settle'} belongs to --families.")
    other = [k for k in options if k not in _FAMILIES_OPTIONS]
    if other:
        raise NvkitError(f"{flags.get(other[0], other[0])} does not apply to --families; it takes "
                         f"{', '.join(flags[k] for k in _FAMILIES_OPTIONS)}.")
    if a.model != "demo":
        raise NvkitError("--families runs the shapes it names (--shapes), not a MODEL.")
    kw = {_FAMILIES_OPTIONS[k]: v for k, v in options.items()}
    shapes = kw.pop("shapes", families.FAMILIES)

    def show(row):
        if a.json:
            return
        if "error" in row:
            print(f"{row['family']}: failed: {row['error']}", flush=True)
            return
        share = f"{row['roofline']:.0%}" if row["roofline"] is not None else "n/a"
        rate = lambda v: f"{v:,.0f}" if v is not None else "n/a"  # noqa: E731
        print(f"{row['family']} ({row['model_type']}): batch 1 {row['batch1_path']} {rate(row['batch1_tok_s'])} tok/s "
              f"vs plain {rate(row['plain_tok_s'])} ({share} of the HBM roofline); list {row['list_path']} "
              f"{rate(row['list_tok_s'])} tok/s vs padded plain {rate(row['padded_plain_tok_s'])}"
              f"{'' if row['ok'] else ' · NOT HEALTHY: tokens short'}\n    batch 1: {row['batch1_detail']}\n"
              f"    list: {row['list_detail']}\n    host: {row['host_cpu'] or 'its CPU unnamed'} (plain's pace)",
              flush=True)
        if "list_settled_tok_s" in row:
            print(f"    settled: batch 1 {rate(row['batch1_settled_tok_s'])} tok/s "
                  f"({row['batch1_settled_detail']}); list {rate(row['list_settled_tok_s'])} tok/s, "
                  f"{row['list_settled_vs_plain']:.1f}× padded plain ({row['list_settled_detail']})", flush=True)
        elif "settled_note" in row:
            print(f"    settled: {row['settled_note']}", flush=True)

    def progress(text):  # on stderr, so --json's stdout stays the table alone
        print(f"[families] {text}", file=sys.stderr, flush=True)

    return families.run(shapes, on_row=show, on_step=progress, **kw)


def _profile_cli(a, chosen: str, options: dict, flags: dict) -> int:
    """``nvkit bench MODEL --decode --profile [--new-tokens N] [--prompt-len N] [--paths PATH]``, or
    a list's: ``... --profile --n-prompts N [--batch-new-tokens N] [--paths PATH]``."""
    from . import decode, decode_profile
    if chosen != "decode":
        raise NvkitError("--profile belongs to --decode.")
    if a.json:
        raise NvkitError("--json does not apply to --decode --profile: it prints its summary as text.")
    listed = "n_prompts" in options
    takes = ("n_prompts", "batch_new_tokens", "paths") if listed else ("new_tokens", "prompt_len", "paths")
    other = [k for k in options if k not in takes]
    if other:
        raise NvkitError(f"{flags.get(other[0], other[0])} does not apply to --decode --profile"
                         f"{' --n-prompts' if listed else ''}; it takes {', '.join(flags[k] for k in takes[:-1])} and "
                         f"{flags[takes[-1]]}.")
    paths = options.get("paths") or ["fast"]
    if len(paths) != 1 or decode.fast_options(paths[0]) is None:
        raise NvkitError(f"--paths takes one fast path for --decode --profile ('fast' or 'fast+OPT...'), not "
                         f"{','.join(paths)!r}.")
    if listed:
        n_prompts, n = options["n_prompts"], options.get("batch_new_tokens", 128)
        if n_prompts < 2:
            raise NvkitError(f"--n-prompts must be at least 2 for a list's profile, not {n_prompts}.")
        if n < 2:
            raise NvkitError(f"--batch-new-tokens must be at least 2 for a profile, not {n}.")
    else:
        n = options.get("new_tokens", 256)
        if not isinstance(n, int) or n < 2:
            raise NvkitError(f"--new-tokens must be at least 2 for a profile, not {n}.")
        prompt_len = options.get("prompt_len")
        if prompt_len is not None and prompt_len < 1:
            raise NvkitError(f"--prompt-len must be at least 1, not {prompt_len}.")
    model = a.model
    model = _model_path(model)
    if model == "demo":
        from ..demo import path as demo_path
        model = demo_path()
    if listed:
        print(decode_profile.profile_list(model, prompts=n_prompts, new_tokens=n, path=paths[0]).text())
    else:
        print(decode_profile.profile(model, new_tokens=n, prompt_len=prompt_len, path=paths[0]).text())
    return 0


def cli_main(argv) -> int:
    """``nvkit bench [MODEL] [--decode | --lora | --session] [options] [--json]``; see ``--help``."""
    p = argparse.ArgumentParser(
        prog="nvkit bench", description="Side by side, in one process: attention backends × quantization (default), "
        "nvkit's fast decode path vs plain generate (--decode), LoRA training speed and memory (--lora), "
        "generation as a notebook user meets it, cold, warm and after a restart (--session).",
        epilog="Each option names the modes it applies to; one that does not apply to the chosen mode is refused.")
    p.add_argument("model", nargs="?", default="demo",
                   help="'demo', a local directory, or shape:NAME (random weights of a real shape, e.g. "
                        "shape:qwen3-0.6b; see nvkit.demo.SHAPES); the default mode and --decode also take a Hub id")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--decode", action="store_true", help="fast decode path vs plain generate (nvkit.benchmarks.decode)")
    mode.add_argument("--lora", action="store_true", help="LoRA fine-tune variants (nvkit.benchmarks.lora)")
    mode.add_argument("--session", action="store_true", help="one model, the request sequence a notebook user makes, "
                                                             "in fresh processes: cold, warm, restart (nvkit.benchmarks.session)")
    mode.add_argument("--afternoon", action="store_true", help="one session through issue 39's afternoon: a first "
                                                               "short request, lists of many sizes, same-answer checks, "
                                                               "a fine-tune and compare, each against its target "
                                                               "(nvkit.benchmarks.afternoon)")
    mode.add_argument("--families", action="store_true", help="every model family on nvkit's default session: paths, "
                                                              "rates against plain generate, the HBM roofline "
                                                              "(nvkit.benchmarks.families)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    o = p.add_argument_group("options (in brackets the modes each applies to; 'default': the backend comparison, "
                             "without --decode or --lora)")
    o.add_argument("--backends", type=_csv, help="[default] comma-separated, e.g. sdpa,eager,flash_attention_4 (default sdpa)")
    o.add_argument("--quant", dest="quantizations", help="[default] comma-separated, e.g. none,nf4,int8 (default none)",
                   type=lambda t: [None if q.lower() == "none" else q for q in _csv(t)] or [None])
    o.add_argument("--device-map", dest="device_map", help="[default] e.g. cpu, cuda, auto")
    o.add_argument("--prompt-len", dest="prompt_len", type=int, help="[default, --decode] prompt tokens (also of --decode --profile)")
    o.add_argument("--new-tokens", dest="new_tokens", type=int, help="[default, --decode] tokens generated per prompt")
    o.add_argument("--repeats", type=int, help="[default, --decode] timed runs per row (the median is shown)")
    o.add_argument("--dtype", help="[default, --decode] e.g. auto, bfloat16, float32")
    o.add_argument("--batch-size", dest="batch_size", type=int, help="[default, --lora] prompts per batch / rows per step")
    o.add_argument("--paths", type=_csv, help="[--decode] comma-separated paths, e.g. fast,fast+split "
                                              "(python -m nvkit.benchmarks.decode --help lists them)")
    o.add_argument("--n-prompts", dest="n_prompts", type=int, help="[--decode] prompts of the batch group")
    o.add_argument("--batch-new-tokens", dest="batch_new_tokens", type=int, help="[--decode] new tokens per batch prompt")
    o.add_argument("--profile", action="store_true", help="[--decode] one batch-1 request on the prepared fast path, "
                                                          "per token: kernels, GPU busy time, bytes/s, share of "
                                                          "the HBM roofline (nvkit.benchmarks.decode_profile); "
                                                          "--paths names one variant, e.g. fast+eager+gemv; with "
                                                          "--n-prompts N a list's, per step, and its prefill")
    o.add_argument("--k-steps", dest="k_steps", type=int, help="[--decode] fast-path decode steps per graph replay")
    o.add_argument("--seq-len", dest="seq_len", type=int, help="[--lora] tokens per training row")
    o.add_argument("--steps", type=int, help="[--lora] timed training steps")
    o.add_argument("--warmup", type=int, help="[--lora] untimed steps first (compilation happens there)")
    o.add_argument("--r", type=int, help="[--lora] LoRA rank")
    o.add_argument("--learning-rate", dest="learning_rate", type=float, help="[--lora] AdamW learning rate")
    o.add_argument("--variants", type=_csv, help="[--lora] comma-separated subset of plain,nvkit,nvkit+liger,nvkit+gc")
    o.add_argument("--device", help="[--lora] cuda or cpu (default: cuda when there is one)")
    o.add_argument("--short-runs", dest="short_runs", action="store_true",
                   help="[--lora] wall time of whole 20- and 200-step runs, plain vs nvkit, compile cache cold and warm")
    fo = p.add_argument_group("--families options (besides --new-tokens, --n-prompts, --batch-new-tokens)")
    fo.add_argument("--shapes", type=_csv, help="[--families] comma-separated shapes (default: "
                                                "nvkit.benchmarks.families.FAMILIES)")
    fo.add_argument("--settle", action="store_true", help="[--families] each family's requests again once its session "
                                                          "has settled: the compiles it makes after decoding a while "
                                                          "brought forward, each kept only where it measures faster")
    so = p.add_argument_group("--session options")
    so.add_argument("--phases", type=_csv, help="[--session] some of cold, warm, restart (each in a process of its own; default cold,warm)")
    so.add_argument("--session-dir", dest="session_dir", help="[--session] the folder a cold and a later warm call share")
    so.add_argument("--csv", help="[--session] also write the table here")
    so.add_argument("--plain", help="[--session] the requests plain generate and fast=False really run, e.g. 100,200 "
                                    "(the default), all or none; the others are estimated from plain's rate")
    so.add_argument("--static", help="[--session] the requests static cache + compile runs: all (the default), none "
                                     "or e.g. 256,40")
    try:
        a = p.parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0)
    json_rows: list[str] = []

    def run() -> int:
        chosen = ("decode" if a.decode else "lora" if a.lora else "session" if a.session
                  else "families" if a.families else "afternoon" if a.afternoon else "compare")
        flags = {act.dest: act.option_strings[0] for act in p._actions if act.option_strings}
        options = {k: v for k, v in vars(a).items()
                   if k not in ("model", "decode", "lora", "session", "families", "afternoon", "json") and v is not None
                   and v is not False}
        try:
            if options.pop("profile", False):
                return _profile_cli(a, chosen, options, flags)
            if chosen == "families" or "shapes" in options or "settle" in options:
                df = _families_cli(a, chosen, options, flags)
                if a.json:
                    json_rows.append(df.to_json(orient="records", indent=2))
                return 0 if len(df) and bool(df["ok"].all()) else 1
            if chosen == "afternoon":
                if options:
                    first = next(iter(options))
                    raise NvkitError(f"{flags.get(first, first)} does not apply to --afternoon; it takes MODEL and --json.")
                from . import afternoon
                df = afternoon.run(_model_path(a.model), show=not a.json)
                if a.json:
                    json_rows.append(df.to_json(orient="records", indent=2))
                return 0 if (df["ok"] != False).all() else 1  # noqa: E712 - None: the target does not apply here
            if chosen == "session" or any(k in options for k in _SESSION_OPTIONS):
                return _session_cli(a, chosen, options, flags)
            if a.short_runs and not a.lora:
                raise NvkitError("--short-runs belongs to --lora.")
            options.pop("short_runs", None)
            check_options(chosen, options, spell=lambda n: flags.get(n, n), mode_names=_CLI_MODES)
            model = a.model
            model = _model_path(model)
            if a.decode and a.json:
                options["show"] = False  # its printed table would break the JSON
            if a.short_runs:
                from .lora import short_runs
                df = short_runs(model=model, **{k: v for k, v in options.items() if k in ("batch_size", "seq_len", "r")})
            else:
                df = bench(model, decode=a.decode, lora=a.lora, **options)
        except NvkitError as e:
            print(f"nvkit bench: {e}", file=sys.stderr)
            return 2
        bad = {}
        if a.lora and not a.short_runs:
            from .lora import untrained
            bad = untrained(df)
        if df.index.name is not None:  # the LoRA table is indexed by variant: keep it as a column
            df = df.reset_index()
        if a.json:
            json_rows.append(df.to_json(orient="records", indent=2))
        elif not a.decode:  # the decode benchmark prints its own table
            print(table_text(df.drop(columns=["peak_memory_bytes"], errors="ignore"), index=False, colwidth=60,
                             float_format=lambda x: f"{x:.2f}"))
        for v, why in bad.items():  # a speed of a run that did not train is no speed
            print(f"nvkit bench: {v} did not train: {why}", file=sys.stderr)
        return 1 if bad else 0

    if not a.json:
        return run()
    # with --json, stdout carries the JSON alone: anything else written there while the benchmark
    # runs goes to stderr, at the file-descriptor level, because a library's logger can hold the
    # original stdout (DeepSpeed announces its accelerator at import that way), and at Python's
    # level, for a caller whose sys.stdout is not file descriptor 1 (a test's capture, a notebook)
    import contextlib
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            code = run()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    for text in json_rows:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))
