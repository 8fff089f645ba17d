"""LoRA training speed and memory: plain PEFT vs nvkit's path, in one process (``nvkit bench --lora``).

Every variant trains the same random-weight model of a real shape (``nvkit.demo.shaped``), the
same LoRA (r, all-linear), batch and sequence length, AdamW, on the same text (the corpus nvkit
ships, tokenized with the model's tokenizer and cut into rows of ``seq_len`` tokens), through
``Trainer``; only what nvkit changes differs:

- ``plain``: PEFT + Trainer as documented (model's own loss over full logits, ``adamw_torch``);
- ``nvkit``: what ``nvkit.finetune`` does by default (fused linear cross-entropy, compiled decoder
  layers on CUDA under an activation-memory budget, fused AdamW);
- ``nvkit+liger``: fused loss + Liger RMSNorm/SwiGLU instead of compile (when liger-kernel is installed);
- ``nvkit+gc``: ``nvkit`` plus gradient checkpointing (memory for time).

Tokens/s is measured over ``steps`` steps after ``warmup`` steps (compilation happens there); peak
memory is PyTorch's allocator peak over the whole run (CUDA), or RSS growth on CPU.

A speed is only worth something if the run trained: each row has the loss of its first and last
step and the last gradient norm, and ``error`` says what went wrong when a loss or gradient norm was
not finite or the loss did not fall (random ids could not be learned, which is why the rows are text).
"""

from __future__ import annotations

import math
import os
import tempfile
import time

from ..checks import positive_int, whole_number
from ..errors import NvkitError, require
from .tables import table_text

VARIANTS = ("plain", "nvkit", "nvkit+liger", "nvkit+gc")


def _available(variant: str, device_type: str) -> tuple[bool, str]:
    if variant == "nvkit+liger":
        if device_type != "cuda":
            return False, "Liger needs CUDA"
        try:
            import liger_kernel  # noqa: F401
        except ImportError:
            return False, "liger-kernel not installed"
    return True, ""


def text_rows(path: str, seq_len: int, n_rows: int) -> list:
    """``n_rows`` training rows of exactly ``seq_len`` tokens: nvkit's demo corpus tokenized with the
    tokenizer saved with ``path`` (paragraphs joined by its EOS), cut in order and cycled if short."""
    from transformers import AutoTokenizer

    from ..demo import CORPUS
    from ..train import data as _data
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise NvkitError(f"bench_lora trains on text and needs the model's tokenizer; {path} has none that loads "
                         f"({str(e).splitlines()[0]}).") from e
    with open(CORPUS, encoding="utf-8") as f:
        paragraphs = [p.strip() for p in f.read().split("\n\n") if p.strip()]
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    ids: list[int] = []
    for p in paragraphs:
        ids += tok(p, add_special_tokens=False)["input_ids"] + eos
    require(len(ids) >= seq_len, f"The corpus gives {len(ids)} tokens, fewer than seq_len={seq_len}.")
    blocks = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    return [_data.Example(list(b), list(b)) for b in (blocks[i % len(blocks)] for i in range(n_rows))]


def health(losses: list, grad_norms: list) -> str:
    """Why a training run did not train ("" when it did): a loss or gradient norm that is not finite,
    or a loss that did not fall. Each step sees other rows, so one step's loss is noisy: the mean of
    the last quarter of the steps must be below the mean of the first quarter."""
    for name, values in (("loss", losses), ("grad_norm", grad_norms)):
        bad = [i for i, v in enumerate(values, 1) if v is None or not math.isfinite(v)]
        if bad:
            return f"{name} {values[bad[0] - 1]} at step {bad[0]}"
    if not losses:
        return "no loss was logged"
    k = max(1, len(losses) // 4)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if len(losses) > 1 and not last < first:
        return f"the loss did not fall (mean of the first {k} steps {first:.4f}, of the last {k} {last:.4f})"
    return ""


def _one(path: str, variant: str, *, rows, batch_size, seq_len, steps, warmup, r, learning_rate, device_type, dtype,
         seed=0) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    from ..memory.usage import memory_now as _memory_now, release
    from ..model.precision import precision
    from ..train import data as _data
    from ..train.finetune import (activation_budget, apply_liger as _apply_liger, compile_layers as _compile_layers,
                                  prepare_lora_model, quiet_trainer as _quiet, trainer_classes as _trainer_classes,
                                  training_arguments, uncompile_layers as _uncompile_layers)
    from ..train.loss import fused_loss_supported

    nvkit_path = variant != "plain"
    compile_on = variant in ("nvkit", "nvkit+gc") and device_type == "cuda"
    gc_on = variant == "nvkit+gc"
    liger_on = variant == "nvkit+liger"
    cap = torch.cuda.get_device_capability() if device_type == "cuda" else None
    prec = precision(device_type, cap)

    release()
    if device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base_mem = torch.cuda.memory_allocated()
    else:
        base_mem = _memory_now("cpu")[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_type,
                                                 attn_implementation="sdpa")
    vocab = model.config.vocab_size
    lora = dict(r=r, alpha=2 * r, dropout=0.05, target_modules="all-linear")
    model, _, _ = prepare_lora_model(model, lora, gc_on)
    fused = fused_loss_supported(model)[0] if nvkit_path else False
    notes = []
    if fused:
        notes.append("fused CE")
    if liger_on:
        _apply_liger(model)
        notes.append("liger")
    if compile_on:
        _compile_layers(model)
        notes.append("compiled layers, activation budget")
    if gc_on:
        notes.append("grad checkpointing")
    total_steps = warmup + steps
    top = max(max(e.input_ids) for e in rows)
    require(top < vocab, f"bench_lora: token id {top} of the text is past the model's vocabulary ({vocab}).")

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if device_type == "cuda":
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if device_type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    NvkitTrainer, _ = _trainer_classes()
    losses: list[float] = []
    grad_norms: list[float | None] = []

    class Loss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                g = logs.get("grad_norm")
                grad_norms.append(float(g) if g is not None else None)

    with tempfile.TemporaryDirectory(prefix="nvkit-bench-lora-") as out:
        args = training_arguments(out, prec, device_type, max_steps=total_steps, epochs=None, learning_rate=learning_rate,
                                  batch_size=batch_size, grad_accum=1, log_every=1, seed=seed,
                                  gradient_checkpointing=gc_on, fused_adamw=nvkit_path and device_type == "cuda")
        args.logging_nan_inf_filter = False  # log each step's own loss: a NaN must show, not be averaged away
        trainer = NvkitTrainer(model=model, args=args, train_dataset=_data.ListDataset(rows),
                               data_collator=_data.Collator(0, pad_to=64 if compile_on else 8),
                               callbacks=[Timer(), Loss()], fused_loss=fused, counter={"tokens": 0})
        _quiet(trainer)
        t0 = time.perf_counter()
        try:
            with activation_budget(compile_on):
                trainer.train()
        except torch.OutOfMemoryError as e:
            raise NvkitError(f"bench_lora: variant {variant!r} ran out of memory: {str(e).splitlines()[0]}") from e
        finally:
            wall = time.perf_counter() - t0
            if compile_on:
                _uncompile_layers(model)
    measured = times[warmup:] or times
    secs = sum(measured)
    if device_type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _memory_now("cpu")[1] - base_mem
    del trainer, model
    if compile_on:
        torch._dynamo.reset()
    release()
    return {"variant": variant, "tokens_per_s": len(measured) * batch_size * seq_len / secs if secs else 0.0,
            "step_ms": 1000 * secs / max(len(measured), 1), "peak_memory_gib": peak / 2**30,
            "warmup_s": sum(times[:warmup]), "wall_s": wall, "first_loss": losses[0] if losses else math.nan,
            "final_loss": losses[-1] if losses else math.nan,
            "grad_norm": grad_norms[-1] if grad_norms and grad_norms[-1] is not None else math.nan,
            "error": health(losses, grad_norms), "what": ", ".join(notes) or "PEFT + Trainer defaults"}


def run(model: str = "qwen3-0.6b", batch_size: int = 8, seq_len: int = 512, steps: int = 30, r: int = 16,
        warmup: int = 5, variants=None, device: str | None = None, learning_rate: float = 1e-3):
    """Train each variant for ``warmup + steps`` steps and return a DataFrame: tokens/s, peak memory,
    and both as ratios to ``plain`` (speed_vs_plain > 1 and memory_vs_plain < 1 are better).

    ``model``: a shape name of ``nvkit.demo.shaped`` (random weights, no download), "demo", or a
    local checkpoint directory (with its tokenizer). ``first_loss``, ``final_loss``, ``grad_norm``
    and ``error`` say whether each variant trained (``health``). ``learning_rate``: high enough that
    a few dozen steps of a random-weight model visibly learn the text (the rate changes nothing in
    the timing)."""
    import pandas as pd
    import torch

    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("steps", steps), ("r", r)):
        positive_int(name, v)
    whole_number("warmup", warmup, 0)
    require(isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool) and 0 < learning_rate < 1,
            f"learning_rate must be a number between 0 and 1, not {learning_rate!r}.")
    device_type = device or ("cuda" if torch.cuda.is_available() else "cpu")
    require(device_type in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu', not {device!r}.")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise NvkitError("bench_lora: device='cuda' but no CUDA GPU is visible here.")
    require(variants is None or (isinstance(variants, (list, tuple)) and all(isinstance(v, str) for v in variants)),
            f"variants must be a list of variant names ({', '.join(VARIANTS)}) or None, not {variants!r}.")
    chosen = list(variants) if variants is not None else list(VARIANTS)
    bad = [v for v in chosen if v not in VARIANTS]
    require(not bad, f"Unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}.")
    if "plain" in chosen:  # the baseline first, and always: the ratios are against it
        chosen.remove("plain")
    chosen.insert(0, "plain")

    require(isinstance(model, str) and model.strip(), f"model must be a shape name, 'demo' or a local directory, "
                                                      f"not {model!r}.")
    if os.path.isdir(os.path.expanduser(model)):
        path = os.path.expanduser(model)
    elif model.strip().lower() == "demo":
        from ..demo import path as demo_path
        path = demo_path()
    else:
        from .shapes import shape_folder
        path = shape_folder(model)
    if device_type == "cuda":
        cap = torch.cuda.get_device_capability()
        dtype = torch.bfloat16 if cap >= (8, 0) else torch.float16
    else:
        dtype = torch.float32

    data = text_rows(path, seq_len, (warmup + steps) * batch_size)
    rows = []
    for v in chosen:
        ok, why = _available(v, device_type)
        if not ok:
            rows.append({"variant": v, "error": "", "what": f"skipped: {why}"})
            continue
        rows.append(_one(path, v, rows=data, batch_size=batch_size, seq_len=seq_len, steps=steps, warmup=warmup, r=r,
                         learning_rate=float(learning_rate), device_type=device_type, dtype=dtype))
    df = pd.DataFrame(rows).set_index("variant")
    base = df.loc["plain"]
    df["speed_vs_plain"] = df["tokens_per_s"] / base["tokens_per_s"]
    df["memory_vs_plain"] = df["peak_memory_gib"] / base["peak_memory_gib"]
    df.attrs.update(model=model, batch_size=batch_size, seq_len=seq_len, steps=steps, r=r, learning_rate=learning_rate,
                    device=device_type, gpu=torch.cuda.get_device_name() if device_type == "cuda" else "cpu")
    cols = ["tokens_per_s", "speed_vs_plain", "peak_memory_gib", "memory_vs_plain", "step_ms", "warmup_s",
            "first_loss", "final_loss", "grad_norm", "error", "what"]
    return df[[c for c in cols if c in df.columns]]


def short_runs(model: str = "qwen3-0.6b", steps=(20, 200), batch_size: int = 8, seq_len: int = 512, r: int = 16,
               device: str | None = None, quantization: str | None = None):
    """Wall time of whole short runs, the way a notebook user meets them: plain PEFT + Trainer
    against ``nvkit.finetune`` with ``compile="auto"``, each for every count in ``steps``, nvkit
    twice: with empty compile caches ("cold", a first run on this machine) and again with the
    caches the first run left ("warm", the next run of the same shape). Wall time runs from the
    LoRA preparation to the trained adapter (the model is loaded before the clock starts; nvkit's
    time includes saving its adapter, plain's does not). A DataFrame, one row per (steps, variant):
    wall_s, effective tokens/s, wall time vs plain, what nvkit decided about compiling and why."""
    import shutil

    import pandas as pd
    import torch

    require(isinstance(steps, (list, tuple)) and steps and all(isinstance(n, int) and not isinstance(n, bool)
                                                               and n >= 1 for n in steps),
            f"steps must be a list of whole numbers ≥ 1, e.g. (20, 200), not {steps!r}.")
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("r", r)):
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{name} must be a whole number ≥ 1, not {v!r}.")
    device_type = device or ("cuda" if torch.cuda.is_available() else "cpu")
    require(device_type in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu', not {device!r}.")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise NvkitError("short_runs: device='cuda' but no CUDA GPU is visible here.")
    require(isinstance(model, str) and model.strip(), f"model must be a shape name or a local directory, not {model!r}.")
    if os.path.isdir(os.path.expanduser(model)):
        path = os.path.expanduser(model)
    else:
        from .shapes import shape_folder
        path = shape_folder(model)

    from ..model.session import load
    from ..train.finetune import finetune

    lora = dict(r=r, alpha=2 * r, dropout=0.05, target_modules="all-linear")
    s = load(path, device_map="cuda" if device_type == "cuda" else "cpu", quantization=quantization)
    # the same packed rows for both: one long text example per row of seq_len tokens
    text, rows = loop_rows(s.tokenizer, seq_len, batch_size * max(steps))
    tokens_per_step = sum(len(x) for x in rows[:batch_size])

    out = []
    keep_env = {k: os.environ.get(k) for k in ("NVKIT_CACHE", "TORCHINDUCTOR_CACHE_DIR")}
    try:
        for n in steps:
            plain = _plain_wall(s, rows, n, batch_size, lora, device_type)
            out.append({"steps": n, "variant": "plain", "wall_s": plain, "compile": "off (PEFT + Trainer)"})
            caches = tempfile.mkdtemp(prefix="nvkit-bench-compile-")
            os.environ["NVKIT_CACHE"] = caches
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(caches, "inductor")
            for label in ("nvkit cold", "nvkit warm"):
                torch.compiler.reset()  # in-process compiled code goes; the disk caches stay
                if s.info["adapters"]:
                    s.unload_adapter()
                with tempfile.TemporaryDirectory(prefix="nvkit-bench-run-") as d:
                    t0 = time.perf_counter()
                    run = finetune(s, [text] * (batch_size * n), lora=lora, max_steps=n, batch_size=batch_size,
                                   seq_len=seq_len, packing=True, output_dir=d, compile="auto")
                    run.result()
                    wall = time.perf_counter() - t0
                out.append({"steps": n, "variant": label, "wall_s": wall,
                            "compile": run.info["compile_reason"] + (f" · cache {run.info['compile_cache']}"
                                                                      if run.info.get("compile_cache") else "")})
            shutil.rmtree(caches, ignore_errors=True)
    finally:
        for k, v in keep_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s.unload()
    df = pd.DataFrame(out)
    df["tokens_per_s"] = df["steps"] * tokens_per_step / df["wall_s"]
    plain_wall = df[df["variant"] == "plain"].set_index("steps")["wall_s"]
    df["wall_vs_plain"] = df["wall_s"] / df["steps"].map(plain_wall)
    df.attrs.update(model=model, batch_size=batch_size, seq_len=seq_len, r=r, device=device_type,
                    quantization=quantization, gpu=torch.cuda.get_device_name() if device_type == "cuda" else "cpu")
    return df[["steps", "variant", "wall_s", "tokens_per_s", "wall_vs_plain", "compile"]]


def loop_rows(tokenizer, seq_len: int, n_rows: int):
    """(text, rows) of the short-run comparison: a text that fills one row of ``seq_len`` tokens,
    and ``n_rows`` packed rows of it, the same for plain PEFT and for ``nvkit.finetune``."""
    from ..train import data as train_data
    sentence = "NVIDIA GPUs train LoRA adapters on short runs and long runs alike. "
    per = max(1, len(tokenizer(sentence, add_special_tokens=False)["input_ids"]))
    text = sentence * max(1, (seq_len - 2) // per)
    rows, _ = train_data.prepare([text] * n_rows, tokenizer, seq_len, True)
    return text, rows[:n_rows]


def _plain_wall(session, rows, steps: int, batch_size: int, lora: dict, device_type: str) -> float:
    """Seconds for PEFT + Trainer as documented (model's own loss, adamw_torch) to run ``steps``
    steps on the session's model, from adding the adapter to the end of training."""
    import torch

    from ..model.precision import precision
    from ..train import data as _data
    from ..train.finetune import prepare_lora_model, quiet_trainer as _quiet, trainer_class, training_arguments

    if session.info["adapters"]:
        session.unload_adapter()
    cap = torch.cuda.get_device_capability() if device_type == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="nvkit-bench-plain-") as out:
        if device_type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model, _, _ = prepare_lora_model(session.model, lora, False)
        args = training_arguments(out, precision(device_type, cap), device_type, max_steps=steps, epochs=None,
                                  learning_rate=2e-4, batch_size=batch_size, grad_accum=1, log_every=1, seed=0,
                                  gradient_checkpointing=False, fused_adamw=False)
        trainer = trainer_class()(model=model, args=args, train_dataset=_data.ListDataset(rows[: batch_size * steps]),
                                  data_collator=_data.Collator(session.tokenizer.pad_token_id or 0), fused_loss=False)
        _quiet(trainer)
        trainer.train()
        if device_type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    session.model = model.unload()
    session.model.eval()
    return wall


def untrained(df) -> dict:
    """{variant: why} for the variants of a ``run`` table that did not train (see ``health``)."""
    if "error" not in df.columns:
        return {}
    return {v: e for v, e in df["error"].items() if isinstance(e, str) and e}


def main(argv=None) -> int:
    """``python -m nvkit.benchmarks.lora [--model qwen3-0.6b] [--batch-size 8] ...``: the table, and exit
    status 1 when a variant did not train."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m nvkit.benchmarks.lora", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b", help="a shape name (nvkit.demo.SHAPES), 'demo' or a local directory")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--variants", default=None, help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    p.add_argument("--csv", default=None, help="also write the table here")
    a = p.parse_args(argv)
    try:
        df = run(model=a.model, batch_size=a.batch_size, seq_len=a.seq_len, steps=a.steps, warmup=a.warmup, r=a.r,
                 learning_rate=a.learning_rate, device=a.device,
                 variants=[v.strip() for v in a.variants.split(",") if v.strip()] if a.variants else None)
    except NvkitError as e:
        print(f"NvkitError: {e}")
        return 2
    at = df.attrs
    print(f"LoRA bench · {at['model']} · r={at['r']} all-linear · batch {at['batch_size']} × {at['seq_len']} · "
          f"{at['steps']} timed steps · lr {at['learning_rate']} · {at['gpu']}")
    print(table_text(df.round(3), colwidth=60))
    if a.csv:
        df.to_csv(a.csv)
    bad = untrained(df)
    for v, why in bad.items():
        print(f"{v} did not train: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
