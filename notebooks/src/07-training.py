# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Training: Trainer, precision, LoRA and QLoRA
#
# `TrainingArguments` finds the NVIDIA GPU by itself, so `Trainer` needs no device setting. Use
# bf16 mixed precision on Ampere or newer and fp16 on older GPUs. nvkit's fine-tunes are
# transformers' `Trainer` plus PEFT LoRA, run in a worker thread with the loss and memory drawn
# live.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

STEPS = int(os.environ.get("NVKIT_STEPS", "4"))  # training steps per run; a few show the loop

# %% [markdown]
# ## LoRA with the fine-tune panel
#
# Data (examples inline or a `.jsonl`/`.json`/`.csv`/`.txt` file), LoRA and training settings, an
# estimate of the peak memory, Start and Stop, then loss and memory on one time axis. Start
# returns at once; `await` the run (or `run.result()`) to wait for it.

# %%
import nvkit

s = nvkit.load(MODEL)
panel = nvkit.FinetunePanel()
panel.steps.value = STEPS
panel.batch.value = 4
panel.seq_len.value = 64
panel

# %%
run = panel.start()  # the Start button
await run
print(run)
print(panel.code())

# %%
import math

import pandas as pd

history = pd.DataFrame(run.history)
history["memory_MiB"] = history["memory"] / 2**20  # GPU allocated on CUDA, process RSS on the CPU
print(history[["step", "loss", "tokens_per_s", "memory_MiB"]].round(3).to_string(index=False))
print(run.summary())
assert run.error is None and run.step == STEPS
assert all(math.isfinite(x) for x in history["loss"])
assert os.path.isdir(run.adapter_dir)

# %% [markdown]
# What nvkit changes from PEFT + `Trainer` as documented: the loss runs the LM head chunk by chunk
# (the full logits, most of a small model's peak, never exist), and on a GPU each decoder layer is
# compiled under an activation-memory budget, so the compiler keeps half of what the backward
# needs and recomputes the cheapest rest. Measured on an H200 (Qwen3-0.6B shape, LoRA r=16,
# 8 × 512): 27.8 k tokens/s at 4.8 GiB peak against 16.9 k at 17.0 GiB; `nvkit bench --lora`
# measures it on your GPU. The run predicted its own peak beforehand (`nvkit.estimate(...,
# path="nvkit")`), and the prediction stands beside the measurement:

# %%
from nvkit.memory import comparisons

train = [c for c in comparisons(frame=False) if c.what == "train"][-1]
print(train)
print({k: run.info.get(k) for k in ("compile", "activation_budget", "loss")})
assert train.estimate is not None and "fused loss" in train.estimate.formulas["logits"]

# %% [markdown]
# After the run the session generates with the adapter attached. `s.merge_adapter()` folds it into
# the weights; `s.unload_adapter()` removes it; `s.load_adapter(dir)` brings a saved one back.

# %%
print(s.info["adapters"])
text = s.generate("What does nvkit do?", chat=True, max_new_tokens=24)
print(text)
assert s.info["adapters"] and isinstance(text, str)
s.unload_adapter()
assert not s.info["adapters"]

# %% [markdown]
# ## Precision
#
# `TrainingArguments` finds the device by itself; the precision is a choice: bf16 from compute
# capability 8.0 (Ampere), fp16 before, fp32 on the CPU. `nvkit.model.precision.precision` makes it for
# nvkit's runs, and plain transformers takes it like this:

# %%
import tempfile

import torch
from nvkit.model.precision import precision
from transformers import TrainingArguments

device_type = "cuda" if torch.cuda.is_available() else "cpu"
capability = torch.cuda.get_device_capability(0) if device_type == "cuda" else None
prec = precision(device_type, capability)  # bf16 from capability 8.0, fp16 before, fp32 on the CPU
args = TrainingArguments(output_dir=tempfile.mkdtemp(), bf16=prec == "bf16", fp16=prec == "fp16",
                         report_to=[])
print("precision:", prec, "· TrainingArguments.device:", args.device)
assert args.device.type == device_type and prec == run.info["precision"]

# %% [markdown]
# `torch.cuda.is_bf16_supported()` can say True on GPUs older than Ampere (it emulates), so nvkit
# checks the compute capability itself. On the CPU `bf16=True` raises: training stays in fp32.

# %% [markdown]
# ## QLoRA: LoRA on a 4-bit model
#
# For a model that does not fit in 16-bit, load it in 4-bit (nf4) and train LoRA adapters on top;
# `nvkit.finetune` notices the quantized model and prepares it for k-bit training.

# %%
s = nvkit.load(MODEL, quantization="nf4")
data = [
    {"prompt": "Which GPUs support bf16?", "response": "Ampere and newer, compute capability 8.0 and up."},
    {"prompt": "What does QLoRA train?", "response": "LoRA adapters on top of a 4-bit model."},
    {"prompt": "How does PyTorch reach an NVIDIA GPU?", "response": "Through CUDA, as the device 'cuda'."},
]
run = nvkit.finetune(s, data, max_steps=STEPS, batch_size=2, seq_len=64)
await run
print(run)
print({k: run.info[k] for k in ("precision", "qlora", "loss")})
assert run.error is None and run.info["qlora"] and run.history

# %% [markdown]
# ## From a cell
#
# `%%nvkit finetune` takes one example per line (plain text, or JSON like below; one kind per run)
# and trains the loaded model, printing the loss as it goes. Here it trains a fresh adapter on the
# 4-bit model, after the one above is removed.

# %%
# %load_ext nvkit
s.unload_adapter();

# %%
# %%nvkit finetune --steps 2 --batch-size 2 --seq-len 64
{"prompt": "What is a CUDA graph?", "response": "A recorded sequence of GPU work replayed with one launch."}
{"prompt": "What is NCCL?", "response": "NVIDIA's library for collective communication between GPUs."}

# %%
assert nvkit.session().info["adapters"]  # the magic's run attached its adapter
s.unload();

# %% [markdown]
# Next: **08-distributed-training**.
