"""``nvkit.estimate``: how much GPU memory a model will need, from its config alone.

Nothing is downloaded and no weights are built: the config gives the shapes, and the parameter
count comes from instantiating the model on the ``meta`` device (tensors without storage), so any
architecture transformers knows is counted exactly, tied embeddings included.

The activation coefficients (bytes per token per layer) were measured, not guessed: a
TorchDispatchMode that tracks the storage of every tensor an op creates gives the exact peak of
live bytes for a real forward/backward (``_live_peak`` in tests/memory/test_estimate.py re-measures them
on small Qwen3 shapes). Autograd saves the same tensors on every device, so they carry over to
CUDA; what CUDA adds (its context, cuBLAS workspaces, allocator rounding) is a separate part.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field

from ..demo import SHAPES, path as demo_path, shaped_config
from ..checks import flag, whole_number
from ..errors import NvkitError, require
from ..units import fmt_bytes

MiB = 2**20

# What the driver holds beyond PyTorch's allocator: the CUDA context (driver state, module images
# loaded lazily), cuBLAS/cuDNN handles and workspaces, and allocator rounding. Measured on the H200
# (torch 2.11, CUDA 13) as NVML used minus torch reserved at the peak: 1.33 GiB for Qwen3-0.6B
# inference and 1.44 GiB for a LoRA step. It is there once per GPU the process touches.
CUDA_CONTEXT_BYTES = 1331 * MiB

# What a fresh process's first training steps on the CPU take beyond its run's tensors: the thread
# pools and scratch buffers of OpenMP and oneDNN, autograd's engine, gloo's buffers and DDP's
# reducer. Measured on the ranks of CPU launches of the demo model; a kernel's fine-tune mostly
# finds them made already, so only a launched rank's estimate counts them.
CPU_FRESH_PROCESS_BYTES = 20 * MiB

_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2,
                "fp16": 2, "half": 2}
_QUANT = (None, "nf4", "fp4", "int8")
_MODES = ("inference", "lora")


def loss_chunk_rows(vocab: int) -> int:
    """Rows of logits nvkit's fused loss computes at a time (``nvkit.train.loss``): about 256 MiB
    of fp32 logits per chunk, big enough for efficient matmuls and small next to the activations.
    Defined here, below the loss, because the estimate has to model the same chunk."""
    return max(16, min(4096, (1 << 26) // max(vocab, 1)))


@dataclass
class Estimate:
    """A memory prediction: ``parts`` (name → bytes) and their sum ``total``.

    ``formulas`` says how each part was computed, so the number can be checked by hand."""

    model: str
    mode: str
    dtype: str
    quantization: str | None
    batch_size: int
    seq_len: int
    parameters: int
    parts: dict[str, int] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)
    device: str = "cuda"
    lora_r: int | None = None
    gradient_checkpointing: bool = False

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def to_frame(self):
        import pandas as pd
        rows = [{"part": k, "bytes": int(v), "size": fmt_bytes(v), "formula": self.formulas.get(k, "")}
                for k, v in self.parts.items()]
        rows.append({"part": "total", "bytes": self.total, "size": fmt_bytes(self.total), "formula": ""})
        return pd.DataFrame(rows).set_index("part")

    def describe(self) -> str:
        what = f"{self.mode}, batch {self.batch_size} × {self.seq_len} tokens, {self.dtype}"
        if self.quantization:
            what += f", {self.quantization}"
        if self.mode == "lora":
            what += f", LoRA r={self.lora_r}" + (", gradient checkpointing" if self.gradient_checkpointing else "")
        return f"{self.model} ({self.parameters / 1e6:.1f} M params; {what})"

    def __str__(self) -> str:
        width = max(len(k) for k in self.parts) if self.parts else 5
        lines = [f"Estimate for {self.describe()}:"]
        for k, v in self.parts.items():
            lines.append(f"  {k:<{width}}  {fmt_bytes(v):>11}   {self.formulas.get(k, '')}")
        lines.append(f"  {'total':<{width}}  {fmt_bytes(self.total):>11}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<nvkit.Estimate {fmt_bytes(self.total)} for {self.describe()}>"


def in_fresh_process(est: "Estimate") -> "Estimate":
    """``est`` (a CPU LoRA estimate) with what a fresh process's first training steps add to it
    (``CPU_FRESH_PROCESS_BYTES``): the estimate of a launched CPU rank."""
    est.parts["fresh process"] = CPU_FRESH_PROCESS_BYTES
    est.formulas["fresh process"] = ("thread pools, scratch and gloo buffers a new rank makes at its first steps "
                                     "(measured)")
    return est


# --- the model's shape ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Shape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    parameters: int            # unique parameters (tied embeddings counted once)
    linear_params: int         # in nn.Linear layers other than the output head: what bnb quantizes
    linear_rows: int           # sum of out_features of those layers (int8 keeps one fp32 scale per row)
    lora_dims: int             # sum of (in + out) over those layers: LoRA r adds r × this many params


_shape_cache: dict[str, _Shape] = {}
_shape_lock = threading.Lock()


def _config_of(model):
    """(transformers config, display name) for what the user passed."""
    from transformers import AutoConfig, PretrainedConfig
    if isinstance(model, PretrainedConfig):
        return model, getattr(model, "name_or_path", "") or model.model_type
    cfg = getattr(model, "config", None)  # a loaded transformers model
    if isinstance(cfg, PretrainedConfig):
        return cfg, getattr(model, "name_or_path", "") or cfg.model_type
    inner = getattr(model, "model", None)  # an nvkit Session
    if inner is not None and isinstance(getattr(inner, "config", None), PretrainedConfig):
        return inner.config, getattr(model, "model_id", cfg)
    require(isinstance(model, (str, os.PathLike)) and str(model).strip() != "",
            f"estimate needs a model: 'demo', a shape name such as 'qwen3-0.6b', a local checkpoint directory, "
            f"a cached Hub id, a transformers config or a Session, not {model!r}.")
    name = os.fspath(model).strip()
    if name == "demo":
        return AutoConfig.from_pretrained(demo_path()), "demo"
    if name.lower() in SHAPES:
        return shaped_config(name), name.lower()
    local = os.path.expanduser(name)
    if os.path.isdir(local):
        require(os.path.isfile(os.path.join(local, "config.json")),
                f"{local} holds no config.json: point estimate at a checkpoint directory.")
        try:
            return AutoConfig.from_pretrained(local), name
        except (OSError, ValueError) as e:
            raise NvkitError(f"Could not read the config in {local}: {e}") from e
    try:  # a Hub id: only from the local cache, an estimate must never download
        return AutoConfig.from_pretrained(name, local_files_only=True), name
    except (OSError, ValueError) as e:
        raise NvkitError(
            f"No config for {name!r}: it is not a local directory, not a known shape ({', '.join(sorted(SHAPES))}) "
            "and not in the Hugging Face cache (estimate never downloads). Pass a checkpoint directory, a shape "
            "name, or a transformers config (AutoConfig.for_model(...)).") from e


def _text_config(cfg):
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


def attention_dims(cfg) -> tuple[int, int, int]:
    """(query heads, KV heads, head_dim) of a model config (the text part of a multimodal one)."""
    text = _text_config(cfg)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return heads, kv_heads, int(getattr(text, "head_dim", None) or text.hidden_size // heads)


def kv_bytes_per_token(cfg, itemsize: int) -> int:
    """Bytes one token adds to the KV cache: K and V in every layer, ``itemsize`` bytes each."""
    _, kv_heads, head_dim = attention_dims(cfg)
    return int(_text_config(cfg).num_hidden_layers) * kv_heads * head_dim * 2 * itemsize


def meta_model(config, **from_config_kwargs):
    """The model of ``config`` built on the meta device (no memory, no weights), to count and inspect
    its modules. Built from a copy whose dtype is unset: with a dtype, transformers sets torch's
    process-wide default dtype around the build, and a notebook's main thread would see bfloat16
    tensors appear while nvkit builds this in a worker (the Load panel's estimate does)."""
    import copy
    import torch
    from transformers import AutoModelForCausalLM
    cfg = copy.deepcopy(config)
    for c in [cfg] + [getattr(cfg, k, None) for k in getattr(cfg, "sub_configs", None) or {}]:
        if c is not None:
            c.dtype = None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg, **from_config_kwargs)


def _shape(cfg, name: str) -> _Shape:
    key = hashlib.sha256(cfg.to_json_string(use_diff=False).encode()).hexdigest()
    with _shape_lock:
        if key in _shape_cache:
            return _shape_cache[key]
    import torch
    text = _text_config(cfg)
    try:
        m = meta_model(cfg)
    except Exception as e:  # noqa: BLE001 - any failure here means the config is unusable
        raise NvkitError(f"Could not build {name!r} on the meta device to count its parameters: {e}") from e
    params = sum(p.numel() for p in m.parameters())  # parameters() yields a tied weight once
    out_head = m.get_output_embeddings()
    lin_params = lin_rows = lora_dims = 0
    for mod in m.modules():
        if isinstance(mod, torch.nn.Linear) and mod is not out_head:
            lin_params += mod.weight.numel()
            lin_rows += mod.out_features
            lora_dims += mod.in_features + mod.out_features
    heads, kv_heads, head_dim = attention_dims(cfg)
    hidden = text.hidden_size
    shape = _Shape(name=name, layers=text.num_hidden_layers, hidden=hidden,
                   intermediate=getattr(text, "intermediate_size", 4 * hidden), heads=heads,
                   kv_heads=kv_heads, head_dim=head_dim,
                   vocab=text.vocab_size, parameters=params, linear_params=lin_params,
                   linear_rows=lin_rows, lora_dims=lora_dims)
    with _shape_lock:
        _shape_cache[key] = shape
    return shape


# --- the estimate ---------------------------------------------------------------------------------

def for_session(session, **kw) -> "Estimate":
    """``estimate`` of a loaded session's model as it is loaded (config, dtype, quantization,
    device); ``kw`` describes the workload (``mode``, ``batch_size``, ``seq_len``, ...). The
    Fine-tune panel and the automatic expectations of ``nvkit.memory`` both ask through here."""
    q = session.quantization
    require(q is None or (isinstance(q, str) and q.lower() in _QUANT),
            f"nvkit.estimate models bitsandbytes nf4/fp4/int8 quantization; {session.model_id} is quantized "
            f"with {q}, so no estimate is given for it.")
    return estimate(session.model.config, dtype=str(session.dtype).replace("torch.", ""), quantization=q,
                    device="cuda" if session.device.type == "cuda" else "cpu", **kw)


def estimate(model="demo", dtype="bfloat16", quantization=None, mode="inference", batch_size=1, seq_len=1024,
             lora_r=16, gradient_checkpointing=False, *, prompt_len=None, device="cuda", path="nvkit",
             compiled=None, lora_dropout=0.05) -> Estimate:
    """Predict the peak GPU memory of running ``model`` (see the module doc for how).

    ``mode="inference"``: ``generate`` over ``batch_size`` prompts of ``prompt_len`` tokens
    (default: ``seq_len``, the worst case) up to ``seq_len`` tokens in all.
    ``mode="lora"``: one LoRA training step (all linear layers, AdamW) on ``batch_size`` ×
    ``seq_len`` tokens; on a ``quantization`` of nf4/fp4 this is QLoRA.
    ``device="cpu"`` leaves out the CUDA context.
    ``path`` (LoRA only): ``"nvkit"`` (the default) is what ``nvkit.finetune`` runs: the chunked
    fused loss (no full logits) and, on CUDA, compiled layers under ``finetune.ACTIVATION_BUDGET``
    (``compiled=False`` for a run too short to compile, see ``run.info["compile_reason"]``);
    ``"plain"`` is PEFT + Trainer as documented (the model's own loss over full logits).
    ``device="cpu"`` with ``path="nvkit"`` is ``nvkit.finetune`` on the CPU: fp32 eager layers
    (``lora_dropout`` > 0 keeps each adapted layer's dropped-out input and mask), and what the
    process's C allocator holds beyond the live tensors; the total predicts the process memory
    the run adds (``nvkit.memory.peaks.cpu_measured``), not the whole process."""
    dname = str(dtype).replace("torch.", "").lower()
    require(dname in _DTYPE_BYTES, f"dtype must be 'bfloat16', 'float16' or 'float32', not {dtype!r}.")
    qname = quantization.lower() if isinstance(quantization, str) else quantization
    require(qname in _QUANT, f"quantization must be None, 'nf4', 'fp4' or 'int8', not {quantization!r}.")
    require(mode in _MODES, f"mode must be 'inference' or 'lora', not {mode!r}.")
    whole_number("batch_size", batch_size)
    whole_number("seq_len", seq_len)
    flag("gradient_checkpointing", gradient_checkpointing)
    require(device in ("cuda", "cpu"), f"device must be 'cuda' or 'cpu', not {device!r}.")
    require(path in ("plain", "nvkit"), f"path must be 'plain' or 'nvkit', not {path!r}.")
    require(compiled is None or isinstance(compiled, bool), f"compiled must be True, False or None, not {compiled!r}.")
    if mode == "lora":
        whole_number("lora_r", lora_r)
        require(isinstance(lora_dropout, (int, float)) and not isinstance(lora_dropout, bool)
                and 0 <= lora_dropout < 1, f"lora_dropout must be a number in [0, 1), not {lora_dropout!r}.")
    if prompt_len is None:
        prompt_len = seq_len
    whole_number("prompt_len", prompt_len)
    require(prompt_len <= seq_len, f"prompt_len ({prompt_len}) cannot exceed seq_len ({seq_len}), the whole context.")

    cfg, name = _config_of(model)
    s = _shape(cfg, str(name))
    b = _DTYPE_BYTES[dname]
    B, S, L, H, I, V = batch_size, seq_len, s.layers, s.hidden, s.intermediate, s.vocab
    qd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
    parts: dict[str, int] = {}
    formulas: dict[str, str] = {}

    # Weights. bitsandbytes quantizes the nn.Linear layers except the output head; embeddings,
    # norms and the head stay in the compute dtype, except for (Q)LoRA training: PEFT's
    # prepare_model_for_kbit_training, which every QLoRA recipe (nvkit's included) runs first,
    # casts them to float32.
    other = s.parameters - s.linear_params
    other_b = 4 if qname and mode == "lora" else b
    if qname in ("nf4", "fp4"):
        # 4 bits per weight, plus the blockwise absmax: one per 64 weights, itself 8-bit with double
        # quantization (nvkit turns it on), plus one fp32 per 256 absmax blocks.
        lin = s.linear_params * (0.5 + 1 / 64 + 4 / (64 * 256))
        formulas["weights"] = f"{s.linear_params / 1e6:.0f} M linear × 0.52 B (4-bit + absmax) + {other / 1e6:.0f} M other × {other_b} B"
    elif qname == "int8":
        lin = s.linear_params * 1 + s.linear_rows * 4  # LLM.int8: int8 weights + one fp32 scale per row
        formulas["weights"] = f"{s.linear_params / 1e6:.0f} M linear × 1 B + row scales + {other / 1e6:.0f} M other × {other_b} B"
    else:
        lin = s.linear_params * b
        formulas["weights"] = f"{s.parameters / 1e6:.1f} M params × {b} B ({dname})"
    parts["weights"] = int(lin + other * other_b)

    if mode == "inference":
        # KV cache: every layer keeps K and V for every token of the context, in the compute dtype.
        parts["KV cache"] = kv_bytes_per_token(cfg, b) * S * B
        formulas["KV cache"] = f"{L} layers × {s.kv_heads} KV heads × {s.head_dim} × 2 (K,V) × {S} tok × {B} × {b} B"
        # Prefill is the activation peak: under inference_mode nothing is saved, so it is one
        # layer's working set for all prompt tokens at once (measured: residual + norm in fp32 +
        # q/k/v + attention output + gate/up/product of the MLP).
        T = B * prompt_len
        per_tok = _INF_H * H + _INF_QD * qd + _INF_KVD * kvd + _INF_I * I
        parts["activations"] = int(T * per_tok)
        formulas["activations"] = (f"{T} prompt tok × ({_INF_H}·H + {_INF_QD}·q_dim + {_INF_KVD}·kv_dim + {_INF_I}·I) B, "
                                   "one layer at a time")
        # generate keeps only the last position's logits: bf16 out, fp32 copy, processed scores.
        parts["logits"] = B * V * (b + 4 + 4)
        formulas["logits"] = f"{B} × vocab {V} × ({b} + 4 + 4) B (last position only)"
    else:
        T = B * S
        n_lora = lora_r * s.lora_dims
        # PEFT keeps adapters in fp32 (autocast_adapter_dtype) even on a bf16 model.
        parts["LoRA adapter"] = n_lora * 4
        formulas["LoRA adapter"] = f"r {lora_r} × Σ(in+out) {s.lora_dims} = {n_lora / 1e6:.2f} M params × 4 B (fp32)"
        parts["LoRA gradients"] = n_lora * 4
        formulas["LoRA gradients"] = "adapter params × 4 B"
        parts["AdamW states"] = n_lora * 8
        formulas["AdamW states"] = "adapter params × 2 moments × 4 B"
        cpu = device == "cpu" and path == "nvkit"
        if cpu:
            # nvkit.finetune on the CPU trains in fp32, eager: no bf16 copies, but every tensor 4 B,
            # and PEFT's dropout (when on) keeps each adapted layer's dropped-out input and mask
            ch, cq, ckv, ci, cr, final = _CPU_LORA_DROPOUT if lora_dropout > 0 else _CPU_LORA
            keep = 4  # a checkpointed layer keeps its fp32 input
        else:
            # Saved activations, bytes per token per layer, measured with PEFT all-linear LoRA
            # (fp32 adapters: each adapted layer keeps an fp32 copy of its input) on a bf16 model.
            ch, cq, ckv, ci, cr, final = _LORA_H, _LORA_QD, _LORA_KVD, _LORA_I, _LORA_R, _FINAL_H
            keep = 2
        per_layer = ch * H + cq * qd + ckv * kvd + ci * I + cr * lora_r
        budget = path == "nvkit" and device == "cuda" and compiled is not False
        if budget:  # the compiled layers keep about this share of what eager autograd saves
            per_layer = int(per_layer * _BUDGET_SHARE)
        if gradient_checkpointing:
            # Each layer keeps only its input; during backward one layer is recomputed at a time
            # (its activations plus their gradients, about twice its saved set).
            act = T * (L * keep * H + final * H) + T * 2 * per_layer
            formulas["activations"] = (f"{T} tok × ({L} layers × {keep}·H + {final}·H) + one layer recomputed "
                                       f"(2 × {per_layer} B/tok)")
        else:
            act = T * (L * per_layer + final * H)
            formulas["activations"] = (f"{T} tok × ({L} layers × ({ch}·H + {cq}·q_dim + {ckv}·kv_dim "
                                       f"+ {ci}·I + {cr}·r) + {final}·H) B")
        if cpu:
            formulas["activations"] += (", fp32 on the CPU" + (f" with LoRA dropout {lora_dropout:g}"
                                                               if lora_dropout > 0 else ""))
        if budget:
            formulas["activations"] += f", per-layer part × {_BUDGET_SHARE} (compiled under an activation budget)"
        parts["activations"] = int(act)
        if cpu:
            # On an fp32 model the fused loss forms softmax and gradient in place in its one
            # chunk of logits; the hidden states' gradient is in the activations' final term.
            rows = min(loss_chunk_rows(V), T)
            parts["logits"] = rows * V * 4
            formulas["logits"] = f"fused loss: {rows}-row chunk × vocab {V} × 4 B (fp32, softmax and grad in place)"
            # glibc keeps the blocks a step frees and hands them out again only where they fit, so
            # the process grows past the live tensors by about this share of a step's tensors
            parts["CPU allocator"] = int(_CPU_ALLOCATOR_SHARE * (act + parts["logits"]))
            formulas["CPU allocator"] = (f"{_CPU_ALLOCATOR_SHARE} × (activations + logits): freed blocks the C "
                                         "allocator keeps between steps")
        elif path == "nvkit":
            # The fused loss: one chunk of fp32 logits at a time (its logits, softmax and
            # gradient), plus the fp32 gradient of the hidden states.
            rows = min(loss_chunk_rows(V), T)
            parts["logits"] = rows * V * 4 * 3 + T * H * 4
            formulas["logits"] = (f"fused loss: {rows}-row chunk × vocab {V} × 4 B × 3 (logits, softmax, grad) "
                                  f"+ {T} tok × {H} × 4 B (hidden grad)")
        else:
            # The loss: bf16 logits, their fp32 upcast, log-softmax (saved) and, at the start of
            # backward, the fp32 gradients of both: 2 + 4 + 4 + 4 bytes per logit.
            parts["logits"] = T * V * _LOGIT_BYTES
            formulas["logits"] = f"{B} × {S} tok × vocab {V} × {_LOGIT_BYTES} B (bf16 + fp32 upcast, log-softmax, grads)"
    if device == "cuda":
        parts["CUDA context"] = CUDA_CONTEXT_BYTES
        formulas["CUDA context"] = "driver context, kernels, cuBLAS workspaces (per GPU used)"
    return Estimate(model=str(name), mode=mode, dtype=dname, quantization=qname, batch_size=B, seq_len=S,
                    parameters=s.parameters, parts={k: int(v) for k, v in parts.items()}, formulas=formulas,
                    device=device, lora_r=lora_r if mode == "lora" else None,
                    gradient_checkpointing=gradient_checkpointing if mode == "lora" else False)


# Measured coefficients (bytes per token), see the module doc.
_LORA_H, _LORA_QD, _LORA_KVD, _LORA_I, _LORA_R = 26, 12, 8, 10, 52
_FINAL_H = 6
_LOGIT_BYTES = 14
# Share of the eager per-layer saved bytes that nvkit's compiled layers keep under
# finetune.ACTIVATION_BUDGET = 0.5, calibrated from one H200 run of the LoRA bench (the sum is in
# docs/benchmarks.md, "Memory estimate vs measurement"); tests/gpu checks it at another shape.
_BUDGET_SHARE = 0.28
_INF_H, _INF_QD, _INF_KVD, _INF_I = 12, 4, 4, 6
# nvkit.finetune on the CPU (fp32, eager, fused loss), bytes per token: per layer (H, q_dim,
# kv_dim, I, r) and the final H term, with LoRA dropout on and off; a least-squares fit over ten
# Qwen3 shapes of live-tensor measurements (tests/memory/test_estimate.py re-measures two).
_CPU_LORA_DROPOUT = (48, 20, 12, 20, 28, 4)
_CPU_LORA = (16, 12, 12, 16, 28, 16)
# RSS the process adds beyond its live tensors over a run of steps, as a share of one step's
# activations and logits: glibc on x86-64, measured on the demo model's LoRA runs in a worker
# thread (a kernel's fine-tune) and in launched ranks, whose spread this sits in the middle of.
_CPU_ALLOCATOR_SHARE = 0.8
