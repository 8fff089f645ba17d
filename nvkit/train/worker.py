"""The training program every rank of ``nvkit.launch`` runs:
``python -m torch.distributed.run [torchrun options] -m nvkit.train.worker RUN_DIR``.

It reads ``RUN_DIR/config.json`` (the settings) and ``RUN_DIR/data.jsonl`` (the examples, already
tokenized and checked in the notebook) and trains LoRA adapters with the pieces ``nvkit.finetune``
uses in the kernel: the precision choice (``nvkit.model.precision``), the LoRA/QLoRA preparation
(``nvkit.train.lora``), the collator (``nvkit.train.data``), the trainer with the fused loss
(``nvkit.train.trainer``) and the atomic adapter save (``nvkit.model.saving``). Nothing of the
user's is pasted into Python source: the run folder is a command-line argument.

Each rank prints JSON lines (``{"nvkit": 1, "rank": r, "event": ...}``) that ``LaunchRun`` reads.
A ``STOP`` file in the run folder (or SIGTERM) ends the run after the current step: every rank
reads it at the end of a step and they agree through an all-reduce, so no rank is left waiting in a
collective. The adapter is saved to ``RUN_DIR/adapter`` either way.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

USAGE = "usage: python -m torch.distributed.run [torchrun options] -m nvkit.train.worker RUN_DIR"


class Emitter:
    """Prints one JSON metric line per call, tagged with this process's rank."""

    def __init__(self, rank: int, local_rank: int, world: int):
        self.rank, self.local_rank, self.world = rank, local_rank, world

    def __call__(self, **kw) -> None:
        print(json.dumps({"nvkit": 1, "rank": self.rank, "local_rank": self.local_rank, "world": self.world,
                          "t": time.time(), **kw}), flush=True)


def read_config(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def read_rows(run_dir: str) -> list:
    from .data import Example
    rows = []
    with open(os.path.join(run_dir, "data.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                rows.append(Example(r["input_ids"], r["labels"]))
    return rows


def _stream_callback(emit, cuda: bool, counter: dict, stop_file: str, stop_flag: dict):
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    from ..memory.usage import memory_now

    class Stream(TrainerCallback):
        def __init__(self):
            self.t = time.time()
            self.tokens = 0

        def on_train_begin(self, args, state, control, **kw):
            self.t = time.time()
            emit(event="start", total_steps=state.max_steps)

        def on_step_end(self, args, state, control, **kw):
            now = time.time()
            rate = (counter["tokens"] - self.tokens) / max(now - self.t, 1e-9)
            self.t, self.tokens = now, counter["tokens"]
            mem, peak = memory_now("cuda" if cuda else "cpu")
            emit(event="step", step=state.global_step, total_steps=state.max_steps, tokens_per_s=rate,
                 memory=mem, peak_memory=peak)
            flag = torch.tensor([1.0 if (stop_flag["signal"] or os.path.exists(stop_file)) else 0.0],
                                device="cuda" if cuda else "cpu")
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if flag.item() > 0:
                control.should_training_stop = True
                emit(event="stopping", step=state.global_step)
            return control

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" in logs:
                emit(event="log", step=state.global_step, loss=float(logs["loss"]),
                     learning_rate=float(logs.get("learning_rate", 0.0)),
                     grad_norm=float(logs["grad_norm"]) if logs.get("grad_norm") is not None else None)

    return Stream()


def train(run_dir: str) -> None:
    """Train on this rank from the run folder (see the module doc)."""
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    emit = Emitter(rank, local_rank, world)
    stop_flag = {"signal": False}

    def on_term(signum, frame):
        stop_flag["signal"] = True  # end after this step, like the STOP file

    signal.signal(signal.SIGTERM, on_term)
    cfg = read_config(run_dir)

    import torch
    import torch.distributed as dist

    from ..model.precision import precision
    from ..model.quant import quantization_config
    from ..model.saving import save_atomic
    from ..quiet import routed
    from .data import Collator, ListDataset
    from .lora import prepare_lora_model
    from .loss import fused_loss_supported
    from .trainer import quiet_trainer, trainer_class, training_arguments

    with routed():  # Trainer's first import brings in peft and bitsandbytes (see nvkit.quiet)
        from transformers import AutoModelForCausalLM
        NvkitTrainer = trainer_class()
    cuda = torch.cuda.is_available() and cfg.get("device", "cuda") == "cuda"
    device_type = "cuda" if cuda else "cpu"
    capability = None
    if cuda:
        torch.cuda.set_device(local_rank)  # the current device is per process (and per thread)
        capability = torch.cuda.get_device_capability(local_rank)
    prec = precision(device_type, capability)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[prec]
    kw = dict(dtype=dtype, attn_implementation=cfg.get("attn_implementation", "sdpa"))
    quant = cfg.get("quantization")
    if quant:
        kw["quantization_config"] = quantization_config(quant, dtype, device_type)
    if cuda and cfg["strategy"] == "ddp":
        kw["device_map"] = {"": local_rank}
    with routed():
        model = AutoModelForCausalLM.from_pretrained(cfg["model"], **kw)
    model, _, _ = prepare_lora_model(model, cfg["lora"], bool(cfg.get("gradient_checkpointing")))
    fused, _ = fused_loss_supported(model)

    extra = dict(ddp_backend="nccl" if cuda else "gloo", ddp_find_unused_parameters=False)
    if cfg["strategy"] == "fsdp":
        layer_cls = type(model.get_base_model().get_decoder().layers[0]).__name__
        extra["fsdp"] = "full_shard auto_wrap"
        extra["fsdp_config"] = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": [layer_cls],
                                "reshard_after_forward": True}
    args = training_arguments(os.path.join(run_dir, "trainer"), prec, device_type, max_steps=cfg.get("max_steps"),
                              epochs=cfg.get("epochs"), learning_rate=cfg["learning_rate"],
                              batch_size=cfg["batch_size"], grad_accum=cfg["grad_accum"], log_every=cfg["log_every"],
                              seed=cfg["seed"], gradient_checkpointing=bool(cfg.get("gradient_checkpointing")),
                              fused_adamw=cuda and cfg["strategy"] == "ddp", **extra)
    pad = cfg.get("pad_token_id")
    counter = {"tokens": 0}
    stream = _stream_callback(emit, cuda, counter, os.path.join(run_dir, "STOP"), stop_flag)
    trainer = NvkitTrainer(model=model, args=args, train_dataset=ListDataset(read_rows(run_dir)),
                           data_collator=Collator(0 if pad is None else pad, pad_to=8), callbacks=[stream],
                           fused_loss=fused, counter=counter)
    quiet_trainer(trainer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    target = os.path.join(run_dir, "adapter")
    if rank == 0:
        facts = {"base_model": cfg["model"], "lora": cfg["lora"], "steps": trainer.state.global_step,
                 "strategy": cfg["strategy"], "world_size": world, "data": cfg.get("data_facts")}
        save_atomic(trainer.save_model, target, kind="adapter", facts=facts)  # collective under FSDP
    else:
        # Under FSDP the state dict is gathered from every rank; off rank 0 nothing is written.
        trainer.save_model(os.path.join(run_dir, f".adapter-rank-{rank}"))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if rank == 0:
        emit(event="saved", adapter_dir=target)
    emit(event="done", step=trainer.state.global_step)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv=None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    run_dir = os.path.abspath(args[0])
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
        print(f"nvkit.train.worker: {run_dir} holds no config.json (nvkit.launch writes it). {USAGE}", file=sys.stderr)
        sys.exit(2)
    train(run_dir)
    # Leave without the interpreter's teardown: on the CPU (gloo) a rank can hang for good in
    # ~ProcessGroupGloo while the DDP reducer is garbage-collected at exit, after everything has
    # been saved. Nothing is left to write: the adapter is in place and the logs are flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
