"""The training program every rank of ``nvkit.launch`` runs:
``python -m torch.distributed.run [torchrun options] -m nvkit.train.worker RUN_DIR``.

It reads ``RUN_DIR/config.json`` (the settings) and ``RUN_DIR/data.jsonl`` (the examples, already
tokenized and checked in the notebook) and trains LoRA adapters with the pieces ``nvkit.finetune``
uses in the kernel: the precision choice (``nvkit.model.precision``), the LoRA/QLoRA preparation
(``nvkit.train.lora``), the collator (``nvkit.train.data``), the trainer with the fused loss
(``nvkit.train.trainer``) and the atomic adapter save (``nvkit.model.saving``). The strategy in
the config (``nvkit.train.strategies``) decides how the model loads (whole per GPU, on the CPU for
FSDP2/DeepSpeed to shard, partitioned while it loads under ZeRO-3, or this rank's slice for tensor
parallelism) and what Trainer is told (FSDP2 settings, a DeepSpeed config); ``accelerate launch``
starts the same program. With ``"mode": "generate"`` it generates instead, tensor parallel, and
rank 0 prints each text. Nothing of the user's is pasted into Python source: the run folder is a
command-line argument.

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
from typing import NamedTuple

USAGE = "usage: python -m torch.distributed.run [torchrun options] -m nvkit.train.worker RUN_DIR"


RECORD_START = '{"nvkit": 1'  # how every Emitter line begins (json.dumps keeps "nvkit" first): the reader finds records by it


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


def cpu_baseline(model) -> dict:
    """Where a CPU rank's training begins, for ``cpu_memory``: its RSS once freed memory is given
    back, its model's resident bytes (weights and adapter), and whether the kernel's peak-RSS
    record restarted here."""
    from ..memory.usage import fast_rss, release, reset_rss_peak
    release()
    hwm = reset_rss_peak()
    try:
        resident = int(model.get_memory_footprint())
    except Exception:  # noqa: BLE001 - a model without the method: the growth alone
        resident = 0
    return {"rss": fast_rss(), "resident": resident, "hwm": hwm}


def cpu_memory(base: dict) -> tuple[int, int]:
    """(now, peak) of a CPU rank as ``nvkit.estimate(device="cpu")`` predicts it and the kernel's own
    fine-tunes measure it (``nvkit.memory.peaks.cpu_measured``): the RSS gained since ``base`` plus
    the resident model. The whole RSS would count Python, torch and every import."""
    from ..memory.usage import fast_rss, rss_peak
    now = fast_rss()
    peak = max(now, (rss_peak() or 0) if base["hwm"] else 0)
    return (max(0, now - base["rss"]) + base["resident"], max(0, peak - base["rss"]) + base["resident"])


def _stream_callback(emit, cuda: bool, counter: dict, stop_file: str, stop_flag: dict, cpu_base: dict):
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
            mem, peak = memory_now("cuda") if cuda else cpu_memory(cpu_base)
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


def _rank_env():
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def _device(cfg: dict, local_rank: int):
    """(cuda?, device type, compute capability) of this rank."""
    import torch
    cuda = torch.cuda.is_available() and cfg.get("device", "cuda") == "cuda"
    capability = None
    if cuda:
        torch.cuda.set_device(local_rank)  # the current device is per process (and per thread)
        capability = torch.cuda.get_device_capability(local_rank)
    return cuda, "cuda" if cuda else "cpu", capability


def load_model(cfg: dict, strategy: str, dtype, device_type: str, local_rank: int, world: int):
    """The base model as this rank needs it for ``strategy``: whole on its GPU (DDP), whole on the
    CPU for FSDP/DeepSpeed to shard (ZeRO-3 partitions it while it loads, when Trainer's DeepSpeed
    config is already in force), or this rank's slice (tensor parallel); with the session's
    attention backend, quantization and kernels."""
    from ..model.kernels import apply_kernels, plan_kernels
    from ..model.quant import quantization_config
    from ..quiet import routed
    with routed():
        from transformers import AutoModelForCausalLM
    kw = dict(dtype=dtype, attn_implementation=cfg.get("attn_implementation") or "sdpa")
    quant = cfg.get("quantization")
    if quant:
        opts = {}
        if strategy in ("fsdp", "zero3"):
            # FSDP2 and ZeRO-3 shard floating-point tensors: the packed 4-bit weights are stored in
            # the compute dtype so they can be split like the rest (uint8 storage cannot).
            opts["quant_storage"] = dtype
        kw["quantization_config"] = quantization_config(quant, dtype, device_type, **opts)
    if strategy == "tp":
        from transformers.distributed import DistributedConfig
        kw["distributed_config"] = DistributedConfig(tp_size=world)
        if device_type == "cuda" and world == 1:
            # transformers cuts nothing for one process and then places nothing either: without a
            # device map the model would stay on the CPU while the rank works on its GPU
            kw["device_map"] = {"": local_rank}
    elif device_type == "cuda" and (strategy == "ddp" or (quant and strategy != "zero3")):
        # ZeRO-3 refuses a device_map; bitsandbytes then quantizes onto the current device
        kw["device_map"] = {"": local_rank}
    with routed():
        model = AutoModelForCausalLM.from_pretrained(cfg["model"], **kw)
    kernels = cfg.get("kernels")
    if kernels:
        plan = plan_kernels(cfg["model"], device_type, bool(kernels.get("use_kernels")), kernels.get("kernel_config"))
        apply_kernels(model, plan)
    return model


def rowwise_lora_a(model) -> list:
    """The LoRA A matrices of ``model``'s row-wise sharded layers (o_proj, down_proj under TP)."""
    return [a for module in model.modules()
            if getattr(getattr(module, "base_layer", None), "_hf_tp_plan", None) == "rowwise"
            and hasattr(module, "lora_A") for a in module.lora_A.values()]


def fix_tp_lora(model) -> int:
    """PEFT before 0.22 gives the LoRA A matrix of a row-wise sharded layer (o_proj, down_proj) its
    local input width as ``in_features`` while its weight is the whole (sharded) one, and
    transformers' row-wise input hook builds the input's global shape from ``in_features``: the
    shapes disagree in the first forward. Setting the global width makes them agree. Returns how
    many were fixed (none where PEFT set it)."""
    fixed = 0
    for a in rowwise_lora_a(model):
        width = int(a.weight.shape[1])  # the DTensor's global shape
        if getattr(a, "in_features", width) != width:
            a.in_features = width
            fixed += 1
    return fixed


def strategy_ready(model, strategy: str, layer: DecoderLayer | None) -> None:
    """What the LoRA model needs for ``strategy`` once its adapters are on (``layer``: the decoder
    layer that ``_strategy_arguments`` built the strategy's settings from, or None)."""
    if strategy == "tp":
        fix_tp_lora(model)
    if strategy == "zero3" and layer is not None:
        # ZeRO-3 reduces a leaf module's gradients (the decoder layer: see zero3_settings) in the
        # layer's full backward hook, which fires when the gradient of the layer's input is done, or,
        # where no input needs one, as the layer's backward *starts*: the first layer, fed by the
        # frozen embedding, would have its LoRA gradients reduced before they exist. An embedding
        # output that needs a gradient moves that hook to the end of the first layer's backward.
        model.enable_input_require_grads()


def tp_optimizer(model, learning_rate: float):
    """AdamW for a tensor-parallel LoRA model. Its adapters are a mix of sharded (DTensor) and whole
    (plain) tensors, and torch's multi-tensor ("foreach") AdamW, its default on CUDA, refuses such a
    mix in one call; the per-tensor loop takes each as it is."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=learning_rate, foreach=False)


def _strategy_arguments(cfg: dict, layer: DecoderLayer | None, cuda: bool) -> dict:
    """Trainer arguments that set up the strategy (DDP is Trainer's default under torchrun)."""
    from .strategies import deepspeed_config, zero3_settings
    strategy = cfg["strategy"]
    extra = dict(ddp_backend="nccl" if cuda else "gloo", ddp_find_unused_parameters=False)
    if strategy == "fsdp":
        extra["fsdp"] = "full_shard auto_wrap"
        extra["fsdp_config"] = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": [layer.name],
                                "reshard_after_forward": True}
    elif strategy in ("zero2", "zero3"):
        tuning = None
        if strategy == "zero3" and layer is not None:
            tuning = zero3_settings(layer.name, layer.params, layer.widest * int(cfg["lora"]["r"]))
        extra["deepspeed"] = deepspeed_config(strategy, cfg.get("offload"), cuda, zero3=tuning)
    return extra


class DecoderLayer(NamedTuple):
    name: str     # class name: the unit FSDP2 wraps and ZeRO-3 gathers whole
    params: int   # parameters of one layer
    widest: int   # the widest side of its linear layers (a LoRA matrix is r × at most this)


def decoder_layer(path: str) -> DecoderLayer:
    """The model's decoder layer, read on the meta device (no memory, no weights)."""
    from torch import nn
    from transformers import AutoConfig

    from ..memory.estimate import meta_model
    layer = meta_model(AutoConfig.from_pretrained(path)).get_decoder().layers[0]
    widths = [max(m.in_features, m.out_features) for m in layer.modules() if isinstance(m, nn.Linear)]
    return DecoderLayer(type(layer).__name__, sum(p.numel() for p in layer.parameters()), max(widths, default=0))


def train(run_dir: str) -> None:
    """Train on this rank from the run folder (see the module doc)."""
    rank, local_rank, world = _rank_env()
    emit = Emitter(rank, local_rank, world)
    stop_flag = {"signal": False}

    def on_term(signum, frame):
        stop_flag["signal"] = True  # end after this step, like the STOP file

    signal.signal(signal.SIGTERM, on_term)
    cfg = read_config(run_dir)
    strategy = cfg["strategy"]

    import torch
    import torch.distributed as dist

    from ..model.precision import precision, resolve_dtype
    from ..model.saving import save_atomic
    from ..quiet import routed
    from .data import Collator, ListDataset
    from .lora import prepare_lora_model
    from .loss import fused_loss_supported
    from .strategies import fused_loss_allowed
    from .trainer import quiet_trainer, trainer_class, training_arguments

    with routed():  # Trainer's first import brings in peft and bitsandbytes (see nvkit.quiet)
        NvkitTrainer = trainer_class()
    cuda, device_type, capability = _device(cfg, local_rank)
    prec = precision(device_type, capability, cfg.get("precision"))
    dtype = resolve_dtype(cfg.get("dtype") or {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[prec],
                          device_type, capability)
    if strategy in ("zero2", "zero3") and not cuda:
        # On the CPU, accelerate starts gloo itself and leaves DeepSpeed's own communication layer
        # unset; DeepSpeed then counts one process. Starting it first makes both agree.
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
    # The arguments come before the model: with ZeRO-3 they put DeepSpeed's config in force, and
    # the model then loads partitioned across the ranks instead of whole on each.
    layer = decoder_layer(cfg["model"]) if strategy == "fsdp" else None
    if strategy == "zero3":
        try:
            layer = decoder_layer(cfg["model"])
        except (AttributeError, IndexError, TypeError, ValueError):
            layer = None  # no decoder layers where transformers keeps them: DeepSpeed's own hooking, slower
    args = training_arguments(os.path.join(run_dir, "trainer"), prec, device_type, max_steps=cfg.get("max_steps"),
                              epochs=cfg.get("epochs"), learning_rate=cfg["learning_rate"],
                              batch_size=cfg["batch_size"], grad_accum=cfg["grad_accum"], log_every=cfg["log_every"],
                              seed=cfg["seed"], gradient_checkpointing=bool(cfg.get("gradient_checkpointing")),
                              fused_adamw=cuda and strategy == "ddp", **_strategy_arguments(cfg, layer, cuda))
    model = load_model(cfg, strategy, dtype, device_type, local_rank, world)
    model, kbit, _ = prepare_lora_model(model, cfg["lora"], bool(cfg.get("gradient_checkpointing")))
    strategy_ready(model, strategy, layer)
    fused, loss_why = fused_loss_supported(model)
    if fused and not fused_loss_allowed(strategy):
        fused, loss_why = False, f"the model's own loss ({strategy}: the LM head is not whole on every rank)"
    emit(event="setup", strategy=strategy, precision=prec, dtype=str(dtype).replace("torch.", ""),
         attention=getattr(model.config, "_attn_implementation", None), qlora=kbit, loss=loss_why,
         kernels=bool(cfg.get("kernels")), device=device_type,
         unit=layer.name if layer is not None else None)  # what FSDP2 / ZeRO-3 gather whole

    pad = cfg.get("pad_token_id")
    counter = {"tokens": 0}
    cpu_base: dict = {}   # filled as training begins (cpu_baseline)
    stream = _stream_callback(emit, cuda, counter, os.path.join(run_dir, "STOP"), stop_flag, cpu_base)
    extra = {"optimizers": (tp_optimizer(model, cfg["learning_rate"]), None)} if strategy == "tp" else {}
    trainer = NvkitTrainer(model=model, args=args, train_dataset=ListDataset(read_rows(run_dir)),
                           data_collator=Collator(0 if pad is None else pad, pad_to=8), callbacks=[stream],
                           fused_loss=fused, counter=counter, **extra)
    quiet_trainer(trainer)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        cpu_base.update(cpu_baseline(model))
    trainer.train()
    target = os.path.join(run_dir, "adapter")
    if rank == 0:
        facts = {"base_model": cfg["model"], "lora": cfg["lora"], "steps": trainer.state.global_step,
                 "strategy": strategy, "world_size": world, "precision": prec, "data": cfg.get("data_facts")}
        save_atomic(trainer.save_model, target, kind="adapter", facts=facts)  # collective under FSDP/ZeRO-3/TP
    else:
        # Under FSDP, ZeRO-3 and TP the adapter is gathered from every rank; off rank 0 nothing is written.
        trainer.save_model(os.path.join(run_dir, f".adapter-rank-{rank}"))
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if rank == 0:
        emit(event="saved", adapter_dir=target)
    emit(event="done", step=trainer.state.global_step)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def generate(run_dir: str) -> None:
    """Tensor-parallel generation on this rank: the model cut across the ranks, the prompts of
    config.json run greedily (or sampled with the config's seed); rank 0 prints each text."""
    rank, local_rank, world = _rank_env()
    emit = Emitter(rank, local_rank, world)
    cfg = read_config(run_dir)

    import torch
    import torch.distributed as dist

    from ..memory.usage import memory_now
    from ..model.precision import resolve_dtype

    from transformers import AutoTokenizer
    cuda, device_type, capability = _device(cfg, local_rank)
    dtype = resolve_dtype(cfg.get("dtype") or "auto", device_type, capability)
    tok = AutoTokenizer.from_pretrained(cfg["model"])
    tok.padding_side = "left"  # generation continues from the last position of every row
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = load_model(cfg, "tp", dtype, device_type, local_rank, world)
    model.eval()
    emit(event="setup", strategy="tp", dtype=str(dtype).replace("torch.", ""), device=device_type,
         attention=getattr(model.config, "_attn_implementation", None), kernels=bool(cfg.get("kernels")))
    prompts = cfg["prompts"]
    gen = dict(max_new_tokens=int(cfg.get("max_new_tokens", 50)), do_sample=bool(cfg.get("do_sample", False)),
               pad_token_id=tok.pad_token_id)
    torch.manual_seed(int(cfg.get("seed", 0)))  # the same on every rank: sampled tokens must agree
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    t0 = time.time()
    new_tokens = 0
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            enc = tok([prompt], return_tensors="pt").to(device)
            out = model.generate(**enc, **gen)
            new = out[0, enc["input_ids"].shape[1]:]
            new_tokens += int(new.shape[0])
            if rank == 0:
                emit(event="text", index=i, text=tok.decode(new, skip_special_tokens=True))
    seconds = time.time() - t0
    mem, peak = memory_now(device_type)
    emit(event="generated", prompts=len(prompts), new_tokens=new_tokens, seconds=seconds,
         tokens_per_s=new_tokens / seconds if seconds > 0 else 0.0, memory=mem, peak_memory=peak)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    emit(event="done", step=0)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _one_process_group() -> None:
    """A launcher that starts a single process without torchrun's variables (``accelerate launch``
    with one process) leaves this rank outside any process group, while Trainer (asked for the
    gloo/nccl backend) and DeepSpeed expect one: give it a group of one, as torchrun would."""
    if "WORLD_SIZE" in os.environ:
        return
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def main(argv=None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    run_dir = os.path.abspath(args[0])
    if not os.path.isfile(os.path.join(run_dir, "config.json")):
        print(f"nvkit.train.worker: {run_dir} holds no config.json (nvkit.launch writes it). {USAGE}", file=sys.stderr)
        sys.exit(2)
    _one_process_group()
    if read_config(run_dir).get("mode", "train") == "generate":
        generate(run_dir)
    else:
        train(run_dir)
    # Leave without the interpreter's teardown: on the CPU (gloo) a rank can hang for good in
    # ~ProcessGroupGloo while the DDP reducer is garbage-collected at exit, after everything has
    # been saved. Nothing is left to write: the adapter is in place and the logs are flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
