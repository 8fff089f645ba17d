"""``nvkit.bench``: attention backends and quantization side by side, in one process, on the same
prompts, against plain transformers with the same settings.

Each row loads the model (through ``nvkit.load``, the path users take), runs a 1-token generate
for the time to first token (prefill), then a ``new_tokens`` greedy generate for decode speed, and
compares the greedy tokens with the reference row: plain ``AutoModelForCausalLM`` + sdpa, no
quantization, same dtype (bf16 on a GPU from Ampere on). Prompts are random token ids from a fixed
seed, so random-weight shapes (``nvkit.demo.shaped("qwen3-0.6b")``) measure real speed offline.

The bench needs the memory: it unloads the current session first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from ..checks import positive_int, whole_number
from ..errors import NvkitError, require
from ..memory.usage import release, rss_bytes
from ..model import precision, session as model_session
from ..units import fmt_bytes

COLUMNS = ["row", "backend", "quantization", "ttft_ms", "prefill_tok_s", "decode_tok_s", "peak_memory_bytes",
           "peak_memory", "match_rate", "error"]


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


def _measure(model, input_ids, attention_mask, new_tokens: int, repeats: int, pad_id) -> dict:
    """TTFT (1-token generate), then a full greedy generate; medians over ``repeats``."""
    import torch
    dev = input_ids.device
    kw = dict(attention_mask=attention_mask, do_sample=False, pad_token_id=pad_id)
    with torch.inference_mode():
        model.generate(input_ids, max_new_tokens=2, min_new_tokens=2, **kw)  # warm-up (kernels, compile, caches)
        ttfts, totals, out = [], [], None
        for _ in range(repeats):
            _sync(dev)
            t0 = time.perf_counter()
            model.generate(input_ids, max_new_tokens=1, min_new_tokens=1, **kw)
            _sync(dev)
            ttfts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = model.generate(input_ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            _sync(dev)
            totals.append(time.perf_counter() - t0)
    ttft, total = statistics.median(ttfts), statistics.median(totals)
    b, p = input_ids.shape
    decode_s = total - ttft
    return {"ttft_ms": ttft * 1000, "prefill_tok_s": b * p / ttft,
            "decode_tok_s": b * (new_tokens - 1) / decode_s if decode_s > 0 and new_tokens > 1 else float("nan"),
            "tokens": out[:, p:].cpu()}


def _match(tokens, ref) -> float:
    if ref is None or tokens is None or tokens.shape != ref.shape:
        return float("nan")
    return float((tokens == ref).float().mean())


def bench(model: str = "demo", backends=("sdpa",), quantizations=(None,), prompt_len: int = 128,
          new_tokens: int = 64, batch_size: int = 1, decode: bool = False, lora: bool = False,
          repeats: int = 3, device_map=None, dtype="auto", seed: int = 0, **kwargs):
    """A pandas DataFrame, one row per backend × quantization plus the plain-transformers row.

    ``decode=True`` runs the fast-decode comparison (``nvkit.bench_decode``), ``lora=True`` the
    fine-tune one (``nvkit.bench_lora``); extra keywords go to those. Unavailable choices give a
    row with ``error`` set instead of stopping the run."""
    require(isinstance(decode, bool) and isinstance(lora, bool), "decode and lora must be True or False.")
    require(not (decode and lora), "Choose one: decode=True or lora=True.")
    whole_number("seed", seed, 0, 2**64 - 1)
    common = dict(model=model, prompt_len=prompt_len, new_tokens=new_tokens, batch_size=batch_size,
                  repeats=repeats, device_map=device_map)
    if decode:
        from . import decode as bench_decode
        return bench_decode.run(**common, **kwargs)
    if lora:
        from . import lora as bench_lora
        return bench_lora.run(**common, **kwargs)
    require(not kwargs, f"Unknown bench option(s): {', '.join(sorted(kwargs))}.")
    backends = _names("backends", backends)
    quantizations = _names("quantizations", quantizations, allow_none=True)
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
        r = {"row": label, "backend": backend, "quantization": quant or "none", "ttft_ms": float("nan"),
             "prefill_tok_s": float("nan"), "decode_tok_s": float("nan"), "peak_memory_bytes": None,
             "peak_memory": "", "match_rate": float("nan"), "error": ""}
        try:
            m = fn()
            d = m.get_input_embeddings().weight.device
            res = _measure(m, ids.to(d), mask.to(d), new_tokens, repeats, pad)
            toks = res.pop("tokens")
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


def cli_main(argv) -> int:
    """``nvkit bench [MODEL] --backends sdpa,eager --quant none,nf4 ... [--json]``."""
    p = argparse.ArgumentParser(prog="nvkit bench", description="attention backends × quantization, side by side")
    p.add_argument("model", nargs="?", default="demo", help="'demo', a local directory, a Hub id, or shape:qwen3-0.6b")
    p.add_argument("--backends", default="sdpa", help="comma-separated, e.g. sdpa,eager,flash_attention_4")
    p.add_argument("--quant", default="none", help="comma-separated, e.g. none,nf4,int8")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device-map", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--decode", action="store_true", help="fast decode path vs plain generate (nvkit.bench_decode)")
    p.add_argument("--paths", default=None, help="with --decode: comma-separated paths, e.g. fast,fast+triton "
                                                 "(python -m nvkit.bench_decode --help lists them)")
    p.add_argument("--lora", action="store_true", help="LoRA fine-tune step timings (nvkit.bench_lora)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    try:
        a = p.parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0)
    model = a.model
    if model.startswith("shape:"):
        from ..demo import shaped
        model = shaped(model.split(":", 1)[1])
    quants = [None if q.strip().lower() in ("none", "") else q.strip() for q in a.quant.split(",")]
    kw = dict(prompt_len=a.prompt_len, new_tokens=a.new_tokens, batch_size=a.batch_size, repeats=a.repeats,
              device_map=a.device_map)
    if a.paths is not None and not a.decode:
        print("nvkit bench: --paths chooses decode paths; add --decode (or leave --paths out).", file=sys.stderr)
        return 2
    if a.decode and a.paths is not None:
        kw["paths"] = [x.strip() for x in a.paths.split(",") if x.strip()]
    if a.decode or a.lora:
        df = bench(model, decode=a.decode, lora=a.lora, **kw)
    else:
        df = bench(model, backends=[b.strip() for b in a.backends.split(",") if b.strip()], quantizations=quants,
                   dtype=a.dtype, **kw)
    if a.json:
        print(df.to_json(orient="records", indent=2))
    else:
        import pandas as pd
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(df.drop(columns=["peak_memory_bytes"], errors="ignore").to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))
