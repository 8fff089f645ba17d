"""Decode benchmark: plain transformers against nvkit's paths, in one process, on the same prompts.

``run()`` (also ``nvkit.bench(..., decode=True)`` and ``nvkit bench --decode``) measures

- batch 1, one prompt: plain ``generate`` (dynamic cache), ``generate(cache_implementation="static")``
  (transformers compiles the decode step), nvkit's fast path (``nvkit.fast``);
- a batch of mixed-length prompts: left-padded ``generate``, transformers' ``generate_batch``
  (continuous batching), nvkit's batch path (``Session.generate(list)``);

and gives tokens/s, time to first token, peak PyTorch memory and the ratio to the plain path of
its group. Batch-1 rows give the decode rate (the tokens after the first, over the time after it;
``ttft_ms`` is the wait for the first); batch rows give all new tokens over the whole call.

Every timed run produces exactly the tokens it asks for, whatever the model's EOS: with
``min_new_tokens`` where the path honours it (plain and padded ``generate``, nvkit's fast path),
and with EOS set to an id the model cannot produce where it does not (continuous batching drops
that processor). ``tokens`` is what each run produced; ``note`` says so if that is not what was
asked. Each path runs once untimed first (compiles and captures are not what is measured; the
table says how long that warm-up took).

``repeats`` > 1 times every batch-1 path that many times, in alternation (path A, B, C, then C, B,
A, ...; the fast-path variants keep their captures side by side), and reports the median rate with
the spread between rounds. Why: on the H200 the same configuration ran measurably faster third
in a process than first, so a single pass confuses "which path" with "when".

"nvkit batched" in ``paths`` adds a grid of cells (``GRID``: 8, 64 and 256 prompts of 16–512
tokens × 128 and × 512 new tokens), each a group of its own: nvkit's batched fast path
(``Session.generate(list)``, every prompt decoding exactly its new tokens through
``min_new_tokens``) beside left-padded ``generate`` and continuous batching where ``paths``
names them, with all new tokens over the whole call and the timed call's peak memory.
"""

from __future__ import annotations

import random
import sys
import time

from ..checks import whole_number
from ..errors import NvkitError, error_summary, require
from ..generate.paths import CallbackStreamer
from ..generate.stats import GenerationStats
from .tables import table_text

SINGLE_PATHS = ("generate", "static+compile", "fast")
BATCH_PATHS = ("padded generate", "generate_batch", "nvkit batch")
# Variants of the fast path, to compare in one process before changing its defaults. Besides the
# names below, any "fast+OPT+OPT..." works, OPT one of: eager (no torch.compile: own capture of the
# eager forward), matmul (attention as two batched products: attention="matmul"), split (nvkit's
# split-cache decode attention kernel: attention="triton-split"), tfused (the same kernel also doing q/k
# norms, RoPE and the cache writes: attention="triton-fused"), pdl (Programmatic Dependent Launch
# between inductor's kernels: pdl=True, the default where torch can; nopdl turns it off), combo
# (inductor's combo_kernels: independent small kernels launched as one), regional (one decoder
# layer compiled for every layer: regional=True, the default), whole (the whole unrolled step
# compiled: regional=False), notune (no coordinate-descent tuning: tune=False), fold (an adapter's
# first product folded into the base one: lora_fold=True), gemv / nogemv (the uncompiled step's
# layers in six kernels, the default, or nine: gemv=True / False), experts (a mixture of experts'
# uncompiled steps over its own forward with nvkit's grouped experts kernel: experts=True), apart (an
# adapter's products apart from the weights, not merged into a copy: lora_merged=False), kN (N
# decode steps per graph replay). pdl, combo, regional, whole, notune, gemv and experts are
# ``StepVariant`` fields, not user options: the benchmark builds those decoders, users get the
# defaults.
# "model.generate": transformers' generate called directly, with the arguments nvkit's plain path
# passes, beside "generate" (nvkit's fast=False) in alternating rounds: what nvkit's plain path
# adds per token, measured where host-bound rates drift between calls.
OPTIONAL_PATHS = ("fast eager", "fast without pdl", "model.generate")
# The fast path with a LoRA adapter attached (PEFT, r=16 on every projection, random weights):
# what a session decodes at after a fine-tune, beside the plain "fast" row (at batch 1 merged into
# a copy where it fits); "fast lora+OPT..." takes the options above (e.g. "fast lora+apart": its
# products apart from the weights).
ADAPTER_PATHS = ("fast lora",)
_ALIASES = {"fast eager": "fast+eager", "fast without pdl": "fast+nopdl"}
# Many prompts of mixed length (16–512 tokens) at several sizes: nvkit's batched fast path beside
# left-padded generate and transformers' continuous batching, each cell a group of its own
# (``grid``: (prompts, new tokens) pairs). Asked for by naming "nvkit batched" in ``paths``.
BATCHED_PATHS = ("nvkit batched",)
GRID_PATHS = ("padded generate", "generate_batch", "nvkit batched")
GRID = ((8, 128), (8, 512), (64, 128), (64, 512), (256, 128), (256, 512))
MIXED_TOKENS = (16, 512)


# option -> (FastOptions field, value)
_FAST_OPTIONS = {"eager": ("compile", False), "matmul": ("attention", "matmul"),
                 "split": ("attention", "triton-split"), "tfused": ("attention", "triton-fused"), "pdl": ("pdl", True),
                 "nopdl": ("pdl", False), "combo": ("inductor", {"combo_kernels": True}),
                 "regional": ("regional", True), "whole": ("regional", False), "fold": ("lora_fold", True),
                 "notune": ("tune", False),
                 # the uncompiled batch-1 step's layers in six kernels (issue 38, the default):
                 # "fast+eager" against "fast+eager+nogemv" (the nine-kernel layers) measures them
                 "gemv": ("gemv", True), "nogemv": ("gemv", False),
                 # an adapter's products apart from the weights instead of merged into a copy
                 "apart": ("lora_merged", False),
                 # a mixture of experts' uncompiled steps with nvkit's grouped experts kernel
                 "experts": ("experts", True),
                 # the model's own forward as the step where the fused step fits too: issue 37's
                 # measure of what the fused step gains on a family, in one process
                 "forward": ("fused", False)}


def fast_options(path: str) -> dict | None:
    """The ``FastOptions`` fields a fast-path benchmark name sets (None: not a fast path).

    Raises NvkitError for an unknown option, so a typo is not measured as the default."""
    path = _ALIASES.get(path, path)
    if path != "fast" and not path.startswith("fast+"):
        return None
    # None: the process's default (nvkit.generate.fast.default_options()), i.e. what users get
    opts = dict(compile=True, attention=None, pdl=None, inductor={}, k_steps=None, regional=None, lora_fold=None,
                tune=None, gemv=None, experts=None, lora_merged=None)
    for part in path.split("+")[1:]:
        part = part.strip()
        if part in _FAST_OPTIONS:
            name, value = _FAST_OPTIONS[part]
            opts[name] = value
        elif part[:1] == "k" and part[1:].isdigit():
            opts["k_steps"] = int(part[1:])
        else:
            raise NvkitError(f"Unknown fast-path option {part!r} in {path!r}: use {', '.join(_FAST_OPTIONS)} or kN "
                             "(e.g. 'fast+pdl+tfused+k16').")
    return opts


def path_decoder(session, opts: dict, k_steps: int | None = None):
    """The session's batch-1 decoder built with a fast path's options (``fast_options``), from the
    defaults, not on the decoder the session had (an option a path leaves None is the default's,
    where the last decoder would keep what its path set; that one is released). A compiling variant
    compiles at its first call rather than after ``FastOptions.compile_after`` seconds of decoding:
    the rows compare the steps themselves."""
    from ..generate.fast import decoders
    leftover = decoders.swap(session, None)
    if leftover is not None:
        leftover.release()
    opts = dict(opts, k_steps=opts["k_steps"] or k_steps, inductor=tuple(sorted(opts["inductor"].items())))
    d = decoders.decoder(session, **opts)
    d.compile_next()
    return d


def adapter_options(path: str) -> dict | None:
    """``fast_options`` of an adapter path ("fast lora", "fast lora+fold", ...); None: not one."""
    if path != "fast lora" and not path.startswith("fast lora+"):
        return None
    return fast_options("fast" + path[len("fast lora"):])


def _session(model, dtype):
    from ..model.session import Session, load
    if isinstance(model, Session):
        return model
    require(isinstance(model, str) and model.strip(), f"model must be 'demo', a shape name such as 'qwen3-0.6b', a "
                                                      f"local directory or a Session, not {model!r}.")
    from .. import demo
    key = model.strip().lower()
    if key in demo.SHAPES:
        print(f"Random-weight {key} (exact shape, built once): loading…", flush=True)
        from .shapes import shape_folder
        return load(shape_folder(key), dtype=dtype)
    return load(model, dtype=dtype)


def corpus_prompt(tok, n_tokens: int, rng: random.Random | None = None) -> str:
    """A prompt of about ``n_tokens`` tokens from the demo corpus (from where ``rng`` picks; the
    start without one). The corpus repeats itself as often as a long prompt needs."""
    from .. import demo
    with open(demo.CORPUS, encoding="utf-8") as f:
        words = f.read().split()
    if len(words) < 4 * n_tokens:
        words = words * (-(-4 * n_tokens // max(1, len(words))) + 1)
    start = rng.randrange(max(1, len(words) - 4 * n_tokens)) if rng is not None else 0
    ids = tok(" ".join(words[start:start + 2 * n_tokens]))["input_ids"][:n_tokens]
    return tok.decode(ids, skip_special_tokens=True)


def _prompts(tok, prompt_len: int, n: int, seed: int) -> tuple[str, list[str]]:
    """One prompt of about ``prompt_len`` tokens, and ``n`` of mixed lengths, from the demo corpus."""
    rng = random.Random(seed)
    lo, hi = max(4, prompt_len // 4), max(8, prompt_len * 2)
    return corpus_prompt(tok, prompt_len, rng), [corpus_prompt(tok, rng.randint(lo, hi), rng) for _ in range(n)]


def _short(got: int, asked: int) -> str:
    """A note's words for a run that produced another number of tokens than it asked for."""
    return "" if got == asked else f"; produced {got} of {asked} tokens"


def _cuda():
    import torch
    return torch.cuda.is_available()


def _peak_reset():
    import torch
    if _cuda():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> float | None:
    import torch
    if not _cuda():
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**30


def _timed(warm, timed) -> tuple:
    """(tokens, seconds, peak, warm-up seconds): ``warm()`` untimed first (compile, capture, pools),
    then ``timed()``, which returns the tokens it made, with the peak memory measured over it alone."""
    t = time.perf_counter()
    warm()
    warm_s = time.perf_counter() - t
    _peak_reset()
    t = time.perf_counter()
    got = timed()
    return got, time.perf_counter() - t, _peak(), warm_s


def _padded_generate(s, prompts: list[str], n_new: int) -> int:
    """Plain ``generate`` over all ``prompts`` at once, left-padded to the longest, every row decoding
    ``n_new`` steps; returns the new tokens made."""
    import torch
    tok = s.tokenizer
    old = tok.padding_side
    tok.padding_side = "left"
    try:
        enc = tok(prompts, return_tensors="pt", padding=True).to(s.device)
    finally:
        tok.padding_side = old
    with torch.inference_mode():
        out = s.model.generate(**enc, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                               pad_token_id=tok.pad_token_id)
    return out.shape[0] * (out.shape[1] - enc["input_ids"].shape[1])


def _generate_batch(s, never: int, max_new_tokens: int):
    """transformers' continuous batching (CUDA graphs): a function (new tokens, token-id lists) ->
    the new tokens made."""
    import copy

    import torch
    from transformers import ContinuousBatchingConfig
    hf, tok = s.model, s.tokenizer
    cfg = copy.deepcopy(hf.generation_config)
    cfg.update(do_sample=False, eos_token_id=never, pad_token_id=tok.pad_token_id, max_new_tokens=max_new_tokens)

    def cb(n_new, inputs) -> int:
        # not under inference_mode: the manager's thread must update the buffers made here
        with torch.no_grad():
            out = hf.generate_batch(inputs=inputs, generation_config=cfg, max_new_tokens=n_new,
                                    continuous_batching_config=ContinuousBatchingConfig(
                                        use_cuda_graph=True, auto_switch_to_flash=False))
        return sum(len(o.generated_tokens) for o in out.values())
    return cb


def _on_decoder(session, d, timed):
    """``timed`` run with ``d`` as the session's decoder (the others stay captured, unused)."""
    from ..generate.fast import decoders

    def run_on_d():
        old = decoders.swap(session, d)
        try:
            return timed()
        finally:
            decoders.swap(session, old)
    return run_on_d


def _with_adapter(session, run):
    """``run()`` with a LoRA adapter (PEFT, r=16, every projection, small random weights) attached
    to the session's model, unmerged; the model is as it was afterwards."""
    import torch
    from peft import LoraConfig, get_peft_model
    base = session.model
    torch.manual_seed(0)
    peft_model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 init_lora_weights=False)).eval()
    session.model = peft_model
    try:
        return run()
    finally:
        session.model = peft_model.unload()


def _summarise_rounds(r: dict, stats: list, peaks: list) -> None:
    """Fill a batch-1 row from all its timed rounds: the median round's figures, the spread."""
    import statistics
    r["rounds"] = len(stats)
    if len(stats) < 2:
        return
    rates = [st.decode_tokens_per_second or 0.0 for st in stats]
    mid = sorted(range(len(stats)), key=lambda i: rates[i])[(len(stats) - 1) // 2]
    r.update(seconds=round(stats[mid].seconds, 3), tokens_per_s=round(statistics.median(rates), 1),
             ttft_ms=round(statistics.median(st.time_to_first_token for st in stats) * 1000, 1))
    if any(p is not None for p in peaks):
        r["peak_mem_gib"] = round(max(p for p in peaks if p is not None), 2)
    r["spread_pct"] = round(100 * (max(rates) - min(rates)) / statistics.median(rates), 1)


def run(model="qwen3-0.6b", new_tokens: int = 256, prompt_len: int = 64, n_prompts: int = 64,
        batch_new_tokens: int = 128, paths=None, dtype: str = "auto", k_steps: int | None = None,
        seed: int = 0, show: bool = True, repeats: int = 1, grid=None, **unused):
    """Run the decode benchmark and return a pandas DataFrame (printed when ``show``).

    ``model``: "qwen3-0.6b" (or another ``nvkit.demo.SHAPES`` name: random weights, real shape),
    "demo", a local checkpoint directory, or a loaded ``Session``. ``paths``: a subset of
    ``SINGLE_PATHS + BATCH_PATHS + OPTIONAL_PATHS`` (default: the first two groups).
    ``k_steps``: decode steps per graph replay for the fast path (default ``FastOptions.k_steps``, from ``NVKIT_FAST_K``).
    ``repeats``: timed rounds of each batch-1 path, in alternation (the median is reported).
    ``grid``: (prompts, new tokens) cells of mixed-length prompts for the "nvkit batched" rows
    (default ``GRID``; "nvkit batched" in ``paths``, or a ``grid``, runs them with ``GRID_PATHS``
    beside it). Keywords meant for other benchmarks (``decode=True`` ...) are ignored."""
    import pandas as pd
    import torch

    for name, v, lo in (("new_tokens", new_tokens, 2), ("prompt_len", prompt_len, 1), ("n_prompts", n_prompts, 1),
                        ("batch_new_tokens", batch_new_tokens, 1), ("repeats", repeats, 1)):
        whole_number(name, v, lo)
    whole_number("k_steps", k_steps, 1, 64, allow_none=True)
    whole_number("seed", seed, 0, 2**64 - 1)
    known = SINGLE_PATHS + BATCH_PATHS + OPTIONAL_PATHS + ADAPTER_PATHS + BATCHED_PATHS
    if paths is None:
        paths = SINGLE_PATHS + BATCH_PATHS
    if isinstance(paths, str):
        paths = [paths]
    require(isinstance(paths, (list, tuple)) and paths and all(isinstance(p, str) for p in paths),
            f"paths must be a non-empty list of benchmark path names, not {paths!r}.")
    bad = [p for p in paths if p not in known and fast_options(p) is None and adapter_options(p) is None]
    require(not bad, f"Unknown benchmark path(s) {bad}: choose from {list(known)}.")
    cells = _grid_cells(grid)
    if grid is not None and not any(p in BATCHED_PATHS for p in paths):
        paths = list(paths) + list(BATCHED_PATHS)
    unused.pop("decode", None)
    if unused:
        print(f"(decode benchmark: ignoring {sorted(unused)})")

    from ..generate.fast import decoders as fast_mod
    s = _session(model, dtype)
    tok, hf = s.tokenizer, s.model
    cuda = s.device.type == "cuda"
    never = int(hf.config.get_text_config().vocab_size)  # an id no logit row has: EOS never fires (batch paths)
    one, many = _prompts(tok, prompt_len, n_prompts, seed)
    rows = []

    def row(group, path, tokens, seconds, ttft, peak, warm_s, note="", rate=None):
        rate = rate if rate is not None else (tokens / seconds if seconds else None)
        rows.append(dict(group=group, path=path, tokens=tokens, seconds=round(seconds, 3) if seconds else None,
                         tokens_per_s=round(rate, 1) if rate else None,
                         ttft_ms=round(ttft * 1000, 1) if ttft is not None else None,
                         peak_mem_gib=round(peak, 2) if peak is not None else None,
                         warmup_s=round(warm_s, 1) if warm_s is not None else None, note=note))

    def skip(group, path, why):
        rows.append(dict(group=group, path=path, note=f"skipped: {why}"))

    timed_runs = []  # per batch-1 row: dict(row, timed: () -> (stats, peak), runs: [(stats, peak)], failed)

    def single(path, warm_tokens, call=None, **kw):
        # ``call(n)`` runs one request of n new tokens and returns its stats (default: the
        # session's generate with ``kw``). The warm-up asks for as many tokens as the timed run
        # where the cache size is compiled in.
        if call is None:
            def call(n):
                s.generate(one, max_new_tokens=n, min_new_tokens=n, **kw)
                return s.last_stats
        warm_t = time.perf_counter()
        call(warm_tokens)
        warm_s = time.perf_counter() - warm_t

        def timed():
            _peak_reset()
            return call(new_tokens), _peak()
        st, peak = timed()
        note = f"ran {st.path if st.path == 'fast' else st.how}; prompt {st.prompt_tokens} tokens"
        note += _short(st.new_tokens, new_tokens)
        if st.decode_tokens_per_second is None:
            note += "; no token after the first to time"
        # the decode rate: (tokens - 1) / (total - time to first token)
        row("batch 1", path, st.new_tokens, st.seconds, st.time_to_first_token, peak, warm_s, note,
            rate=st.decode_tokens_per_second or 0.0)
        timed_runs.append(dict(row=rows[-1], timed=timed, runs=[(st, peak)], failed=False))

    def transformers_generate(n):
        # the model's own generate on the prompt nvkit's plain path tokenizes, with the arguments it
        # passes; nvkit's streamer without a text callback only counts, which gives the first token's time
        enc = tok(one, return_tensors="pt").to(s.device)
        st = GenerationStats(prompt_tokens=int(enc["input_ids"].shape[1]), path="model.generate",
                             detail="transformers generate, no nvkit")
        t0 = time.perf_counter()

        def on_token(count):
            if st.time_to_first_token is None:
                st.time_to_first_token = time.perf_counter() - t0
        with torch.inference_mode():
            out = hf.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=tok.pad_token_id, streamer=CallbackStreamer(tok, None, on_token))
        st.seconds = time.perf_counter() - t0
        st.new_tokens = int(out.shape[1] - enc["input_ids"].shape[1])
        return st

    kept = {}  # fast path -> its decoder, kept captured for the later rounds (repeats > 1)

    group1 = f"batch 1 · {new_tokens} new tokens"

    def build(opts, path):  # the session's decoder built with a variant's options
        # a named variant keeps its compiled step (the default path keeps the faster step,
        # measured, as users get)
        path_decoder(s, opts, k_steps).policy.measure = path in ("fast", "fast lora")

    def keep(path):  # the variant's decoder kept for the later rounds; the next builds its own beside it
        if repeats > 1:
            kept[path] = fast_mod.swap(s, None)
            timed_runs[-1]["timed"] = _on_decoder(s, kept[path], timed_runs[-1]["timed"])

    fast_paths = [p for p in paths if p not in SINGLE_PATHS and p not in ADAPTER_PATHS and fast_options(p) is not None]
    adapter_paths = [p for p in paths if adapter_options(p) is not None]
    plain_paths = [p for p in SINGLE_PATHS + ("model.generate",) if p in paths]
    for path in plain_paths + fast_paths + adapter_paths:
        try:
            if path == "generate":
                single(path, min(new_tokens, 8), fast=False)
            elif path == "model.generate":
                single(path, min(new_tokens, 8), call=transformers_generate)
            elif path == "static+compile":
                if not cuda:
                    skip(group1, path, "compiling the decode step is benchmarked on CUDA only")
                    continue
                single(path, new_tokens, fast=False, cache_implementation="static")
            elif path in adapter_paths:
                if not cuda:
                    skip(group1, path, "the fast path needs CUDA")
                    continue
                own = path not in ADAPTER_PATHS  # options of its own: its decoder kept for the rounds
                build(adapter_options(path), path)
                _with_adapter(s, lambda: single(path, new_tokens, fast=True))
                rows[-1]["note"] += f"; {s.last_stats.detail}"
                timed = timed_runs[-1]["timed"]  # later rounds attach the adapter again around their run
                timed_runs[-1]["timed"] = lambda timed=timed: _with_adapter(s, timed)
                if own:
                    keep(path)
            elif fast_options(path) is not None:
                if not cuda:
                    skip(group1, path, "the fast path needs CUDA")
                    continue
                build(fast_options(path), path)
                single(path, new_tokens, fast=True)
                d = fast_mod.decoder(s)
                rows[-1]["note"] += (f"; K={d.k}, {'fused' if d.fused else 'model-forward'} "
                                     f"{'compiled' if d.compiled else 'eager'} step, "
                                     f"attention {d.attention}{', pdl' if d.pdl else ''}"
                                     f"{''.join(f', {k}' for k, _ in d.variant.inductor)}") + (
                    f" (compile failed: {d.compile_error})" if d.compile_error else "")
                if d.compile_detail:  # the note holds one line; the whole cause goes to stderr
                    print(f"{path}: torch.compile failed:\n{d.compile_detail}", file=sys.stderr)
                keep(path)
        except Exception as e:  # noqa: BLE001 - one broken path must not hide the others' figures
            skip(group1, path, error_summary(e))
    try:
        for r in range(1, repeats):
            for entry in (timed_runs if r % 2 == 0 else reversed(timed_runs)):
                if not entry["failed"]:
                    try:
                        entry["runs"].append(entry["timed"]())
                    except Exception as e:  # noqa: BLE001 - keep the rounds it has
                        entry["row"]["note"] += f"; round {r + 1} failed: {error_summary(e)}"
                        entry["failed"] = True
        for entry in timed_runs:
            _summarise_rounds(entry["row"], [st for st, _ in entry["runs"]], [p for _, p in entry["runs"]])
    finally:
        # the session keeps the last variant's decoder; the others' captures are freed
        last = kept.pop(fast_paths[-1], None) if fast_paths else None
        for d in kept.values():
            d.release()
        if last is not None:
            old = fast_mod.swap(s, last)
            if old is not None and old is not last:
                old.release()
    for r in rows:
        r["group"] = group1 if r["group"] == "batch 1" else r["group"]

    group2 = f"{n_prompts} prompts · {batch_new_tokens} new tokens"
    if "padded generate" in paths:
        try:
            got, secs, peak, warm_s = _timed(lambda: _padded_generate(s, many, 4),
                                             lambda: _padded_generate(s, many, batch_new_tokens))
            row(group2, "padded generate", got, secs, None, peak, warm_s,
                "time includes the prefill" + _short(got, n_prompts * batch_new_tokens))
        except Exception as e:  # noqa: BLE001
            skip(group2, "padded generate", f"{type(e).__name__}: {e}")
    if "generate_batch" in paths:
        if not cuda:
            skip(group2, "generate_batch", "continuous batching is benchmarked on CUDA only")
        else:
            try:
                ids = [tok(p)["input_ids"] for p in many]
                cb = _generate_batch(s, never, batch_new_tokens)
                got, secs, peak, warm_s = _timed(lambda: cb(4, ids[:4]), lambda: cb(batch_new_tokens, ids))
                row(group2, "generate_batch", got, secs, None, peak, warm_s,
                    "ContinuousBatchingConfig(use_cuda_graph=True); time includes warm-up capture"
                    + _short(got, n_prompts * batch_new_tokens))
            except Exception as e:  # noqa: BLE001
                skip(group2, "generate_batch", f"{type(e).__name__}: {e}")
    if "nvkit batch" in paths:
        try:
            t = time.perf_counter()
            s.generate(many, max_new_tokens=batch_new_tokens, eos_token_id=never)  # the batched path compiles here
            warm_s = time.perf_counter() - t
            settled = settle_batched(s, lambda: s.generate(many, max_new_tokens=batch_new_tokens, eos_token_id=never))
            _peak_reset()
            s.generate(many, max_new_tokens=batch_new_tokens, eos_token_id=never)
            st = s.last_stats
            row(group2, "nvkit batch", st.new_tokens, st.seconds, st.time_to_first_token, _peak(), warm_s,
                f"ran {st.how}" + _short(st.new_tokens, n_prompts * batch_new_tokens) + settled)
        except Exception as e:  # noqa: BLE001
            skip(group2, "nvkit batch", f"{type(e).__name__}: {e}")

    if any(p in BATCHED_PATHS for p in paths):
        for n, n_new in cells:
            _grid_rows(s, row, skip, n, n_new, [p for p in GRID_PATHS if p in paths or p in BATCHED_PATHS],
                       never, seed, cuda)

    columns = ["group", "path", "tokens", "seconds", "tokens_per_s", "ttft_ms", "peak_mem_gib", "warmup_s", "note"]
    if repeats > 1:
        columns[5:5] = ["rounds", "spread_pct"]
    df = pd.DataFrame(rows, columns=columns)
    base = {}  # each group against its plain path: generate at batch 1, padded generate for many prompts
    for g in df["group"].unique():
        first = "generate" if "batch 1" in g else "padded generate"
        sel = df[(df["group"] == g) & (df["path"] == first)]
        if len(sel) and sel["tokens_per_s"].notna().any():
            base[g] = float(sel["tokens_per_s"].iloc[0])
    df["vs_plain"] = [round(r.tokens_per_s / base[r.group], 2) if r.tokens_per_s and r.group in base else None
                      for r in df.itertuples()]
    df.attrs.update(model=s.model_id, device=str(s.device), dtype=str(s.dtype).replace("torch.", ""),
                    gpu=torch.cuda.get_device_name(s.device) if cuda else "cpu")
    if show:
        print(f"decode benchmark · {s.model_id} · {df.attrs['dtype']} · {df.attrs['gpu']}")
        print(table_text(df, index=False))
    return df


def _grid_cells(grid) -> list[tuple[int, int]]:
    """The (prompts, new tokens) cells asked for: pairs, or "8x128,64x512" (None: ``GRID``)."""
    if grid is None:
        return list(GRID)
    if isinstance(grid, str):
        try:
            grid = [tuple(int(x) for x in cell.lower().split("x")) for cell in grid.split(",") if cell.strip()]
        except ValueError:
            grid = None
    ok = isinstance(grid, (list, tuple)) and grid and all(
        isinstance(c, tuple) and len(c) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in c)
        for c in grid)
    require(ok, "grid must be (prompts, new tokens) pairs such as [(64, 128), (256, 512)], or '64x128,256x512'.")
    return list(grid)


def mixed_prompts(tok, n: int, seed: int, lo: int = MIXED_TOKENS[0], hi: int = MIXED_TOKENS[1]) -> list[str]:
    """``n`` prompts of ``lo``–``hi`` tokens (uniform), from the demo corpus."""
    from .. import demo
    with open(demo.CORPUS, encoding="utf-8") as f:
        words = f.read().split()
    rng = random.Random(f"mixed:{seed}:{n}")
    out = []
    for _ in range(n):
        size = rng.randint(lo, hi)
        start = rng.randrange(max(1, len(words) - 4 * size))
        ids = tok(" ".join(words[start:start + 2 * size]))["input_ids"][:size]
        out.append(tok.decode(ids, skip_special_tokens=True))
    return out


def settle_batched(s, again) -> str:
    """After a list's first (warm-up) call: where the batched path's rows step runs uncompiled
    (``FastOptions.compile_after``) or its prompt prefill eagerly (``FastOptions.prefill_after``),
    their compile is brought forward and ``again()`` runs it, so the timed call runs what a
    session runs once it has decoded a while. Returns the row's note."""
    from ..generate.fast import decoders
    if s.device.type != "cuda":
        return ""
    bd = decoders.batched_decoder(s)
    parts = []
    if bd.compile_waiting:
        bd.compile_next()
        parts.append("rows step")
    if bd.prefill_waiting:
        bd.compile_prefill_next()
        parts.append("prefill")
    if not parts:
        return ""
    t = time.perf_counter()
    again()
    return f"; the {' and the '.join(parts)} compiled after the warm-up call ({time.perf_counter() - t:.1f} s)"


def _grid_rows(s, row, skip, n: int, n_new: int, which: list, never: int, seed: int, cuda: bool) -> None:
    """One grid cell: ``n`` mixed-length prompts × ``n_new`` new tokens on each path of ``which``.
    Each path runs once untimed first (compile, capture, the pool sized to the cell), then timed:
    all new tokens over the whole call (prefill included), peak PyTorch memory of the timed call."""
    tok = s.tokenizer
    prompts = mixed_prompts(tok, n, seed)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    group = f"{n} prompts of {min(lengths)}–{max(lengths)} tokens · {n_new} new tokens"
    asked = n * n_new
    for path in which:
        try:
            if path == "padded generate":
                got, secs, peak, warm_s = _timed(lambda: _padded_generate(s, prompts, 4),
                                                 lambda: _padded_generate(s, prompts, n_new))
                row(group, path, got, secs, None, peak, warm_s,
                    "left-padded to the longest prompt; time includes the prefill" + _short(got, asked))
            elif path == "generate_batch":
                if not cuda:
                    skip(group, path, "continuous batching is benchmarked on CUDA only")
                    continue
                ids = [tok(p)["input_ids"] for p in prompts]
                cb = _generate_batch(s, never, n_new)
                got, secs, peak, warm_s = _timed(lambda: cb(4, ids[:4]), lambda: cb(n_new, ids))
                row(group, path, got, secs, None, peak, warm_s,
                    "ContinuousBatchingConfig(use_cuda_graph=True), cache sized from free memory; time includes "
                    "warm-up capture" + _short(got, asked))
            else:  # nvkit batched: Session.generate(list), as a user calls it
                if not cuda:
                    skip(group, path, "the batched fast path needs CUDA")
                    continue
                t = time.perf_counter()
                s.generate(prompts, max_new_tokens=n_new, min_new_tokens=n_new, fast=True)
                warm_s = time.perf_counter() - t
                settled = settle_batched(s, lambda: s.generate(prompts, max_new_tokens=n_new, min_new_tokens=n_new,
                                                                fast=True))
                _peak_reset()
                s.generate(prompts, max_new_tokens=n_new, min_new_tokens=n_new, fast=True)
                st = s.last_stats
                row(group, path, st.new_tokens, st.seconds, st.time_to_first_token, _peak(), warm_s,
                    f"ran {st.how}" + _short(st.new_tokens, asked) + settled)
        except Exception as e:  # noqa: BLE001 - one broken path must not hide the others' figures
            skip(group, path, error_summary(e))


def main(argv=None) -> int:
    """``python -m nvkit.benchmarks.decode [--model M] [--new-tokens N] ...``"""
    import argparse
    p = argparse.ArgumentParser(prog="nvkit bench --decode", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--n-prompts", type=int, default=64)
    p.add_argument("--batch-new-tokens", type=int, default=128)
    p.add_argument("--k-steps", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per batch-1 path, in alternation (median)")
    p.add_argument("--paths", default=None, help="comma-separated subset of: " + ", ".join(SINGLE_PATHS + BATCH_PATHS + OPTIONAL_PATHS + BATCHED_PATHS)
                   + f"; or fast+OPT+... with OPT in {', '.join(_FAST_OPTIONS)}, kN")
    p.add_argument("--grid", default=None, help="with 'nvkit batched' in --paths: (prompts)x(new tokens) cells of "
                   "mixed-length prompts, e.g. 64x128,256x512 (default: " + ",".join(f"{a}x{b}" for a, b in GRID) + ")")
    p.add_argument("--csv", default=None, help="also write the table here")
    a = p.parse_args(argv)
    try:
        df = run(model=a.model, new_tokens=a.new_tokens, prompt_len=a.prompt_len, n_prompts=a.n_prompts,
                 batch_new_tokens=a.batch_new_tokens, k_steps=a.k_steps, repeats=a.repeats,
                 paths=[x.strip() for x in a.paths.split(",") if x.strip()] if a.paths else None, grid=a.grid)
    except NvkitError as e:
        print(f"NvkitError: {e}")
        return 2
    if a.csv:
        df.to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
