"""LoRA training speed and memory: plain PEFT vs nvkit's path, in one process (``nvkit bench --lora``).

Every variant trains the same random-weight model of a real shape (``nvkit.demo.shaped``), the
same LoRA (r, all-linear), batch and sequence length, AdamW, on the same random tokens, through
``Trainer``; only what nvkit changes differs:

- ``plain``: PEFT + Trainer as documented (model's own loss over full logits, ``adamw_torch``);
- ``nvkit``: what ``nvkit.finetune`` does by default (fused linear cross-entropy, compiled decoder
  layers on CUDA under an activation-memory budget, fused AdamW);
- ``nvkit+liger``: fused loss + Liger RMSNorm/SwiGLU instead of compile (when liger-kernel is installed);
- ``nvkit+gc``: ``nvkit`` plus gradient checkpointing (memory for time).

Tokens/s is measured over ``steps`` steps after ``warmup`` steps (compilation happens there); peak
memory is PyTorch's allocator peak over the whole run (CUDA), or RSS growth on CPU.
"""

from __future__ import annotations

import math
import os
import tempfile
import time

from ..checks import positive_int, whole_number
from ..errors import NvkitError, require

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


def _one(path: str, variant: str, *, batch_size, seq_len, steps, warmup, r, device_type, dtype, seed=0) -> dict:
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
    g = torch.Generator().manual_seed(seed)
    total_steps = warmup + steps
    ids = torch.randint(0, vocab, (total_steps * batch_size, seq_len), generator=g)
    rows = [_data.Example(row.tolist(), row.tolist()) for row in ids]

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

    class Loss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    with tempfile.TemporaryDirectory(prefix="nvkit-bench-lora-") as out:
        args = training_arguments(out, prec, device_type, max_steps=total_steps, epochs=None, learning_rate=2e-4,
                                  batch_size=batch_size, grad_accum=1, log_every=1, seed=seed,
                                  gradient_checkpointing=gc_on, fused_adamw=nvkit_path and device_type == "cuda")
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
            "warmup_s": sum(times[:warmup]), "wall_s": wall, "final_loss": losses[-1] if losses else math.nan,
            "what": ", ".join(notes) or "PEFT + Trainer defaults"}


def run(model: str = "qwen3-0.6b", batch_size: int = 8, seq_len: int = 512, steps: int = 30, r: int = 16,
        warmup: int = 5, variants=None, device: str | None = None):
    """Train each variant for ``warmup + steps`` steps and return a DataFrame: tokens/s, peak memory,
    and both as ratios to ``plain`` (speed_vs_plain > 1 and memory_vs_plain < 1 are better).

    ``model``: a shape name of ``nvkit.demo.shaped`` (random weights, no download) or a local
    checkpoint directory."""
    import pandas as pd
    import torch

    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("steps", steps), ("r", r)):
        positive_int(name, v)
    whole_number("warmup", warmup, 0)
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

    require(isinstance(model, str) and model.strip(), f"model must be a shape name or a local directory, not {model!r}.")
    if os.path.isdir(os.path.expanduser(model)):
        path = os.path.expanduser(model)
    else:
        from ..demo import shaped
        path = shaped(model)
    if device_type == "cuda":
        cap = torch.cuda.get_device_capability()
        dtype = torch.bfloat16 if cap >= (8, 0) else torch.float16
    else:
        dtype = torch.float32

    rows = []
    for v in chosen:
        ok, why = _available(v, device_type)
        if not ok:
            rows.append({"variant": v, "what": f"skipped: {why}"})
            continue
        rows.append(_one(path, v, batch_size=batch_size, seq_len=seq_len, steps=steps, warmup=warmup, r=r,
                         device_type=device_type, dtype=dtype))
    df = pd.DataFrame(rows).set_index("variant")
    base = df.loc["plain"]
    df["speed_vs_plain"] = df["tokens_per_s"] / base["tokens_per_s"]
    df["memory_vs_plain"] = df["peak_memory_gib"] / base["peak_memory_gib"]
    df.attrs.update(model=model, batch_size=batch_size, seq_len=seq_len, steps=steps, r=r, device=device_type,
                    gpu=torch.cuda.get_device_name() if device_type == "cuda" else "cpu")
    cols = ["tokens_per_s", "speed_vs_plain", "peak_memory_gib", "memory_vs_plain", "step_ms", "warmup_s",
            "final_loss", "what"]
    return df[[c for c in cols if c in df.columns]]
