"""Short LoRA / QLoRA fine-tunes of the loaded model, in a worker thread: ``nvkit.finetune``.

The loop is transformers' ``Trainer`` (so the settings mean what the guide says they mean) with its
notebook progress bar off — it would print into whichever cell happens to run — and an nvkit
callback that records each logged step into ``FinetuneRun.history``, puts steps and checkpoints on
the event log (the memory chart draws them) and turns ``run.stop()`` into "end after this step".

Speed and memory (``nvkit bench --lora`` measures them; docs/benchmarks.md has the figures):
- the loss never materializes the full logits: ``nvkit.train.loss`` runs the LM head and
  the cross-entropy chunk by chunk and keeps only the gradient of the hidden states (the idea of
  Liger's fused linear cross-entropy, in plain torch so it also runs on CPU); with Qwen3's 152k
  vocabulary the logits and their fp32 copies are most of plain PEFT's peak;
- rows are packed (no pad FLOPs) and right-padded only, so attention keeps its causal fast path;
- on CUDA, each decoder layer is compiled (``compile="auto"``; regional, so it compiles once and
  every layer reuses it), which fuses norms, SwiGLU, RoPE, LoRA dropout and the adapter adds, and
  with an activation-memory budget (``ACTIVATION_BUDGET``) the compiler keeps only half of what
  the backward needs and recomputes the cheapest rest: selective checkpointing chosen by the
  partitioner, most of full checkpointing's memory saving at a few per cent of its cost;
- Liger's Triton RMSNorm/SwiGLU replace the eager ones when compile is off and liger is installed;
- fused AdamW on CUDA.
"""

from __future__ import annotations

import inspect
import math
import os
import tempfile
import threading
import time

from .. import events
from ..checks import positive_int
from ..errors import NvkitError, require
from ..memory import peaks
from ..memory.oom import oom_error
from ..memory.usage import memory_now
from ..model.precision import precision
from ..model.saving import check_target, make_folder, save_atomic
from ..model.session import Session, session as current_session
from ..quiet import routed
from ..threads import Job, run_in_worker
from ..units import fmt_bytes
from . import data as train_data
from .compile import ACTIVATION_BUDGET, activation_budget, compile_layers, uncompile_layers
from .lora import DEFAULT_LORA, apply_liger, check_lora, liger_decision, prepare_lora_model
from .loss import fused_loss_supported
from .trainer import quiet_trainer, trainer_class, training_arguments

# Names other modules and notebooks import from here (they moved to train.lora/compile/trainer and
# model.saving so the launch worker shares them).
__all__ = ["finetune", "FinetuneRun", "DEFAULT_LORA", "check_lora", "liger_decision", "prepare_lora_model",
           "apply_liger", "ACTIVATION_BUDGET", "activation_budget", "compile_layers", "uncompile_layers",
           "save_atomic", "training_arguments", "quiet_trainer", "trainer_classes"]


# --- the run -----------------------------------------------------------------------------------

class FinetuneRun:
    """A fine-tune running in a worker thread.

    ``history``: one dict per logged step (step, loss, learning_rate, grad_norm, tokens_per_s,
    memory, t); ``progress``: step/total/eta; ``adapter_dir``: where the adapter is (written at the
    end, or at stop); ``info``: the decisions made (precision, fused loss, Liger, compile, data).
    ``run.result()`` blocks (Interrupt = clean stop), ``await run`` keeps widgets served."""

    def __init__(self, total_steps: int, adapter_dir: str, info: dict):
        self.total_steps = total_steps
        self.adapter_dir = adapter_dir
        self.info = info
        self.history: list[dict] = []
        self.step = 0
        self.started = time.monotonic()
        self.t0 = events.now()
        self.ended: float | None = None
        self.stopped = False
        self.tokens = 0
        self.peak_memory = 0
        self.job: Job | None = None
        self._listeners: list = []
        self._lock = threading.Lock()

    # --- state ---------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.job is not None and self.job.done

    @property
    def error(self):
        return self.job.error if self.job is not None else None

    @property
    def progress(self) -> dict:
        elapsed = (self.ended or time.monotonic()) - self.started
        eta = None
        if 0 < self.step < self.total_steps and not self.done:
            eta = elapsed / self.step * (self.total_steps - self.step)
        return {"step": self.step, "total": self.total_steps, "elapsed_s": elapsed, "eta_s": eta,
                "fraction": min(1.0, self.step / self.total_steps) if self.total_steps else 0.0}

    def summary(self) -> dict:
        p = self.progress
        secs = p["elapsed_s"]
        return {"steps": self.step, "seconds": round(secs, 2), "tokens": self.tokens,
                "tokens_per_s": self.tokens / secs if secs > 0 else 0.0, "peak_memory": self.peak_memory,
                "final_loss": self.history[-1]["loss"] if self.history else None,
                "adapter_dir": self.adapter_dir if os.path.isdir(self.adapter_dir) else None,
                "stopped": self.stopped}

    def facts(self) -> dict:
        """What this run was: the base model, LoRA settings, data, steps, precision (written into
        the adapter's nvkit.json and an export's model card)."""
        i = self.info
        return {"base_model": i.get("base_model"), "base_path": i.get("base_path"), "lora": i.get("lora"),
                "data": i.get("data"), "steps": self.step, "precision": i.get("precision"),
                "qlora": i.get("qlora"), "stopped": self.stopped}

    def __repr__(self):
        p = self.progress
        state = "error" if self.error else ("stopped" if self.stopped and self.done else ("done" if self.done else "running"))
        loss = f" · loss {self.history[-1]['loss']:.4f}" if self.history and self.history[-1].get("loss") is not None else ""
        return f"<nvkit.FinetuneRun {state} · step {p['step']}/{p['total']}{loss} · {self.adapter_dir}>"

    # --- control -------------------------------------------------------------------------------
    def stop(self) -> None:
        """End after the current step; the adapter is saved. Returns at once."""
        if self.job is not None and not self.job.done:
            self.job.stop()
            events.record("stop", "fine-tune stopped by the user")

    def result(self, timeout: float | None = None) -> "FinetuneRun":
        """Wait for the end (blocking, in short slices: Interrupt stops cleanly); returns the run."""
        self.job.result(timeout)
        return self

    async def wait(self) -> "FinetuneRun":
        await self.job
        return self

    def __await__(self):
        return self.wait().__await__()

    def follow(self, poll: float = 0.1):
        """Yield each logged step (a ``history`` record) as it comes, in the calling thread, until
        the run ends. An Interrupt stops the run after its current step, waits for it, then
        re-raises, so a cell looping over this ends as interrupted with the adapter saved."""
        shown = 0
        try:
            while True:
                done = self.job.wait_done(poll)
                with self._lock:
                    new = self.history[shown:]
                shown += len(new)
                yield from new
                if done:
                    return
        except KeyboardInterrupt:
            self.stop()
            self.job.wait_done(60)
            raise

    def subscribe(self, fn) -> None:
        """``fn(record)`` for each logged step, called in the worker thread."""
        with self._lock:
            self._listeners.append(fn)

    def _add(self, rec: dict) -> None:
        with self._lock:
            self.history.append(rec)
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(rec)
            except Exception:
                pass


def trainer_classes():
    """(NvkitTrainer, Recorder), built on first use (transformers imports are heavy)."""
    from transformers import TrainerCallback

    NvkitTrainer = trainer_class()

    class Recorder(TrainerCallback):
        """History, events, stop and checkpoints; runs in the worker thread."""

        def __init__(self, run: FinetuneRun, job: Job | None, device_type: str, counter: dict,
                     save_every: int | None, checkpoint_dir: str | None):
            self.run, self.job, self.device_type, self.counter = run, job, device_type, counter
            self.save_every, self.checkpoint_dir = save_every, checkpoint_dir
            self.last_t = time.monotonic()
            self.last_tokens = 0

        def on_train_begin(self, args, state, control, **kw):
            self.run.total_steps = state.max_steps or self.run.total_steps
            self.last_t = time.monotonic()
            self.run.started = self.last_t

        def on_step_end(self, args, state, control, **kw):
            self.run.step = state.global_step
            self.run.tokens = self.counter["tokens"]
            if self.job is not None and self.job.stop_event.is_set():
                self.run.stopped = True
                control.should_training_stop = True
            if self.save_every and state.global_step % self.save_every == 0 and not control.should_training_stop:
                path = os.path.join(self.checkpoint_dir, f"checkpoint-{state.global_step}")
                save_atomic(kw["model"], path, kind="checkpoint")
                events.record("checkpoint", f"step {state.global_step}: {path}")
            return control

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" not in logs:
                return
            t = time.monotonic()
            tokens = self.counter["tokens"]
            rate = (tokens - self.last_tokens) / (t - self.last_t) if t > self.last_t else 0.0
            self.last_t, self.last_tokens = t, tokens
            mem, peak = memory_now(self.device_type)
            self.run.peak_memory = max(self.run.peak_memory, peak)
            rec = {"step": state.global_step, "loss": float(logs["loss"]),
                   "learning_rate": float(logs.get("learning_rate", float("nan"))),
                   "grad_norm": float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None,
                   "tokens_per_s": rate, "memory": mem, "t": events.now()}
            self.run._add(rec)
            events.record("train-step", f"step {rec['step']}/{self.run.total_steps} · loss {rec['loss']:.4f}")

    return NvkitTrainer, Recorder


def default_output_dir(session) -> str:
    """A new folder under ./nvkit-runs named for the model and the time, unique (mkdtemp): two
    runs started in the same second never share one."""
    name = os.path.basename(os.path.normpath(str(session.model_id))) or "model"
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    root = make_folder(os.path.abspath("nvkit-runs"), "folder for fine-tune runs")
    return tempfile.mkdtemp(prefix=f"{name}-lora-{time.strftime('%Y%m%d-%H%M%S')}-", dir=root)


def check_output_dir(output_dir) -> str:
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
    return make_folder(out, "output_dir")


def _unknown_settings(unknown: dict) -> NvkitError:
    import difflib
    known = [p for p in inspect.signature(finetune).parameters if p not in ("settings",)]
    parts = []
    for k in unknown:
        close = difflib.get_close_matches(k, known, n=1)
        parts.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return NvkitError(f"Unknown finetune setting(s) {', '.join(parts)}. Known: {', '.join(known)}.")


def finetune(session=None, data=None, lora: dict | None = None, max_steps: int | None = None,
             epochs: float | None = None, learning_rate: float = 2e-4, batch_size: int = 8, grad_accum: int = 1,
             seq_len: int = 512, packing="auto", gradient_checkpointing: bool = False,
             output_dir: str | None = None, liger="auto", log_every: int = 1, save_every: int | None = None,
             compile="auto", seed: int = 0, **settings) -> FinetuneRun:
    """Train LoRA adapters on the session's model (QLoRA when it is loaded in 4/8-bit), in a worker
    thread; returns a ``FinetuneRun`` at once. After it ends the session generates with the adapter.

    ``data``: a list of strings, of {"prompt", "response"}, of chat messages, or a local
    .jsonl/.json/.csv/.txt file. Everything is checked before training starts.
    ``max_steps`` or ``epochs`` (default: one epoch). ``packing="auto"`` packs plain text, not
    supervised pairs. ``compile="auto"`` compiles the decoder layers on CUDA. ``save_every=N``
    writes checkpoint-N directories (atomically) beside the final ``adapter``.
    """
    if settings:
        raise _unknown_settings(settings)
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
    positive_int("batch_size", batch_size)
    positive_int("grad_accum", grad_accum)
    positive_int("seq_len", seq_len)
    positive_int("log_every", log_every)
    positive_int("save_every", save_every, allow_none=True)
    require(isinstance(gradient_checkpointing, bool), f"gradient_checkpointing must be True or False, not {gradient_checkpointing!r}.")
    require(compile is True or compile is False or compile == "auto",
            f"compile must be True, False or 'auto', not {compile!r}.")
    require(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0,
            f"seed must be a whole number ≥ 0, not {seed!r}.")
    require(output_dir is None or (isinstance(output_dir, (str, os.PathLike)) and str(output_dir).strip()),
            f"output_dir must be a folder path, not {output_dir!r}.")
    if s.busy:
        raise NvkitError("A generation is running in this session: wait for it or call s.stop() first.")
    if s.training is not None and not s.training.done:
        raise NvkitError("A fine-tune is already running in this session: run.stop() it or wait for it.")

    rows, data_info = train_data.prepare(data, s.tokenizer, seq_len, packing)
    out = check_output_dir(output_dir) if output_dir is not None else None

    import torch
    device = s.device
    device_type = device.type
    capability = torch.cuda.get_device_capability(device) if device_type == "cuda" else None
    prec = precision(device_type, capability)
    model_type = getattr(s.model.config, "model_type", "")
    use_liger, liger_why = liger_decision(liger, device_type, model_type)
    do_compile = (device_type == "cuda") if compile == "auto" else bool(compile)
    if do_compile and use_liger:
        # compiled layers already fuse norms and SwiGLU; Liger's Triton calls would only break the graphs
        use_liger, liger_why = False, "off: compiled decoder layers fuse RMSNorm/SwiGLU themselves (compile=False to use Liger)"
    out = out or default_output_dir(s)
    adapter_dir = os.path.join(out, "adapter")

    per_epoch = math.ceil(math.ceil(len(rows) / batch_size) / grad_accum)
    total = max_steps if max_steps is not None else max(1, math.ceil(per_epoch * float(epochs or 1)))
    info = {"base_model": s.model_id, "base_path": s.path, "precision": prec, "capability": capability, "device": str(device), "qlora": False,
            "lora": lora_cfg, "liger": liger_why, "compile": do_compile, "data": data_info,
            "gradient_checkpointing": gradient_checkpointing, "output_dir": out}
    run = FinetuneRun(total, adapter_dir, info)
    counter = {"tokens": 0}
    peaks.expect_finetune(s, batch_size, seq_len, lora_cfg["r"], gradient_checkpointing)  # drawn beside the measured peak
    events.record("train-start", f"LoRA r={lora_cfg['r']} on {s.model_id}: {total} steps, {prec}")

    def work(job: Job):
        with routed():  # Trainer's first import brings in peft and bitsandbytes (see nvkit.quiet)
            NvkitTrainer, Recorder = trainer_classes()
        model, kbit, notes = prepare_lora_model(s.model, lora_cfg, gradient_checkpointing)
        info["qlora"] = kbit
        info["notes"] = notes
        s.model = model  # the session generates with the adapter from now on (even after an error)
        fused, why = fused_loss_supported(model)
        info["loss"] = why
        if use_liger:
            info["liger_modules"] = apply_liger(model)
        if do_compile:
            info["compiled_layers"] = compile_layers(model)
            info["activation_budget"] = ACTIVATION_BUDGET
        if device_type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        args = training_arguments(out, prec, device_type, max_steps=max_steps, epochs=epochs,
                                  learning_rate=float(learning_rate), batch_size=batch_size, grad_accum=grad_accum,
                                  log_every=log_every, seed=seed, gradient_checkpointing=gradient_checkpointing,
                                  fused_adamw=device_type == "cuda")
        pad = s.tokenizer.pad_token_id if s.tokenizer.pad_token_id is not None else (s.tokenizer.eos_token_id or 0)
        # compiled layers see a few padded shapes rather than one per batch length
        collator = train_data.Collator(pad, pad_to=64 if do_compile else 8)
        recorder = Recorder(run, job, device_type, counter, save_every, out)
        trainer = NvkitTrainer(model=model, args=args, train_dataset=train_data.ListDataset(rows), data_collator=collator,
                               callbacks=[recorder], fused_loss=fused, counter=counter)
        quiet_trainer(trainer)
        model.train()
        try:
            with activation_budget(do_compile):
                trainer.train()
        except torch.OutOfMemoryError as e:
            raise oom_error(e, "fine-tune", s) from e
        finally:
            if do_compile:
                uncompile_layers(model)
            if gradient_checkpointing and hasattr(model, "gradient_checkpointing_disable"):
                model.gradient_checkpointing_disable()
            model.eval()
            run.ended = time.monotonic()
            run.tokens = counter["tokens"]
            _, peak = memory_now(device_type)
            run.peak_memory = max(run.peak_memory, peak)
        save_atomic(model, adapter_dir, facts=run.facts())
        events.record("checkpoint", f"adapter saved: {adapter_dir}")
        sm = run.summary()
        events.record("train-end", f"{run.step} steps in {sm['seconds']:.1f} s · {sm['tokens_per_s']:.0f} tok/s · "
                                   f"peak {fmt_bytes(sm['peak_memory'])}{' · stopped' if run.stopped else ''}")
        return run

    dev_index = device.index if device_type == "cuda" else None
    run.job = run_in_worker(work, name="nvkit-finetune", device=dev_index)
    s.training = run
    return run
