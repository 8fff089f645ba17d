"""How ``nvkit.launch`` spreads a LoRA fine-tune over several GPUs: DDP, FSDP2, DeepSpeed ZeRO-2 and
ZeRO-3, and tensor parallelism; what each does and needs, the checks that refuse a combination
that cannot work (with the reason), the per-GPU memory each one needs (``nvkit.estimate`` split
the way the strategy splits the model), and the files a run needs for it (the DeepSpeed config,
the ``accelerate launch`` config).

The notebook side (``nvkit.launch``, the Launch panel) and every rank (``nvkit.train.worker``) read
the same table, so what the panel says a strategy does is what the worker sets up.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass

from ..errors import NvkitError, require


#: the first PEFT release that puts LoRA adapters on tensor-parallel (DTensor) layers: it added
#: ``peft.tuners.lora.model.get_tp_plan_and_mesh``, which ``tp_lora_problem`` looks for. pyproject's
#: ``tp`` extra pins ``peft>=`` this (tests/train/test_strategy_needs.py keeps the two equal).
TP_LORA_PEFT = "0.21.1"
TP_INSTALL = "pip install 'nvkit[tp]'"


@dataclass(frozen=True)
class Strategy:
    name: str
    title: str
    what: str        # what it does, one paragraph
    needs: str       # what it needs to run
    when: str        # when to choose it
    data_parallel: bool = True   # every rank trains on its own part of the batches


STRATEGIES = {
    "ddp": Strategy(
        "ddp", "DDP",
        "Every GPU holds a whole copy of the model and trains on its own share of the batches; the LoRA "
        "gradients are averaged over NCCL after each backward pass.",
        "The model, its LoRA adapters, their AdamW state and one batch's activations fit on one GPU. Runs on "
        "the CPU too (gloo).",
        "The model fits one GPU: the simplest and usually the fastest."),
    "fsdp": Strategy(
        "fsdp", "FSDP2",
        "PyTorch's fully sharded data parallel (fully_shard): parameters, gradients and optimizer state are "
        "split across the GPUs and each layer is gathered just before it runs, then freed again.",
        "CUDA GPUs (NCCL). QLoRA works with the 4-bit weights stored in the compute dtype "
        "(bnb_4bit_quant_storage, set by nvkit).",
        "The model does not fit one GPU, with PyTorch alone."),
    "zero2": Strategy(
        "zero2", "DeepSpeed ZeRO-2",
        "DeepSpeed splits the gradients and the optimizer state across the GPUs; every GPU keeps the whole "
        "model. The optimizer state can live in CPU memory (offload='optimizer').",
        "DeepSpeed (pip install 'nvkit[deepspeed]'). nvkit's settings need none of DeepSpeed's compiled ops.",
        "The model fits one GPU but its optimizer state is what runs out (full fine-tunes more than LoRA)."),
    "zero3": Strategy(
        "zero3", "DeepSpeed ZeRO-3",
        "DeepSpeed splits parameters, gradients and optimizer state across the GPUs (like FSDP) and gathers "
        "each layer when it runs; the optimizer state (offload='optimizer') and the parameters too "
        "(offload='all') can live in CPU memory.",
        "DeepSpeed (pip install 'nvkit[deepspeed]'). QLoRA with the 4-bit weights stored in the compute "
        "dtype (set by nvkit).",
        "The model does not fit one GPU, or not even all of them: offload to CPU memory. Where the model fits one GPU, "
        "ZeRO-3 mostly costs time: every layer is gathered before it runs and released after, in the forward and "
        "the backward pass, so on one or two GPUs it is slower than DDP: about half of DDP's steps per second on one "
        "H200 with a LoRA fine-tune of a 0.6B model (docs/benchmarks.md). nvkit gathers each decoder layer whole, "
        "one gather per layer instead of one per weight, to keep that cost small."),
    "tp": Strategy(
        "tp", "Tensor parallel",
        "Each weight matrix is cut across the GPUs (attention heads and MLP columns): every GPU computes "
        "its slice of every layer on the same batch and the slices are summed over NCCL inside each layer.",
        "A model transformers has a tensor-parallel plan for (Llama, Qwen, Mistral, ...), attention heads "
        "and KV heads divisible by the GPU count, fast links between the GPUs (NVLink); training needs CUDA "
        f"GPUs and PEFT ≥ {TP_LORA_PEFT} ({TP_INSTALL}), generation also runs on the CPU. No 4-bit/8-bit "
        "weights.",
        "One layer is too big, or latency matters: generation over several GPUs.",
        data_parallel=False),
}

LAUNCHERS = ("torchrun", "accelerate")
OFFLOADS = (None, "optimizer", "all")
#: the DeepSpeed release nvkit's settings were checked with (pyproject's extra pins it)
DEEPSPEED_INSTALL = "pip install 'nvkit[deepspeed]'"


def names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def strategy_info(name: str) -> Strategy:
    require(name in STRATEGIES, f"strategy must be one of {', '.join(repr(s) for s in STRATEGIES)}, not {name!r}.")
    return STRATEGIES[name]


# --- what each strategy needs ----------------------------------------------------------------------

def deepspeed_problem() -> str | None:
    """Why DeepSpeed cannot be used here, or None."""
    try:
        found = importlib.util.find_spec("deepspeed") is not None
    except (ImportError, ValueError):  # a module entry without a spec: blocked or half-imported
        found = False
    if not found:
        return f"DeepSpeed is not installed: {DEEPSPEED_INSTALL}"
    return None


def tp_problem(config, nproc: int, mode: str = "train") -> str | None:
    """Why tensor parallelism over ``nproc`` processes cannot run this model (a transformers config),
    or None."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    plan = getattr(text, "base_model_tp_plan", None) or getattr(config, "base_model_tp_plan", None)
    arch = ", ".join(getattr(config, "architectures", None) or [getattr(config, "model_type", "?")])
    if not plan:
        return (f"transformers has no tensor-parallel plan for {arch} (model type {config.model_type!r}); "
                "tensor parallelism needs one (Llama, Qwen, Mistral, Gemma and others have it)")
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    if nproc > 1 and (heads % nproc or kv % nproc):
        return (f"{nproc} GPUs do not divide the {heads} attention heads and {kv} KV heads of {arch} evenly; tensor "
                "parallelism gives every GPU the same number of each")
    try:
        from transformers.distributed import DistributedConfig  # noqa: F401
    except ImportError:
        return "this transformers has no DistributedConfig (tensor-parallel loading needs transformers ≥ 5.17)"
    if mode == "train":
        return tp_lora_problem()
    return None


def tp_lora_problem() -> str | None:
    """Why this PEFT cannot train LoRA on tensor-parallel layers, or None. It looks for the hook
    PEFT gained in ``TP_LORA_PEFT`` (a release number alone would say nothing of a patched or
    development build)."""
    from ..quiet import routed
    try:
        with routed():  # peft's first import brings in bitsandbytes (see nvkit.quiet)
            import peft
            from peft.tuners.lora import model as lora_model
    except ImportError:
        return f"PEFT is not installed (tensor-parallel LoRA needs peft ≥ {TP_LORA_PEFT}: {TP_INSTALL})"
    if not hasattr(lora_model, "get_tp_plan_and_mesh"):
        return (f"PEFT {getattr(peft, '__version__', '(unknown version)')} cannot put LoRA adapters on "
                f"tensor-parallel layers; PEFT {TP_LORA_PEFT} and newer can: {TP_INSTALL} (peft>={TP_LORA_PEFT}), "
                "or use strategy='fsdp'")
    return None


def check_processes(nproc_per_node: int, chosen_gpus: int) -> None:
    """NvkitError when a launch on CUDA would start more processes on this machine than GPUs are
    chosen: every rank takes the GPU of its local rank, so the extra ones find none (and NCCL
    refuses two ranks on one GPU). Checked before anything starts, instead of a rank failing
    after the model loaded."""
    if nproc_per_node > chosen_gpus:
        raise NvkitError(
            f"nproc_per_node={nproc_per_node} starts one process per GPU, but {chosen_gpus} GPU(s) are chosen here. "
            f"Choose more GPUs (nvkit.select_gpus), use nproc_per_node={chosen_gpus}"
            + (", or run on the CPU with gpus=[] (gloo)." if chosen_gpus else "."))


def check(strategy: str, *, device: str, nproc: int, mode: str = "train", quantization=None, offload=None,
          launcher: str = "torchrun", config=None) -> list[str]:
    """NvkitError for a combination that cannot run, naming it and why; otherwise the notes worth
    showing (settings nvkit adds for it)."""
    s = strategy_info(strategy)
    require(launcher in LAUNCHERS, f"launcher must be 'torchrun' or 'accelerate', not {launcher!r}.")
    require(offload in OFFLOADS, f"offload must be None, 'optimizer' or 'all', not {offload!r}.")
    notes: list[str] = []
    if mode == "generate":
        if strategy != "tp":
            raise NvkitError(f"Generation over several processes is tensor parallel in nvkit (strategy='tp'); "
                             f"{s.title} is a way to train.")
    if offload is not None and strategy not in ("zero2", "zero3"):
        raise NvkitError(f"offload={offload!r} moves DeepSpeed's state to CPU memory: it goes with strategy='zero2' or "
                         f"'zero3', not {strategy!r}.")
    if offload == "all" and strategy == "zero2":
        raise NvkitError("offload='all' also moves the parameters to CPU memory, which only ZeRO-3 shards; ZeRO-2 "
                         "keeps a whole copy on every GPU. Use offload='optimizer' or strategy='zero3'.")
    if strategy == "fsdp" and device != "cuda":
        raise NvkitError("strategy='fsdp' needs CUDA GPUs (NCCL); on the CPU use strategy='ddp' (gloo).")
    if strategy == "tp":
        if mode == "train" and device != "cuda":
            raise NvkitError("Tensor-parallel training needs CUDA GPUs: accelerate runs a tensor-parallel Trainer only "
                             "on GPUs (its ParallelismConfig refuses the CPU). Tensor-parallel generation runs on the "
                             "CPU (nvkit.launch_generate), and strategy='ddp' trains there.")
        if quantization:
            raise NvkitError(f"strategy='tp' with quantization={quantization!r}: bitsandbytes' packed 4/8-bit weights "
                             "cannot be cut across GPUs. Load the model unquantized, or use strategy='fsdp' or 'zero3' "
                             "for QLoRA.")
        if config is not None:
            why = tp_problem(config, nproc, mode)
            if why:
                raise NvkitError(f"{why[0].upper()}{why[1:]} (strategy='tp').")
        if mode == "train":
            notes.append("tensor parallel: every GPU trains on the same batches (one data-parallel group), the model's "
                         "own loss (nvkit's fused loss reads the whole LM head)")
    if quantization:
        if strategy == "zero2":
            raise NvkitError(f"strategy='zero2' with quantization={quantization!r}: nvkit runs QLoRA under DeepSpeed "
                             "with ZeRO-3 (the combination transformers documents, 4-bit weights stored in the "
                             "compute dtype). Use strategy='zero3', 'fsdp' or 'ddp'.")
        if strategy in ("fsdp", "zero3"):
            notes.append("QLoRA: the 4-bit weights are stored in the compute dtype (bnb_4bit_quant_storage) so "
                         f"{s.title} can shard them")
    if strategy == "zero3":
        notes.append("ZeRO-3: the model's own loss (nvkit's fused loss would read the LM head outside the layer "
                     "that gathers it)")
    if launcher == "accelerate" and device != "cuda" and nproc > 1:
        raise NvkitError(f"launcher='accelerate' starts several CPU processes only through mpirun; for {nproc} "
                         "processes on the CPU use launcher='torchrun' (or nproc_per_node=1).")
    if strategy in ("zero2", "zero3"):
        why = deepspeed_problem()
        if why:
            raise NvkitError(f"strategy={strategy!r} runs DeepSpeed ZeRO, but {why}.")
    if nproc == 1 and strategy != "ddp" and mode == "train":
        notes.append(f"{s.title} on one process: nothing to split, the run shows the settings work")
    return notes


def fused_loss_allowed(strategy: str) -> bool:
    """nvkit's fused loss reads the LM head's weight directly: it must be whole on every rank."""
    return strategy not in ("zero3", "tp")


# --- files a run needs --------------------------------------------------------------------------------

#: DeepSpeed's own defaults for the two ZeRO-3 sizes ``zero3_settings`` raises (elements)
DS_PREFETCH_BUCKET = 50_000_000
DS_PERSISTENCE_THRESHOLD = 100_000
#: the first DeepSpeed whose config names leaf modules (``zero_optimization.leaf_module``)
DS_LEAF_CONFIG = (0, 18)


def _deepspeed_version() -> tuple[int, ...] | None:
    import importlib.metadata
    import re
    try:
        return tuple(int(x) for x in re.findall(r"\d+", importlib.metadata.version("deepspeed"))[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def zero3_settings(layer_class: str | None, layer_params: int = 0, adapter_matrix: int = 0) -> dict:
    """The ZeRO-3 settings nvkit adds for one model (merged into ``zero_optimization``), from its
    decoder layer's class name and parameter count and its largest LoRA matrix (elements).

    ZeRO-3 hooks every module: before a module runs, its parameters are gathered, and after, released,
    in the forward and again in the backward pass. That is Python work per module on the CPU, and a
    LoRA model has many small modules (each adapted linear layer brings its base layer, lora_A,
    lora_B and a dropout), so with DeepSpeed's defaults the hooks, not the GPU, set the pace. So:

    - the decoder layer is a *leaf module*: gathered whole by one hook, its inside left unhooked:
      the unit FSDP2 shards by in nvkit, and the two gathered layers ``per_gpu_estimate`` counts;
    - the prefetch bucket holds at least one whole layer, so the next layer's gather is under way
      while one runs (DeepSpeed's fixed default is smaller than a layer of a large model);
    - every LoRA matrix stays whole on every GPU (persistent: the adapter is small beside the model),
      updated once per step instead of gathered in every layer's forward and backward; base
      weights are larger than the threshold and stay sharded.

    - with whole layers gathered, torch's own ``F.linear`` is kept (``memory_efficient_linear``
      off): DeepSpeed's replacement is an autograd function of its own around every linear call,
      which only pays when single linears are gathered and released one by one; the layer's
      backward hook gathers it again before its linears' backward, so the gradients are the same.

    These apply at any GPU count: they cut host work per step, which ZeRO-3 pays on every GPU."""
    out: dict = {}
    version = _deepspeed_version()
    if layer_class and (version is None or version >= DS_LEAF_CONFIG):
        out["leaf_module"] = {"classes": [layer_class]}
        out["memory_efficient_linear"] = False
    out["stage3_prefetch_bucket_size"] = max(DS_PREFETCH_BUCKET, int(layer_params))
    out["stage3_param_persistence_threshold"] = max(DS_PERSISTENCE_THRESHOLD, int(adapter_matrix))
    return out


def deepspeed_config(strategy: str, offload=None, cuda: bool = True, zero3: dict | None = None) -> dict:
    """The DeepSpeed config for Trainer's DeepSpeed integration ("auto" values are filled by Trainer
    from its own arguments, so the batch size, accumulation, clipping and precision agree).
    ``zero3``: the model's ZeRO-3 settings (``zero3_settings``), added for strategy='zero3'."""
    require(strategy in ("zero2", "zero3"), f"no DeepSpeed config for strategy {strategy!r}")
    zero: dict = {"stage": 2 if strategy == "zero2" else 3, "overlap_comm": cuda, "contiguous_gradients": True}
    if offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if strategy == "zero3":
        # the adapter is saved whole (gathered on rank 0), not as per-rank shards
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if offload == "all":
            zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
        zero.update(zero3 or {})
    return {
        "zero_optimization": zero,
        # Trainer's torch AdamW steps the offloaded state on the CPU; DeepSpeed's own CPU Adam is a
        # C++ op it compiles on first use (needs a compiler and minutes), so it is not required.
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
    }


def accelerate_config(nproc: int, device: str, precision: str, port: int | None = None) -> str:
    """The ``accelerate launch --config_file`` YAML for one machine. It only starts the processes:
    the strategy itself is set up by nvkit's worker through Trainer's arguments, the same under
    torchrun and accelerate."""
    mp = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    if device == "cuda":
        dist = "MULTI_GPU" if nproc > 1 else "NO"
    else:
        dist = "NO"
    lines = [
        "# Written by nvkit.launch: how `accelerate launch` starts this run's processes (one per GPU).",
        "# The strategy (DDP, FSDP2, DeepSpeed ZeRO, tensor parallel) is in config.json: nvkit's worker",
        "# sets it up through Trainer's arguments, the same under torchrun and accelerate.",
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: '{dist}'",  # quoted: YAML reads a bare NO as false
        f"num_processes: {nproc}",
        "num_machines: 1",
        "machine_rank: 0",
        f"mixed_precision: '{mp}'",
        f"use_cpu: {'true' if device != 'cuda' else 'false'}",
        "gpu_ids: all",
        "rdzv_backend: static",
        "same_network: true",
        "main_training_function: main",
        "downcast_bf16: 'no'",
        "tpu_use_cluster: false",
        "tpu_use_sudo: false",
    ]
    if port is not None:
        lines.append(f"main_process_port: {port}")
    return "\n".join(lines) + "\n"


# --- memory per GPU ----------------------------------------------------------------------------------

def _config(model):
    """The transformers config for what ``nvkit.estimate`` accepts as a model."""
    import os

    from transformers import AutoConfig, PretrainedConfig
    if isinstance(model, PretrainedConfig):
        return model
    for holder in (model, getattr(model, "model", None)):  # a transformers model, an nvkit Session
        cfg = getattr(holder, "config", None)
        if isinstance(cfg, PretrainedConfig):
            return cfg
    from ..demo import SHAPES, path as demo_path, shaped_config
    name = os.fspath(model).strip() if isinstance(model, (str, os.PathLike)) else None
    require(name, f"a model is needed: 'demo', a shape name, a checkpoint directory or a config, not {model!r}.")
    if name == "demo":
        return AutoConfig.from_pretrained(demo_path())
    if name.lower() in SHAPES:
        return shaped_config(name)
    local = os.path.expanduser(name)
    try:
        return AutoConfig.from_pretrained(local if os.path.isdir(local) else name, local_files_only=True)
    except (OSError, ValueError) as e:
        raise NvkitError(f"No config for {name!r} (a local checkpoint directory or a cached Hub id): {e}") from e


def _tp_local_config(config, nproc: int):
    """The config of one rank's slice under tensor parallelism: 1/N of the attention heads, KV heads
    and MLP columns, the hidden size (residual stream, norms, embeddings) whole."""
    cfg = copy.deepcopy(config)
    text = cfg.get_text_config() if callable(getattr(cfg, "get_text_config", None)) else cfg
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    text.head_dim = head_dim
    text.num_attention_heads = max(1, heads // nproc)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    text.num_key_value_heads = max(1, kv // nproc)
    if getattr(text, "intermediate_size", None):
        text.intermediate_size = max(1, int(text.intermediate_size) // nproc)
    return cfg


def per_gpu_estimate(model="demo", strategy: str = "ddp", nproc: int = 2, *, dtype="bfloat16", quantization=None,
                     batch_size: int = 8, seq_len: int = 512, lora_r: int = 16, gradient_checkpointing: bool = False,
                     offload=None, device: str = "cuda", lora_dropout: float = 0.05):
    """``nvkit.estimate`` (mode="lora") for one GPU of a ``strategy`` run over ``nproc`` GPUs, each
    part split the way the strategy splits it (``.formulas`` say how). ``batch_size`` is per GPU."""
    from ..memory.estimate import Estimate, estimate, in_fresh_process
    strategy_info(strategy)
    require(isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1,
            f"nproc must be a whole number ≥ 1, not {nproc!r}.")
    require(offload in OFFLOADS, f"offload must be None, 'optimizer' or 'all', not {offload!r}.")
    config = _config(model)
    kw = dict(dtype=dtype, quantization=quantization, mode="lora", batch_size=batch_size, seq_len=seq_len,
              lora_r=lora_r, gradient_checkpointing=gradient_checkpointing, device=device, path="nvkit",
              compiled=False, lora_dropout=lora_dropout)  # launched runs do not compile their layers
    if strategy == "tp":
        base = estimate(_tp_local_config(config, nproc), **kw)
        base.model = getattr(config, "name_or_path", "") or config.model_type
        base.formulas = {k: f"{v}; one rank's slice: 1/{nproc} of the heads and MLP columns" if k != "CUDA context" else v
                         for k, v in base.formulas.items()}
        if "logits" in base.parts:  # TP trains with the model's own loss: full logits, not nvkit's chunks
            plain = estimate(_tp_local_config(config, nproc), **{**kw, "path": "plain"})
            base.parts["logits"] = plain.parts["logits"]
            base.formulas["logits"] = plain.formulas["logits"] + " (the model's own loss under TP)"
        return base
    base = estimate(config, **kw)
    parts, formulas = dict(base.parts), dict(base.formulas)
    n = nproc
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    layers = int(text.num_hidden_layers)
    itemsize = 4 if str(dtype).replace("torch.", "") in ("float32", "fp32", "float") else 2
    embed = int(text.vocab_size) * int(text.hidden_size) * itemsize * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    per_layer = max(0, parts["weights"] - embed) // max(layers, 1)
    lora_parts = ("LoRA adapter", "LoRA gradients", "AdamW states")
    if strategy == "ddp":
        parts["DDP gradient buckets"] = parts["LoRA gradients"]
        formulas["DDP gradient buckets"] = "a second copy of the LoRA gradients, all-reduced bucket by bucket"
    elif strategy in ("fsdp", "zero3"):
        gathered = 2 * per_layer  # the layer running and the next one, prefetched
        if strategy == "zero3" and offload == "all":
            parts["weights"] = gathered
            formulas["weights"] = "in CPU memory (offload='all'); on the GPU: the layer running and the next one"
        else:
            parts["weights"] = parts["weights"] // n + gathered
            formulas["weights"] = (f"{formulas['weights']} ÷ {n} GPUs + 2 layers gathered whole "
                                   f"(the one running and the next, {_fmt(per_layer)} each)")
        for k in lora_parts:
            parts[k] = parts[k] // n
            formulas[k] += f" ÷ {n} GPUs (sharded)"
        if strategy == "zero3" and offload in ("optimizer", "all"):
            parts["AdamW states"] = 0
            formulas["AdamW states"] = "in CPU memory (offload)"
    elif strategy == "zero2":
        for k in ("LoRA gradients", "AdamW states"):
            parts[k] = parts[k] // n
            formulas[k] += f" ÷ {n} GPUs (sharded)"
        if offload == "optimizer":
            parts["AdamW states"] = 0
            formulas["AdamW states"] = "in CPU memory (offload='optimizer')"
    if strategy == "zero3":  # the model's own loss (see fused_loss_allowed)
        plain = estimate(config, **{**kw, "path": "plain"})
        parts["logits"] = plain.parts["logits"]
        formulas["logits"] = plain.formulas["logits"] + " (the model's own loss under ZeRO-3)"
    est = Estimate(model=base.model, mode=base.mode, dtype=base.dtype, quantization=base.quantization,
                   batch_size=base.batch_size, seq_len=base.seq_len, parameters=base.parameters,
                   parts={k: int(v) for k, v in parts.items()}, formulas=formulas, device=base.device,
                   lora_r=base.lora_r, gradient_checkpointing=base.gradient_checkpointing)
    # every rank is a fresh process: on the CPU its first step's buffers are part of its run
    return in_fresh_process(est) if device == "cpu" else est


def _fmt(n: int) -> str:
    from ..units import fmt_bytes
    return fmt_bytes(n)


def compare(model="demo", nproc: int = 2, gpu_memory: int | None = None, *, device: str = "cuda", **kw) -> list[dict]:
    """Every strategy side by side for one model: its per-GPU estimate (``estimate``), whether it
    fits ``gpu_memory`` bytes (``fits``; None when unknown), what is missing to run it here
    (``missing``: DeepSpeed not installed) or why it cannot run this model on ``device``
    (``why_not``)."""
    config = _config(model)
    rows = []
    for name, s in STRATEGIES.items():
        row = {"strategy": name, "title": s.title, "estimate": None, "fits": None, "missing": None, "why_not": None}
        try:
            check(name, device=device, nproc=nproc, quantization=kw.get("quantization"), config=config)
        except NvkitError as e:
            missing = deepspeed_problem() if name in ("zero2", "zero3") else None
            if missing and "DeepSpeed is not installed" in str(e):
                row["missing"] = missing
            else:
                row["why_not"] = str(e)
                rows.append(row)
                continue
        row["estimate"] = per_gpu_estimate(config, name, nproc, device=device, **kw)
        if gpu_memory:
            row["fits"] = row["estimate"].total <= gpu_memory
        rows.append(row)
    return rows


def advice(rows: list[dict], gpu_memory: int | None) -> str:
    """One sentence: which strategies to use for these rows (from ``compare``)."""
    if not gpu_memory:
        return "Every strategy's per-GPU estimate is below; DDP is the simplest when the model fits one GPU."
    ddp = next((r for r in rows if r["strategy"] == "ddp"), None)
    fit = [r["title"] for r in rows if r.get("fits")]
    if ddp and ddp.get("fits"):
        return "The model fits one GPU: DDP is the simplest and usually the fastest."
    if fit:
        return (f"Too big for one GPU with DDP: {', '.join(fit)} split the model across the GPUs and fit. "
                "With DeepSpeed, offload to CPU memory lowers it further.")
    return ("Too big even split over these GPUs: use more GPUs, ZeRO-3 with offload='all', gradient checkpointing, "
            "a smaller batch or a 4-bit model (QLoRA).")
