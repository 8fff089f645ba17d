"""Short LoRA / QLoRA fine-tunes of the loaded model, in a worker thread: ``nvkit.finetune``.

The loop is transformers' ``Trainer`` (so the settings mean what the guide says they mean) with its
notebook progress bar off — it would print into whichever cell happens to run — and an nvkit
callback (``nvkit.train.run``) that records each logged step into ``FinetuneRun.history``, evaluates
held-out data into ``FinetuneRun.eval_history`` (``eval_data``/``eval_split``, ``eval_every``), puts
steps, evaluations and checkpoints on the event log (the memory chart draws them), applies the stop
rules (``stop_at_loss``, ``patience``) and turns ``run.stop()`` into "end after this step, with a
resumable checkpoint"; ``resume=`` continues from one (``nvkit.train.checkpoints``).

Speed and memory (``nvkit bench --lora`` measures them; docs/benchmarks.md has the figures):
- the loss never materializes the full logits: ``nvkit.train.loss`` runs the LM head and
  the cross-entropy chunk by chunk and keeps only the gradient of the hidden states (the idea of
  Liger's fused linear cross-entropy, in plain torch so it also runs on CPU); with Qwen3's 152k
  vocabulary the logits and their fp32 copies are most of plain PEFT's peak;
- rows are packed (no pad FLOPs) and right-padded only, so attention keeps its causal fast path;
- on CUDA, runs long enough to pay for it compile each decoder layer (``compile="auto"``, decided by
  the run's length and whether the compile cache is warm: ``nvkit.train.compile``; regional, so it
  compiles once and every layer reuses it), which fuses norms, SwiGLU, RoPE, LoRA dropout and the
  adapter adds, and with an activation-memory budget (``ACTIVATION_BUDGET``) the compiler keeps
  only half of what the backward needs and recomputes the cheapest rest; short runs skip it and
  finish sooner;
- Liger's Triton RMSNorm/SwiGLU replace the eager ones when compile is off and liger is installed;
- fused AdamW on CUDA.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import tempfile
import time

from .. import events
from ..checks import positive_int
from ..errors import NvkitError, error_summary, require
from ..memory import peaks
from ..memory.oom import oom_error
from ..memory.usage import memory_now, settle
from ..model import imports
from ..model.precision import precision as choose_precision
from ..model.saving import check_target, make_folder, save_atomic
from ..model.session import Session, session as current_session
from ..quiet import routed
from ..threads import Job, run_in_worker
from ..units import counted, fmt_bytes
from . import checkpoints as ckpts
from . import data as train_data
from .compile import (ACTIVATION_BUDGET, CompileCache, activation_budget, compile_decision, compile_layers,
                      uncompile_layers)
from .evaluate import Evaluator
from .lora import DEFAULT_LORA, apply_liger, check_lora, is_kbit, liger_decision, prepare_lora_model
from .loss import fused_loss_supported
from .run import FinetuneRun, recorder, remember_model
from .trainer import quiet_trainer, trainer_class, training_arguments

# Names other modules and notebooks import from here (they moved to train.lora/compile/trainer/run
# and model.saving so the launch worker shares them).
__all__ = ["finetune", "run_estimate", "FinetuneRun", "DEFAULT_LORA", "check_lora", "liger_decision",
           "prepare_lora_model", "apply_liger", "ACTIVATION_BUDGET", "activation_budget", "compile_layers",
           "uncompile_layers",
           "save_atomic", "training_arguments", "quiet_trainer", "trainer_classes", "default_output_dir",
           "check_output_dir"]


def trainer_classes():
    """(NvkitTrainer, the run's callback factory), built on first use."""
    return trainer_class(), recorder


def default_output_dir(session) -> str:
    """A new folder under ./nvkit-runs named for the model and the time, unique (mkdtemp): two
    runs started in the same second never share one."""
    name = os.path.basename(os.path.normpath(str(session.model_id))) or "model"
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    root = make_folder(os.path.abspath("nvkit-runs"), "folder for fine-tune runs")
    return tempfile.mkdtemp(prefix=f"{name}-lora-{time.strftime('%Y%m%d-%H%M%S')}-", dir=root)


def check_output_dir(output_dir, create: bool = True) -> str:
    """The absolute output folder, when nvkit may write its adapter and checkpoints into it: a
    new or existing folder where ``adapter`` and any ``checkpoint-N`` are absent or nvkit's own.
    NvkitError otherwise (nothing of the user's is ever replaced)."""
    require(isinstance(output_dir, (str, os.PathLike)) and str(output_dir).strip(),
            f"output_dir must be a folder path, not {output_dir!r}.")
    out = os.path.abspath(os.path.expanduser(os.fspath(output_dir)))
    if os.path.exists(out) and not os.path.isdir(out):
        raise NvkitError(f"output_dir {out} is a file, not a folder. Give a folder path (nvkit writes adapter/ and "
                         "checkpoint-N/ into it).")
    if os.path.isdir(out):
        check_target(os.path.join(out, "adapter"), ("adapter",), "adapter")
        for name in sorted(os.listdir(out)):
            if name.startswith("checkpoint-"):
                check_target(os.path.join(out, name), ("checkpoint",), "checkpoint")
    return make_folder(out, "output_dir") if create else out


def _unknown_settings(unknown: dict) -> NvkitError:
    import difflib
    known = [p for p in inspect.signature(finetune).parameters if p != "settings"]
    parts = []
    for k in unknown:
        close = difflib.get_close_matches(k, known, n=1)
        parts.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return NvkitError(f"Unknown finetune setting(s) {', '.join(parts)}. Known: {', '.join(known)}.")


def _number(name: str, v, allow_none=True, lo=0.0, lo_open=True):
    if v is None and allow_none:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and (v > lo if lo_open else v >= lo)
    require(ok, f"{name} must be a number {'>' if lo_open else '≥'} {lo:g}, not {v!r}.")
    return float(v)


def _training_rows(data, tok, seq_len: int, packing, eval_split, seed: int):
    """(the rows a run trains on, their facts, the data's kind, the examples ``eval_split`` holds
    out): how ``finetune`` and ``run_estimate`` both read the data."""
    examples, kind = train_data.tokenize(data, tok, seq_len)
    held: list = []
    if eval_split is not None:
        examples, held = train_data.split(examples, eval_split, seed)
    rows, info = train_data.arrange(examples, kind, seq_len, packing)
    return rows, info, kind, held


def _total_steps(rows: list, batch_size: int, grad_accum: int, max_steps, epochs) -> int:
    per_epoch = math.ceil(math.ceil(len(rows) / batch_size) / grad_accum)
    return max_steps if max_steps is not None else max(1, math.ceil(per_epoch * float(epochs or 1)))


def _compile_plan(s, compile, steps: int, lora_cfg: dict, batch_size: int, seq_len: int, gradient_checkpointing: bool):
    """(compile the decoder layers?, why, the compile cache or None) for ``steps`` steps to run."""
    cache = None
    if compile is not False and s.device.type == "cuda":
        import torch
        cache = CompileCache(CompileCache.facts(s.model, dtype=s.model.dtype, lora=lora_cfg, batch_size=batch_size,
                                                seq_len=seq_len, gradient_checkpointing=gradient_checkpointing,
                                                kbit=is_kbit(s.model),
                                                capability=torch.cuda.get_device_capability(s.device)))
    do_compile, why = compile_decision(compile, s.device.type, steps, cache is not None and cache.warm)
    return do_compile, why, cache


def _pad_to(compiled: bool) -> int:
    return 64 if compiled else 8  # compiled layers see a few padded shapes rather than one per batch length


def _estimate_settings(rows: list, batch_size: int, lora_cfg: dict, gradient_checkpointing: bool,
                       compiled: bool) -> dict:
    """What ``nvkit.estimate`` is told about a run: nvkit's path, compiled or not, for the longest
    batch these rows make (unpacked examples are often far shorter than seq_len)."""
    return dict(mode="lora", batch_size=min(batch_size, len(rows)),
                seq_len=max(1, train_data.batch_length(rows, _pad_to(compiled))), lora_r=lora_cfg["r"],
                lora_dropout=lora_cfg["dropout"], gradient_checkpointing=gradient_checkpointing, path="nvkit",
                compiled=compiled)


def run_estimate(session=None, data=None, *, lora: dict | None = None, max_steps: int | None = None,
                 epochs: float | None = None, batch_size: int = 8, grad_accum: int = 1, seq_len: int = 512,
                 packing="auto", gradient_checkpointing: bool = False, compile="auto", seed: int = 0,
                 eval_split: float | None = None):
    """The memory estimate (``nvkit.Estimate``) of the run ``nvkit.finetune(session, data, ...)``
    would start with these settings: the same rows, batch shape and compile decision, so the same
    number the run sets as its prediction (``run.estimate``) and compares with its measured peak.
    The data are read and tokenized here (``data`` as for ``finetune``)."""
    s = session if session is not None else current_session()
    require(isinstance(s, Session), f"session must be an nvkit.Session (from nvkit.load), not {type(s).__name__}.")
    s._require_loaded()
    require(data is not None, "run_estimate needs the run's data: a list of examples or a path to a data file.")
    lora_cfg = check_lora(DEFAULT_LORA if lora is None else lora)
    for name, v in (("batch_size", batch_size), ("grad_accum", grad_accum)):
        positive_int(name, v)
    positive_int("max_steps", max_steps, allow_none=True)
    train_data.check_seq_len(seq_len)
    train_data.check_packing(packing)
    rows, _, _, _ = _training_rows(data, s.tokenizer, seq_len, packing, eval_split, seed)
    total = _total_steps(rows, batch_size, grad_accum, max_steps, epochs)
    compiled, _, _ = _compile_plan(s, compile, total, lora_cfg, batch_size, seq_len, gradient_checkpointing)
    from ..memory.estimate import for_session
    return for_session(s, **_estimate_settings(rows, batch_size, lora_cfg, gradient_checkpointing, compiled))


def _check(session, data, lora, max_steps, epochs, learning_rate, batch_size, grad_accum, seq_len,
           gradient_checkpointing, output_dir, log_every, save_every, compile, seed, eval_data, eval_split,
           eval_every, stop_at_loss, patience, resume):
    s = session if session is not None else current_session()
    require(isinstance(s, Session), f"session must be an nvkit.Session (from nvkit.load), not {type(s).__name__}.")
    s._require_loaded()
    require(data is not None, "finetune needs data: a list of examples or a path to a .jsonl/.json/.csv/.txt file.")
    lora_cfg = check_lora(DEFAULT_LORA if lora is None else lora)
    positive_int("max_steps", max_steps, allow_none=True)
    require(epochs is None or (isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and epochs > 0),
            f"epochs must be > 0, not {epochs!r}.")
    require(max_steps is None or epochs is None, "Give max_steps or epochs, not both.")
    require(isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool) and 0 < learning_rate < 1,
            f"learning_rate must be a number in (0, 1), e.g. 2e-4, not {learning_rate!r}.")
    for name, v in (("batch_size", batch_size), ("grad_accum", grad_accum), ("seq_len", seq_len),
                    ("log_every", log_every)):
        positive_int(name, v)
    positive_int("save_every", save_every, allow_none=True)
    require(isinstance(gradient_checkpointing, bool), f"gradient_checkpointing must be True or False, not {gradient_checkpointing!r}.")
    require(compile is True or compile is False or compile == "auto",
            f"compile must be True, False or 'auto', not {compile!r}.")
    require(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0,
            f"seed must be a whole number ≥ 0, not {seed!r}.")
    require(output_dir is None or (isinstance(output_dir, (str, os.PathLike)) and str(output_dir).strip()),
            f"output_dir must be a folder path, not {output_dir!r}.")
    require(eval_data is None or eval_split is None, "Give eval_data or eval_split, not both.")
    if eval_split is not None:
        require(isinstance(eval_split, (int, float)) and not isinstance(eval_split, bool) and 0 < eval_split < 1,
                f"eval_split must be a fraction in (0, 1), e.g. 0.05, not {eval_split!r}.")
    has_eval = eval_data is not None or eval_split is not None
    positive_int("eval_every", eval_every, allow_none=True)
    _number("stop_at_loss", stop_at_loss)
    positive_int("patience", patience, allow_none=True)
    for name, v in (("eval_every", eval_every), ("stop_at_loss", stop_at_loss), ("patience", patience)):
        require(v is None or has_eval, f"{name} needs held-out data: add eval_split=0.05 (or eval_data=...).")
    require(patience is None or eval_every is not None,
            "patience counts evaluations during the run: give eval_every=N as well.")
    require(resume is True or resume is False or isinstance(resume, (str, os.PathLike)),
            f"resume must be True, False or the path of a checkpoint folder, not {resume!r}.")
    if s.busy:
        raise NvkitError("A generation is running in this session: wait for it or call s.stop() first.")
    if s.training is not None and not s.training.done:
        raise NvkitError("A fine-tune is already running in this session: run.stop() it or wait for it.")
    return s, lora_cfg


def finetune(session=None, data=None, lora: dict | None = None, max_steps: int | None = None,
             epochs: float | None = None, learning_rate: float = 2e-4, batch_size: int = 8, grad_accum: int = 1,
             seq_len: int = 512, packing="auto", gradient_checkpointing: bool = False,
             output_dir: str | None = None, liger="auto", log_every: int = 1, save_every: int | None = None,
             compile="auto", seed: int = 0, *, eval_data=None, eval_split: float | None = None,
             eval_every: int | None = None, stop_at_loss: float | None = None, patience: int | None = None,
             resume=False, precision: str | None = None, **settings) -> FinetuneRun:
    """Train LoRA adapters on the session's model (QLoRA when it is loaded in 4/8-bit), in a worker
    thread; returns a ``FinetuneRun`` at once. After it ends the session generates with the adapter.

    ``data``: a list of strings, of {"prompt", "response"}, of chat messages, or a local
    .jsonl/.json/.csv/.txt file. Everything is checked before training starts
    (``nvkit.train.data.preview`` shows what the model will see).
    ``max_steps`` or ``epochs`` (default: one epoch). ``packing="auto"`` packs plain text, not
    supervised pairs. ``compile="auto"`` compiles the decoder layers on CUDA when the run is long
    enough to pay for it (``run.info["compile_reason"]`` says why or why not). ``save_every=N``
    writes resumable checkpoint-N folders beside the final ``adapter``; Stop and Interrupt write one
    too. Evaluation: ``eval_data`` (same shapes as ``data``) or ``eval_split=0.05`` (held out of
    ``data``), loss and perplexity before the first step, every ``eval_every`` steps and at the end
    (``run.eval_history``); ``stop_at_loss=`` ends the run once the eval loss reaches it,
    ``patience=N`` after N evaluations without improvement. ``resume=True`` continues the latest
    checkpoint of ``output_dir`` (or of this session's last run), ``resume="…/checkpoint-N"`` that
    one: optimizer, schedule, data order and step count go on exactly (``max_steps`` is the total).
    ``precision``: "bf16", "fp16" (with loss scaling) or "fp32"; None picks bf16 on Ampere and newer,
    fp16 on older GPUs, fp32 on the CPU (``run.info["precision"]``).
    """
    if settings:
        raise _unknown_settings(settings)
    s, lora_cfg = _check(session, data, lora, max_steps, epochs, learning_rate, batch_size, grad_accum, seq_len,
                         gradient_checkpointing, output_dir, log_every, save_every, compile, seed, eval_data,
                         eval_split, eval_every, stop_at_loss, patience, resume)
    tok = s.tokenizer
    train_data.check_seq_len(seq_len)
    train_data.check_packing(packing)
    rows, data_info, kind, held = _training_rows(data, tok, seq_len, packing, eval_split, seed)
    eval_info = None
    eval_rows: list = []
    if eval_split is not None:
        eval_rows, eval_info = train_data.arrange(held, kind, seq_len, packing)
        eval_info = {"from": f"eval_split={eval_split}", **eval_info}
    elif eval_data is not None:
        held, held_kind = train_data.tokenize(eval_data, tok, seq_len)
        eval_rows, eval_info = train_data.arrange(held, held_kind, seq_len, packing)
        eval_info = {"from": "eval_data", **eval_info}
    settings_record = {"base_model": s.path, "data": train_data.fingerprint(rows), "seq_len": seq_len,
                       "batch_size": batch_size, "grad_accum": grad_accum, "packing": data_info["packing"],
                       "lora": lora_cfg, "learning_rate": float(learning_rate), "seed": seed,
                       "max_steps": max_steps, "epochs": epochs}

    out = check_output_dir(output_dir, create=False) if output_dir is not None else None
    resume_from, resume_notes, first_step = None, [], 0
    if resume is not False:
        previous = s.training.info.get("output_dir") if s.training is not None else None
        resume_from = ckpts.find(resume, out, previous)
        resume_notes = ckpts.check_settings(resume_from, settings_record, max_steps)
        first_step = ckpts.step_of(resume_from)
        if out is None:
            out = check_output_dir(os.path.dirname(resume_from), create=False)

    import torch
    device = s.device
    device_type = device.type
    capability = torch.cuda.get_device_capability(device) if device_type == "cuda" else None
    prec = choose_precision(device_type, capability, precision)
    model_type = getattr(s.model.config, "model_type", "")
    use_liger, liger_why = liger_decision(liger, device_type, model_type)
    out = make_folder(out, "output_dir") if out is not None else default_output_dir(s)
    adapter_dir = os.path.join(out, "adapter")
    total = _total_steps(rows, batch_size, grad_accum, max_steps, epochs)
    do_compile, compile_why, cache = _compile_plan(s, compile, total - first_step, lora_cfg, batch_size, seq_len,
                                                   gradient_checkpointing)
    if do_compile and use_liger:
        # compiled layers already fuse norms and SwiGLU; Liger's Triton calls would only break the graphs
        use_liger, liger_why = False, "off: compiled decoder layers fuse RMSNorm/SwiGLU themselves (compile=False to use Liger)"
    info = {"base_model": s.model_id, "base_path": s.path, "precision": prec, "capability": capability,
            "device": str(device), "qlora": False, "lora": lora_cfg, "liger": liger_why, "compile": do_compile,
            "compile_reason": compile_why, "data": data_info, "eval": eval_info,
            "gradient_checkpointing": gradient_checkpointing, "output_dir": out, "learning_rate": float(learning_rate),
            "batch_size": batch_size, "grad_accum": grad_accum, "seq_len": seq_len,
            "resumed_from": resume_from, "notes": list(resume_notes)}
    run = FinetuneRun(total, adapter_dir, info, first_step=first_step)
    counter = {"tokens": 0}
    pad_to = _pad_to(do_compile)
    # the prediction drawn beside the measured peak, the one run_estimate gives for these settings
    run.estimate = peaks.expect_for(s, **_estimate_settings(rows, batch_size, lora_cfg, gradient_checkpointing,
                                                             do_compile))
    events.record("train-start", f"LoRA r={lora_cfg['r']} on {s.model_id}: {counted(total, 'step')}, {prec}"
                                 + (f", resumed at step {first_step}" if resume_from else ""))

    def work(job: Job):
        with routed():  # Trainer's first import brings in peft and bitsandbytes (see nvkit.quiet)
            NvkitTrainer = trainer_class()
        model, kbit, notes = prepare_lora_model(s.model, lora_cfg, gradient_checkpointing)
        info["qlora"] = kbit
        info["notes"] += notes
        s.model = model  # the session generates with the adapter from now on (even after an error)
        remember_model(run, model)
        fused, why = fused_loss_supported(model)
        info["loss"] = why
        liger_swap = apply_liger(model) if use_liger else None
        if liger_swap is not None:
            info["liger_modules"] = liger_swap.count
        if do_compile:
            if cache is not None:
                info["compile_cache"] = cache.load()
            info["compiled_layers"] = compile_layers(model)
            info["activation_budget"] = ACTIVATION_BUDGET
        if device_type == "cuda":
            # a list's KV pool (gigabytes on a large list) would sit beside the training's activations
            freed = s.decoders.release_lists()
            if freed:
                events.record("memory", f"the lists' KV pool and the merged adapter copy ({fmt_bytes(freed)}) freed "
                                        "for the fine-tune; the next list and the next request with an adapter "
                                        "make them again")
            torch.cuda.reset_peak_memory_stats(device)
        # Trainer writes its checkpoints here; the callback moves each one into place (checkpoint-N)
        staging = tempfile.mkdtemp(prefix=".nvkit-trainer-", dir=out)
        args = training_arguments(staging, prec, device_type, max_steps=max_steps, epochs=epochs,
                                  learning_rate=float(learning_rate), batch_size=batch_size, grad_accum=grad_accum,
                                  log_every=log_every, seed=seed, gradient_checkpointing=gradient_checkpointing,
                                  fused_adamw=device_type == "cuda")
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        evaluator = Evaluator(eval_rows, batch_size, pad, device, pad_to=pad_to) if eval_rows else None
        callback = recorder(run, job, device_type=device_type, counter=counter, save_every=save_every,
                            output_dir=out, staging=staging, evaluator=evaluator, eval_every=eval_every,
                            stop_at_loss=stop_at_loss, patience=patience,
                            checkpoint_facts=lambda: {**run.facts(), "settings": settings_record})
        # Trainer sets the model's config.use_cache to TrainingArguments.use_cache (False) and leaves
        # it so; the session's model keeps its own setting (and its memory estimate's cached shape)
        use_cache = getattr(model.config, "use_cache", None)
        with routed():  # building the Trainer is where DeepSpeed, when installed, first looks for a GPU
            trainer = NvkitTrainer(model=model, args=args, train_dataset=train_data.ListDataset(rows),
                                   data_collator=train_data.Collator(pad, pad_to=pad_to), callbacks=[callback],
                                   fused_loss=fused, counter=counter)
        quiet_trainer(trainer)
        model.train()
        trained = False
        if device_type == "cpu":
            # the imports, the adapter and the trainer built above are not what the run's estimate
            # describes: on the CPU its measurement starts here (a GPU's peak holds no imports)
            peaks.cpu_work_starts("train")
        try:
            with activation_budget(do_compile):
                trainer.train(resume_from_checkpoint=resume_from)
            trained = True
        except torch.OutOfMemoryError as e:
            raise oom_error(e, "fine-tune", s) from e
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if liger_swap is not None:
                try:
                    liger_swap.undo()
                except Exception as e:  # noqa: BLE001 - the run's outcome stands: Liger's modules compute the same
                    info["notes"].append(f"Liger's modules stay on the model: putting its own back failed "
                                         f"({error_summary(e)})")
                    events.record("train", info["notes"][-1])
            if do_compile:
                uncompile_layers(model)
                if cache is not None and trained:
                    info["compile_cache"] = f"{info.get('compile_cache', '')}; {cache.save()}".lstrip("; ")
            if gradient_checkpointing and hasattr(model, "gradient_checkpointing_disable"):
                model.gradient_checkpointing_disable()
            if use_cache is not None:
                model.config.use_cache = use_cache
            model.eval()
            run.ended = time.monotonic()
            run.tokens = counter["tokens"]
            _, peak = memory_now(device_type)
            run.peak_memory = max(run.peak_memory, peak)
        save_atomic(model, adapter_dir, facts={**run.facts(), "settings": settings_record})
        events.record("checkpoint", f"adapter saved: {adapter_dir}")
        sm = run.summary()
        events.record("train-end", f"{counted(run.step, 'step')} in {sm['seconds']:.1f} s · {sm['tokens_per_s']:.0f} tok/s · "
                                   f"peak {fmt_bytes(sm['peak_memory'])}{' · stopped' if run.stopped else ''}")
        settle()  # the adapter's objects out of the garbage collector's later passes, as a load's are
        return run

    dev_index = device.index if device_type == "cuda" else None
    # Trainer, PEFT and what they bring are imported here, before the worker starts, so that the
    # worker and this thread (a chart, a cell) never import them at once (nvkit.model.imports)
    imports.for_finetune()
    run.job = run_in_worker(work, name="nvkit-finetune", device=dev_index)
    s.training = run
    return run
