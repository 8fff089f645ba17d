"""Multi-GPU fine-tunes: ``nvkit.launch(config)`` writes a standalone training script and runs it
with torchrun, one process per selected GPU, and streams every rank's metrics back.

A notebook kernel is one process, so DDP/FSDP over several GPUs has to run outside it. The script
is plain transformers ``Trainer`` + PEFT (no nvkit import), so the run directory can be copied to a
cluster and started there with the same shell line. Beside it: ``config.json`` (the settings) and
``data.jsonl`` (the examples, already tokenized and checked in the notebook by ``nvkit.data``, so a
bad example fails here in a second instead of on every rank after the model loaded).

Each rank prints JSON lines (``{"nvkit": 1, "rank": r, ...}``); torchrun's ``--tee`` prefixes them
with the rank and also writes per-rank log files under ``logs/``. ``LaunchRun.stop()`` writes a
``STOP`` file that every rank reads at the end of a step and agrees on through an all-reduce (so no
rank is left waiting in a collective), the adapter is saved, and the process group exits; if it has
not exited after ``grace`` seconds, the whole group gets SIGTERM, then SIGKILL.

Multi-node (documented, not testable here): run the same line on every node with
``nnodes=N, node_rank=i, rdzv_endpoint="host:29500"`` (rendezvous backend c10d), e.g.
``nvkit.launch(cfg, nproc_per_node=8, nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29500", start=False)``
gives ``run.command`` to paste on node 0, and ``node_rank=1`` the one for node 1.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

from .. import events
from ..checks import positive_int
from ..errors import NvkitError, require
from ..hardware.selection import launch_command
from ..model.session import resolve_model, session as current_session
from . import data as train_data
from .finetune import DEFAULT_LORA, check_lora

_STRATEGIES = ("ddp", "fsdp")
_CONFIG_KEYS = {"model", "data", "lora", "max_steps", "epochs", "learning_rate", "batch_size", "grad_accum",
                "seq_len", "packing", "gradient_checkpointing", "seed", "log_every", "quantization"}
_RANK_PREFIX = re.compile(r"^\[(?:[A-Za-z_]*?)(\d+)\]:(.*)$")
_MAX_LOG_LINES = 5000

SCRIPT = r'''#!/usr/bin/env python
"""LoRA fine-tune written by nvkit.launch: transformers Trainer + PEFT, one process per GPU.

Run it with (the line nvkit showed):
    {command}
Multi-node: the same line on every node, with torchrun options
    --nnodes=N --node_rank=I --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT
Settings: config.json beside this file. Data: data.jsonl (tokenized: input_ids, labels; -100 = no loss).
Every rank prints JSON lines {{"nvkit": 1, "rank": ...}}; touch STOP beside this file to end the run
after the current step (all ranks agree on it), the adapter is saved to adapter/ either way.
"""
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import (AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainerCallback,
                          TrainingArguments)
from transformers.trainer_callback import PrinterCallback, ProgressCallback

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "config.json"), encoding="utf-8") as f:
    CFG = json.load(f)
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD = int(os.environ.get("WORLD_SIZE", 1))
STOP_FILE = os.path.join(HERE, "STOP")
_stop = {{"signal": False}}


def emit(**kw):
    print(json.dumps({{"nvkit": 1, "rank": RANK, "local_rank": LOCAL_RANK, "world": WORLD, "t": time.time(), **kw}}),
          flush=True)


def _on_term(signum, frame):
    _stop["signal"] = True  # end after this step, like the STOP file


signal.signal(signal.SIGTERM, _on_term)


def load_rows():
    rows = []
    with open(os.path.join(HERE, "data.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows.append({{"input_ids": r["input_ids"], "labels": r["labels"]}})
    return rows


class Collate:
    def __init__(self, pad_id):
        self.pad_id = pad_id

    def __call__(self, batch):
        n = max(len(b["input_ids"]) for b in batch)
        n = -(-n // 8) * 8
        ids = torch.full((len(batch), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), n), -100, dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, :len(b["input_ids"])] = torch.tensor(b["input_ids"])
            labels[i, :len(b["labels"])] = torch.tensor(b["labels"])
        # right padding only: under causal attention pads never reach real tokens, so no mask
        return {{"input_ids": ids, "labels": labels, "num_tokens": sum(len(b["input_ids"]) for b in batch)}}


class CountingTrainer(Trainer):
    tokens = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        n = inputs.pop("num_tokens", 0)
        CountingTrainer.tokens += int(n)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)


class Stream(TrainerCallback):
    def __init__(self, cuda):
        self.cuda = cuda
        self.t = time.time()
        self.tokens = 0

    def _memory(self):
        if self.cuda:
            return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return rss, rss

    def on_train_begin(self, args, state, control, **kw):
        self.t = time.time()
        emit(event="start", total_steps=state.max_steps)

    def on_step_end(self, args, state, control, **kw):
        now = time.time()
        rate = (CountingTrainer.tokens - self.tokens) / max(now - self.t, 1e-9)
        self.t, self.tokens = now, CountingTrainer.tokens
        mem, peak = self._memory()
        emit(event="step", step=state.global_step, total_steps=state.max_steps, tokens_per_s=rate,
             memory=mem, peak_memory=peak)
        flag = torch.tensor([1.0 if (_stop["signal"] or os.path.exists(STOP_FILE)) else 0.0],
                            device="cuda" if self.cuda else "cpu")
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item() > 0:
            control.should_training_stop = True
            emit(event="stopping", step=state.global_step)
        return control

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {{}}
        if "loss" in logs:
            emit(event="log", step=state.global_step, loss=float(logs["loss"]),
                 learning_rate=float(logs.get("learning_rate", 0.0)),
                 grad_norm=float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None)


def main():
    cuda = torch.cuda.is_available() and CFG.get("device", "cuda") == "cuda"
    if cuda:
        torch.cuda.set_device(LOCAL_RANK)  # the current device is per process (and per thread)
        cap = torch.cuda.get_device_capability(LOCAL_RANK)
        prec = "bf16" if cap >= (8, 0) else "fp16"  # is_bf16_supported() can say True before Ampere
    else:
        prec = "fp32"
    dtype = {{"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}}[prec]
    kw = dict(dtype=dtype, attn_implementation=CFG.get("attn_implementation", "sdpa"))
    quant = CFG.get("quantization")
    if quant in ("nf4", "fp4"):
        kw["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant,
                                                       bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
    if cuda and CFG["strategy"] == "ddp":
        kw["device_map"] = {{"": LOCAL_RANK}}
    model = AutoModelForCausalLM.from_pretrained(CFG["model"], **kw)
    gc_on = bool(CFG.get("gradient_checkpointing"))
    if quant:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gc_on,
                                                gradient_checkpointing_kwargs={{"use_reentrant": False}})
    elif gc_on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": False}})
    lora = CFG["lora"]
    tm = lora["target_modules"]
    model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                             target_modules=tm if tm == "all-linear" else list(tm),
                                             task_type="CAUSAL_LM"))
    args = dict(output_dir=os.path.join(HERE, "trainer"), per_device_train_batch_size=CFG["batch_size"],
                gradient_accumulation_steps=CFG["grad_accum"], learning_rate=CFG["learning_rate"],
                logging_steps=CFG["log_every"], save_strategy="no", report_to="none", disable_tqdm=True,
                seed=CFG["seed"], remove_unused_columns=False, bf16=prec == "bf16", fp16=prec == "fp16",
                use_cpu=not cuda, ddp_backend="nccl" if cuda else "gloo", ddp_find_unused_parameters=False,
                dataloader_num_workers=0)
    if CFG.get("max_steps"):
        args["max_steps"] = CFG["max_steps"]
    else:
        args["num_train_epochs"] = float(CFG.get("epochs") or 1)
    if CFG["strategy"] == "fsdp":
        layer_cls = type(model.get_base_model().get_decoder().layers[0]).__name__
        args["fsdp"] = "full_shard auto_wrap"
        args["fsdp_config"] = {{"fsdp_version": 2, "transformer_layer_cls_to_wrap": [layer_cls],
                               "reshard_after_forward": True}}
    pad = CFG.get("pad_token_id")
    trainer = CountingTrainer(model=model, args=TrainingArguments(**args), train_dataset=load_rows(),
                              data_collator=Collate(0 if pad is None else pad), callbacks=[Stream(cuda)])
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    # written to a temporary directory, renamed into place: never a half-written adapter
    tmp = os.path.join(HERE, ".adapter-tmp")
    if RANK == 0 and os.path.exists(tmp):
        shutil.rmtree(tmp)
    trainer.save_model(tmp)  # collective under FSDP; writes on rank 0 only
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if RANK == 0:
        target = os.path.join(HERE, "adapter")
        if os.path.exists(target):
            old = tempfile.mkdtemp(dir=HERE, prefix=".adapter-old-")
            os.replace(target, os.path.join(old, "a"))
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
        emit(event="saved", adapter_dir=target)
    emit(event="done", step=trainer.state.global_step)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: on the CPU (gloo) a rank once hung for good in
    # ~ProcessGroupGloo while the DDP reducer was garbage-collected at exit, after everything had
    # been saved. Nothing is left to write: the adapter is in place and the logs are flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
'''


class LaunchRun:
    """A torchrun process group started by ``nvkit.launch``.

    ``history``: metric dicts from every rank (``rank``, ``event`` = step/log/..., ``step``, ``loss``,
    ``tokens_per_s``, ``memory``...); ``logs``: (rank or None, line) pairs, bounded; ``command``: the
    shell line; ``run_dir``: script, config, data, per-rank logs and the adapter."""

    EXIT_GRACE = 60.0  # seconds between the last rank's "done" and ending a group that does not exit

    def __init__(self, command: str, argv: list, env: dict, run_dir: str, total_steps: int):
        self.command = command
        self.run_dir = run_dir
        self.adapter_dir = os.path.join(run_dir, "adapter")
        self.total_steps = total_steps
        self.history: list[dict] = []
        self.logs: collections.deque = collections.deque(maxlen=_MAX_LOG_LINES)
        self._argv, self._env = argv, env
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.stopped = False
        self._done = threading.Event()
        self._listeners: list = []
        self._lock = threading.Lock()
        # Every rank said "done" (adapter saved) but the group had not exited EXIT_GRACE s later:
        # nvkit ended it, and the run counts as finished (see _reap_after_done).
        self.ended_after_done = False
        self._done_ranks: set = set()

    # --- process -----------------------------------------------------------------------------
    def start(self) -> "LaunchRun":
        require(self.proc is None, "This launch has already been started.")
        log_dir = os.path.join(self.run_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        self.proc = subprocess.Popen(self._argv, env=self._env, cwd=self.run_dir, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                     start_new_session=True)  # its own process group: stop() reaches every rank
        threading.Thread(target=self._read, name="nvkit-launch-reader", daemon=True).start()
        events.record("launch", self.command)
        return self

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                self._line(line.rstrip("\n"))
        finally:
            self.returncode = self.proc.wait()
            events.record("launch-end", f"exit {self.returncode}{' (stopped)' if self.stopped else ''}")
            self._done.set()

    def _line(self, line: str) -> None:
        rank = None
        m = _RANK_PREFIX.match(line)
        if m:
            rank, line = int(m.group(1)), m.group(2)
        text = line.strip()
        if text.startswith("{") and '"nvkit"' in text:
            try:
                rec = json.loads(text)
            except ValueError:
                rec = None
            if isinstance(rec, dict) and rec.get("nvkit") == 1:
                rec.pop("nvkit", None)
                with self._lock:
                    self.history.append(rec)
                    listeners = list(self._listeners)
                if rec.get("event") == "done":
                    self._rank_done(rec)
                if rec.get("event") == "log" and rec.get("rank") == 0:
                    events.record("train-step", f"launch step {rec.get('step')} · loss {rec.get('loss', float('nan')):.4f}")
                for fn in listeners:
                    try:
                        fn(rec)
                    except Exception:
                        pass
                return
        self.logs.append((rank, line))

    def _rank_done(self, rec: dict) -> None:
        if rec.get("rank") in self._done_ranks:
            return  # a repeated line must not start a second reaper
        self._done_ranks.add(rec.get("rank"))
        world = rec.get("world")
        if isinstance(world, int) and len(self._done_ranks) == world:
            threading.Thread(target=self._reap_after_done, name="nvkit-launch-reap", daemon=True).start()

    def _reap_after_done(self) -> None:
        """A process group that hangs on its way out must not hold the notebook: once every rank has
        finished and saved, wait EXIT_GRACE seconds for the exit, then end the group ourselves."""
        if self._done.wait(self.EXIT_GRACE):
            return
        self.ended_after_done = True
        events.record("launch", f"every rank finished and the adapter is saved, but the process group had not exited "
                                f"{self.EXIT_GRACE:g} s later (a teardown hang); nvkit ended it")
        self._signal(signal.SIGTERM)
        if not self._done.wait(15):
            self._signal(signal.SIGKILL)

    def subscribe(self, fn) -> None:
        """``fn(record)`` for each metric line, called in the reader thread."""
        with self._lock:
            self._listeners.append(fn)

    # --- state -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def ranks(self) -> list[int]:
        return sorted({r["rank"] for r in self.history if "rank" in r})

    @property
    def progress(self) -> dict:
        steps = [r["step"] for r in self.history if r.get("event") == "step" and r.get("rank") == 0]
        return {"step": steps[-1] if steps else 0, "total": self.total_steps}

    def text(self, last: int = 50) -> str:
        """The last ``last`` log lines, rank-prefixed."""
        lines = list(self.logs)[-last:]
        return "\n".join(f"[{r}] {t}" if r is not None else t for r, t in lines)

    def __repr__(self):
        state = f"exit {self.returncode}" if self.done else "running"
        return f"<nvkit.LaunchRun {state} · ranks {self.ranks} · step {self.progress['step']}/{self.total_steps} · {self.run_dir}>"

    # --- control -----------------------------------------------------------------------------
    def stop(self, grace: float = 60.0) -> None:
        """End after the current step on every rank (adapter saved); if the group has not exited
        after ``grace`` seconds, SIGTERM then SIGKILL the whole process group. Returns at once."""
        if self.proc is None or self.done:
            return
        self.stopped = True
        with open(os.path.join(self.run_dir, "STOP"), "w") as f:
            f.write("stop\n")
        events.record("stop", "launch stopped by the user")

        def escalate():
            if self._done.wait(grace):
                return
            self._signal(signal.SIGTERM)
            if self._done.wait(15):
                return
            self._signal(signal.SIGKILL)

        threading.Thread(target=escalate, name="nvkit-launch-stop", daemon=True).start()

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def result(self, timeout: float | None = None) -> "LaunchRun":
        """Wait for the end (Interrupt stops the group cleanly); NvkitError if it failed."""
        try:
            waited = 0.0
            while not self._done.wait(0.05):
                waited += 0.05
                if timeout is not None and waited >= timeout:
                    raise TimeoutError(f"launch still running after {timeout} s")
        except KeyboardInterrupt:
            self.stop(grace=30)
            self._done.wait(60)
            raise
        self._check()
        return self

    async def wait(self) -> "LaunchRun":
        import asyncio
        while not self._done.is_set():
            await asyncio.sleep(0.05)
        self._check()
        return self

    def __await__(self):
        return self.wait().__await__()

    def _check(self) -> None:
        if self.returncode not in (0, None) and not self.stopped and not self.ended_after_done:
            raise NvkitError(f"The launched run failed (exit {self.returncode}). Last lines:\n{self.text(30)}\n"
                             f"Per-rank logs: {os.path.join(self.run_dir, 'logs')}")


def _config(config, overrides: dict) -> dict:
    require(config is None or isinstance(config, dict),
            f"config must be a dict of fine-tune settings (model, data, lora, max_steps, ...), not {type(config).__name__}.")
    cfg = {**(config or {}), **overrides}
    unknown = set(cfg) - _CONFIG_KEYS
    require(not unknown, f"Unknown launch setting(s) {sorted(unknown)}; known: {', '.join(sorted(_CONFIG_KEYS))}.")
    model = cfg.get("model")
    if model is None or hasattr(model, "model_id"):  # a Session, or the current one
        s = model if model is not None else current_session()
        model = s.path
        cfg.setdefault("quantization", s.quantization if isinstance(s.quantization, str) else None)
    path, is_local = resolve_model(model)
    cfg["model"] = path
    require(cfg.get("data") is not None, "launch needs data: config['data'] = a list of examples or a local file.")
    cfg["lora"] = check_lora(cfg.get("lora") or DEFAULT_LORA)
    for key, default in (("batch_size", 8), ("grad_accum", 1), ("seq_len", 512), ("log_every", 1), ("seed", 0)):
        cfg.setdefault(key, default)
        positive_int(key, cfg[key]) if key != "seed" else require(isinstance(cfg[key], int), "seed must be a whole number.")
    positive_int("max_steps", cfg.get("max_steps"), allow_none=True)
    require(not (cfg.get("max_steps") and cfg.get("epochs")), "Give max_steps or epochs, not both.")
    lr = cfg.setdefault("learning_rate", 2e-4)
    require(isinstance(lr, (int, float)) and 0 < lr < 1, f"learning_rate must be in (0, 1), not {lr!r}.")
    q = cfg.get("quantization")
    require(q in (None, "nf4", "fp4"), f"quantization for a launch must be None, 'nf4' or 'fp4', not {q!r}.")
    cfg.setdefault("packing", "auto")
    cfg.setdefault("gradient_checkpointing", False)
    return cfg


def write_run(cfg: dict, run_dir: str, strategy: str, device: str, command_hint: str = "") -> dict:
    """Write script, config.json and data.jsonl into ``run_dir``; returns the data facts."""
    from transformers import AutoTokenizer
    os.makedirs(run_dir, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(cfg["model"])
    rows, facts = train_data.prepare(cfg["data"], tok, cfg["seq_len"], cfg["packing"])
    with open(os.path.join(run_dir, "data.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"input_ids": r.input_ids, "labels": r.labels}) + "\n")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    script_cfg = {k: v for k, v in cfg.items() if k != "data"}
    script_cfg.update(strategy=strategy, device=device, pad_token_id=pad, data_facts=facts)
    with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(script_cfg, f, indent=2)
    with open(os.path.join(run_dir, "train.py"), "w", encoding="utf-8") as f:
        f.write(SCRIPT.format(command=command_hint or "torchrun --nproc_per_node=N train.py"))
    return facts


def launch(config: dict | None = None, nproc_per_node: int | None = None, strategy: str = "ddp", *,
           gpus=..., nnodes: int | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
           run_dir: str | None = None, start: bool = True, **settings) -> LaunchRun:
    """Fine-tune with LoRA over several GPUs: write a training script for ``config`` and run it with
    torchrun (one process per GPU of the selection, NCCL; gloo on CPU) under the selection's
    ``CUDA_DEVICE_ORDER``/``CUDA_VISIBLE_DEVICES``. Returns a ``LaunchRun`` whose history fills
    with every rank's metrics.

    ``config``: {"model": path/id/Session (default: the current session's), "data": ..., "lora": ...,
    "max_steps": ..., "batch_size": ..., ...} (the ``nvkit.finetune`` settings; keywords work too).
    ``strategy``: "ddp" (a model copy per GPU) or "fsdp" (FSDP2, sharded). Multi-node: ``nnodes``,
    ``node_rank``, ``rdzv_endpoint="host:port"`` go on the torchrun line (run it on each node;
    ``start=False`` only writes the run and returns it with ``.command``)."""
    require(strategy in _STRATEGIES, f"strategy must be 'ddp' or 'fsdp', not {strategy!r}.")
    require(nproc_per_node is None or (isinstance(nproc_per_node, int) and not isinstance(nproc_per_node, bool)
                                       and nproc_per_node >= 1),
            f"nproc_per_node must be a whole number ≥ 1, not {nproc_per_node!r}.")
    require(nnodes is None or (isinstance(nnodes, int) and nnodes >= 1), f"nnodes must be ≥ 1, not {nnodes!r}.")
    if nnodes and nnodes > 1:
        require(isinstance(rdzv_endpoint, str) and ":" in rdzv_endpoint,
                "A multi-node launch needs rdzv_endpoint='host:port' (the rendezvous on node 0).")
        require(node_rank is not None, "A multi-node launch needs node_rank (0 on the first node, 1 on the next...).")
    cfg = _config(config, settings)
    import torch
    visible_cuda = gpus != [] and torch.cuda.is_available()
    device = "cuda" if visible_cuda else "cpu"
    if device == "cpu" and strategy == "fsdp":
        raise NvkitError("strategy='fsdp' needs CUDA GPUs (NCCL); on the CPU use strategy='ddp' (gloo).")
    run_dir = os.path.abspath(os.path.expanduser(run_dir)) if run_dir else os.path.abspath(
        os.path.join("nvkit-runs", f"launch-{time.strftime('%Y%m%d-%H%M%S')}"))
    os.makedirs(run_dir, exist_ok=True)
    script = os.path.join(run_dir, "train.py")
    torchrun_args = dict(tee=3, log_dir=os.path.join(run_dir, "logs"))
    if nnodes and nnodes > 1:
        torchrun_args.update(nnodes=nnodes, node_rank=node_rank, rdzv_backend="c10d", rdzv_endpoint=rdzv_endpoint,
                             rdzv_id=os.path.basename(run_dir))
    else:
        torchrun_args.update(standalone=True)
    kw = {} if gpus is ... else {"gpus": gpus}
    cmd = launch_command(script, nproc_per_node=nproc_per_node, **kw, **torchrun_args)
    env_vars = {**cmd.env, "NCCL_NVLS_ENABLE": "0"}  # NVLink multicast off on these machines
    line = " ".join([f"{k}={shlex.quote(str(v))}" for k, v in env_vars.items()] + [shlex.quote(a) for a in cmd.argv])
    facts = write_run(cfg, run_dir, strategy, device, line)
    n = int(next((a.split("=", 1)[1] for a in cmd.argv if a.startswith("--nproc_per_node=")), 1))
    import math
    per_rank_rows = math.ceil(facts["rows"] / n)
    total = cfg.get("max_steps") or max(1, math.ceil(math.ceil(per_rank_rows / cfg["batch_size"]) / cfg["grad_accum"]
                                                     * float(cfg.get("epochs") or 1)))
    argv = list(cmd.argv)
    if argv and argv[0] == "torchrun":
        # the kernel's own interpreter, whatever PATH holds
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    env = {**os.environ, **{k: str(v) for k, v in env_vars.items()}, "PYTHONUNBUFFERED": "1"}
    run = LaunchRun(line, argv, env, run_dir, total)
    return run.start() if start else run
