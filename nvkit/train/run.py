"""``FinetuneRun`` (what ``nvkit.finetune`` returns) and the Trainer callback that fills it.

The callback runs in the worker thread at Trainer's step boundaries: it records each logged step
into ``run.history``, evaluates held-out data (before the first step, every ``eval_every`` steps,
at the end) into ``run.eval_history``, applies the stop rules (``stop_at_loss``, ``patience`` on
the eval loss), turns ``run.stop()`` (Stop, Interrupt) into "end after this step and write a
resumable checkpoint", and moves Trainer's checkpoints into place.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref

from .. import events
from ..memory.usage import memory_now
from ..model.saving import move_into_place
from ..threads import Job


#: ``patience`` counts evaluations whose loss is not below the best so far by this share of it
#: (float noise must not count as progress).
IMPROVEMENT = 1e-4


class FinetuneRun:
    """A fine-tune running in a worker thread.

    ``history``: one dict per logged step (step, loss, learning_rate, grad_norm, tokens_per_s,
    memory, t); ``eval_history``: one dict per evaluation (step, eval_loss, eval_perplexity, t);
    ``progress``: step/total/eta; ``estimate``: the memory prediction made when it started (the
    one ``nvkit.memory.comparisons()`` sets beside the measured peak); ``adapter_dir``: where the
    adapter is (written at the end, or at stop); ``checkpoints``: resumable checkpoint folders
    written so far; ``stop_reason``: why it ended early (None when it ran to the end); ``info``:
    the decisions made (precision, fused loss, Liger, compile and why, data, resume).
    ``run.result()`` blocks (Interrupt = clean stop with a checkpoint), ``await run`` keeps widgets
    served."""

    def __init__(self, total_steps: int, adapter_dir: str, info: dict, first_step: int = 0):
        self.total_steps = total_steps
        self.adapter_dir = adapter_dir
        self.info = info
        self.history: list[dict] = []
        self.eval_history: list[dict] = []
        self.checkpoints: list[str] = []
        self.first_step = first_step
        self.step = first_step
        self.started = time.monotonic()
        self.t0 = events.now()
        self.ended: float | None = None
        self.stopped = False
        self.stop_reason: str | None = None
        self.tokens = 0
        self.peak_memory = 0
        self.estimate = None   # the nvkit.Estimate of its peak the run started with (run_estimate's)
        self.job: Job | None = None
        self._listeners: list = []
        self._eval_listeners: list = []
        self._lock = threading.Lock()
        self._model = None

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
        done_here = self.step - self.first_step
        eta = None
        if 0 < done_here and self.step < self.total_steps and not self.done:
            eta = elapsed / done_here * (self.total_steps - self.step)
        return {"step": self.step, "total": self.total_steps, "elapsed_s": elapsed, "eta_s": eta,
                "fraction": min(1.0, self.step / self.total_steps) if self.total_steps else 0.0}

    @property
    def checkpoint(self) -> str | None:
        """The latest resumable checkpoint (``finetune(..., resume=run.checkpoint)``), or None."""
        return self.checkpoints[-1] if self.checkpoints else None

    def _eval(self, which: int) -> dict | None:
        evals = [e for e in self.eval_history if e.get("eval_loss") is not None]
        return evals[which] if evals else None

    def summary(self) -> dict:
        p = self.progress
        secs = p["elapsed_s"]
        before, after = self._eval(0), self._eval(-1)
        return {"steps": self.step, "seconds": round(secs, 2), "tokens": self.tokens,
                "tokens_per_s": self.tokens / secs if secs > 0 else 0.0, "peak_memory": self.peak_memory,
                "final_loss": self.history[-1]["loss"] if self.history else None,
                "eval_loss_before": before["eval_loss"] if before else None,
                "eval_loss_after": after["eval_loss"] if after else None,
                "eval_perplexity_before": before["eval_perplexity"] if before else None,
                "eval_perplexity_after": after["eval_perplexity"] if after else None,
                "adapter_dir": self.adapter_dir if os.path.isdir(self.adapter_dir) else None,
                "checkpoint": self.checkpoint, "stopped": self.stopped, "stop_reason": self.stop_reason}

    def facts(self) -> dict:
        """What this run was: the base model, LoRA settings, data, steps, precision and the
        evaluation before and after (written into the adapter's nvkit.json and an export's model
        card)."""
        i = self.info
        before, after = self._eval(0), self._eval(-1)
        return {"base_model": i.get("base_model"), "base_path": i.get("base_path"), "lora": i.get("lora"),
                "data": i.get("data"), "eval_data": i.get("eval"), "steps": self.step,
                "max_steps": self.total_steps, "learning_rate": i.get("learning_rate"),
                "batch_size": i.get("batch_size"), "grad_accum": i.get("grad_accum"), "seq_len": i.get("seq_len"),
                "precision": i.get("precision"), "qlora": i.get("qlora"), "stopped": self.stopped,
                "stop_reason": self.stop_reason, "resumed_from": i.get("resumed_from"),
                "eval_before": before, "eval_after": after}

    def trained(self, model) -> bool:
        """True when ``model`` is the model this run trained (a session's model after the run)."""
        return self._model is not None and self._model() is model

    def __repr__(self):
        p = self.progress
        state = "error" if self.error else ("stopped" if self.stopped and self.done else ("done" if self.done else "running"))
        last = self.history[-1].get("loss") if self.history else None
        loss = f" · loss {last:.4f}" if isinstance(last, float) else ""
        ev = self._eval(-1)
        if ev is not None:
            loss += f" · eval {ev['eval_loss']:.4f}"
        return f"<nvkit.FinetuneRun {state} · step {p['step']}/{p['total']}{loss} · {self.adapter_dir}>"

    # --- control -------------------------------------------------------------------------------
    def stop(self) -> None:
        """End after the current step; a resumable checkpoint and the adapter are saved. Returns at
        once."""
        if self.job is not None and not self.job.done:
            self.job.stop()
            events.record("stop", "fine-tune stopped by the user")

    def result(self, timeout: float | None = None) -> "FinetuneRun":
        """Wait for the end (blocking, in short slices: Interrupt stops cleanly, after a
        checkpoint); returns the run."""
        self.job.result(timeout)
        return self

    async def wait(self) -> "FinetuneRun":
        try:
            await self.job
        except (KeyboardInterrupt, asyncio.CancelledError):
            # The notebook's Interrupt while a cell awaits the run: stop after this step (with a
            # checkpoint) and let the worker finish before the cell ends.
            self.stop()
            self.job.wait_done(120)
            raise
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
            self.job.wait_done(120)
            raise

    def subscribe(self, fn, what: str = "step") -> None:
        """``fn(record)`` for each logged step (``what="step"``) or each evaluation
        (``what="eval"``), called in the worker thread."""
        if what not in ("step", "eval"):
            from ..errors import NvkitError
            raise NvkitError(f"what must be 'step' or 'eval', not {what!r}.")
        with self._lock:
            (self._listeners if what == "step" else self._eval_listeners).append(fn)

    def _add(self, rec: dict, what: str = "step") -> None:
        with self._lock:
            (self.history if what == "step" else self.eval_history).append(rec)
            listeners = list(self._listeners if what == "step" else self._eval_listeners)
        for fn in listeners:
            try:
                fn(rec)
            except Exception:  # noqa: BLE001 - a listener (a closed panel) must not stop the run
                pass


def recorder(run: FinetuneRun, job: Job | None, *, device_type: str, counter: dict, save_every: int | None,
             output_dir: str, staging: str, evaluator=None, eval_every: int | None = None,
             stop_at_loss: float | None = None, patience: int | None = None, checkpoint_facts=None):
    """The Trainer callback of one run (built on first use: transformers' imports are heavy)."""
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.last_t = time.monotonic()
            self.last_tokens = 0
            self.best: float | None = None
            self.bad_evals = 0
            self.evaluated_at: int | None = None

        # --- evaluation and stop rules ---------------------------------------------------------
        def _evaluate(self, step: int, model) -> dict | None:
            if evaluator is None or self.evaluated_at == step:
                return None
            self.evaluated_at = step
            res = evaluator(model)
            rec = {"step": step, **res, "t": events.now()}
            run._add(rec, "eval")
            events.record("train-eval", f"step {step} · eval loss {res['eval_loss']:.4f} · "
                                        f"perplexity {res['eval_perplexity']:.2f}")
            return rec

        def _rules(self, rec: dict | None, control) -> None:
            if rec is None:
                return
            loss = rec["eval_loss"]
            if stop_at_loss is not None and loss <= stop_at_loss:
                run.stop_reason = f"eval loss {loss:.4f} ≤ stop_at_loss {stop_at_loss}"
                control.should_training_stop = True
            if self.best is None or loss < self.best - IMPROVEMENT * abs(self.best):
                self.best, self.bad_evals = loss, 0
            else:
                self.bad_evals += 1
                if patience is not None and self.bad_evals >= patience and run.stop_reason is None:
                    run.stop_reason = (f"eval loss has not improved on {self.best:.4f} for {patience} "
                                       f"evaluation{'s' if patience > 1 else ''} (patience={patience})")
                    control.should_training_stop = True
            if run.stop_reason and control.should_training_stop:
                events.record("train-stop", run.stop_reason)

        # --- Trainer events --------------------------------------------------------------------
        def on_train_begin(self, args, state, control, model=None, **kw):
            run.total_steps = state.max_steps or run.total_steps
            run.step = run.first_step = state.global_step
            self.last_t = time.monotonic()
            run.started = self.last_t
            self._rules(self._evaluate(state.global_step, model), control)

        def on_step_end(self, args, state, control, model=None, **kw):
            run.step = state.global_step
            run.tokens = counter["tokens"]
            if eval_every and state.global_step % eval_every == 0:
                self._rules(self._evaluate(state.global_step, model), control)
            if job is not None and job.stop_event.is_set():
                run.stopped = True
                run.stop_reason = run.stop_reason or "stopped by the user"
                control.should_training_stop = True
                control.should_save = True  # Stop and Interrupt leave a resumable checkpoint
            if save_every and state.global_step % save_every == 0:
                control.should_save = True
            return control

        def on_save(self, args, state, control, **kw):
            src = os.path.join(staging, f"checkpoint-{state.global_step}")
            if not os.path.isdir(src):
                return
            target = os.path.join(output_dir, f"checkpoint-{state.global_step}")
            facts = checkpoint_facts() if checkpoint_facts is not None else {}
            move_into_place(src, target, "checkpoint", {**facts, "steps": state.global_step})
            run.checkpoints.append(target)
            events.record("checkpoint", f"step {state.global_step}: {target}")

        def on_train_end(self, args, state, control, model=None, **kw):
            run.step = state.global_step
            self._evaluate(state.global_step, model)

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" not in logs:
                return
            t = time.monotonic()
            tokens = counter["tokens"]
            rate = (tokens - self.last_tokens) / (t - self.last_t) if t > self.last_t else 0.0
            self.last_t, self.last_tokens = t, tokens
            mem, peak = memory_now(device_type)
            run.peak_memory = max(run.peak_memory, peak)
            rec = {"step": state.global_step, "loss": float(logs["loss"]),
                   "learning_rate": float(logs.get("learning_rate", float("nan"))),
                   "grad_norm": float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None,
                   "tokens_per_s": rate, "memory": mem, "t": events.now()}
            run._add(rec)
            events.record("train-step", f"step {rec['step']}/{run.total_steps} · loss {rec['loss']:.4f}")

    return Recorder()


def remember_model(run: FinetuneRun, model) -> None:
    """Let ``run.trained(model)`` recognise the model this run trained (weakly: the run must not
    keep an unloaded model alive)."""
    run._model = weakref.ref(model)
