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
# # Quantization: 4-bit and 8-bit
#
# Quantization stores weights in fewer bits so bigger models fit in GPU memory. bitsandbytes gives
# `nf4` and `fp4` (4-bit, the QLoRA format) and `int8` (LLM.int8()). Since bitsandbytes 0.50 they
# run on the CPU too, so this tutorial runs anywhere; on the CPU they save memory, not time.
#
# For each choice nvkit estimates the memory before loading and measures it after, side by side.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

QUANT = os.environ.get("NVKIT_QUANT", "nf4")  # nf4, fp4 or int8

# %%
import nvkit
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
methods = nvkit.quantization_methods()
methods

# %%
assert methods[QUANT].available, methods[QUANT].reason

# %% [markdown]
# ## Estimate first
#
# `nvkit.estimate` works from the model's config alone (nothing is loaded): weights, KV cache,
# activations, logits and, on a GPU, the CUDA context.

# %%
s = nvkit.load(MODEL)
dtype = str(s.dtype).replace("torch.", "")
base_footprint = s.info["footprint_bytes"]
print(s.summary())
s.unload()

estimates = {q: nvkit.estimate(MODEL, dtype=dtype, quantization=q, seq_len=256, device=DEVICE)
             for q in dict.fromkeys((None, QUANT, "int8"))}
print(estimates[QUANT])  # each part with the formula behind it
assert estimates[QUANT].parts["weights"] < estimates[None].parts["weights"]

# %%
import pandas as pd

table = pd.DataFrame({q or dtype: {**e.parts, "total": e.total} for q, e in estimates.items()}) / 2**20
table.round(2)  # MiB

# %% [markdown]
# ## Load quantized: the Model panel
#
# Choose the method in the panel (4-bit has options: double quantization, compute dtype); `.code()`
# is the load call.

# %%
panel = nvkit.LoadPanel(model=MODEL)
panel.quant.value = QUANT
panel

# %%
print(panel.code())
s = await panel.load()
print(s.summary())
assert s.info["quantization"] == QUANT

# %% [markdown]
# ## Estimate vs measured

# %%
q_footprint = s.info["footprint_bytes"]
print(f"weights, unquantized ({dtype}): {base_footprint / 2**20:9.2f} MiB measured, "
      f"{estimates[None].parts['weights'] / 2**20:9.2f} MiB estimated")
print(f"weights, {QUANT}:{' ' * (14 + len(dtype) - len(QUANT))}{q_footprint / 2**20:9.2f} MiB measured, "
      f"{estimates[QUANT].parts['weights'] / 2**20:9.2f} MiB estimated")
print(f"saved: {1 - q_footprint / base_footprint:.0%}")
assert q_footprint < base_footprint
text = s.generate("NVIDIA GPUs are", max_new_tokens=16)
print("NVIDIA GPUs are" + text)
assert text

# %% [markdown]
# The saving is largest on big models: embeddings, norms and the output head stay in the compute
# dtype, and on a tiny model they are most of the weights.
#
# ## Speed and memory side by side
#
# `nvkit.bench` loads each choice in turn and compares it with the unquantized reference
# (greedy tokens that match, time to first token, decode speed, peak memory).

# %%
# int8 only on a GPU: on the CPU bitsandbytes casts float32 inputs to float16 at every matmul and
# warns each time, which would bury the table
quants = [None, QUANT] + (["int8"] if DEVICE == "cuda" and QUANT != "int8" else [])
df = nvkit.bench(MODEL, quantizations=quants, prompt_len=32, new_tokens=8, repeats=1)
assert (df["error"] == "").all(), df[df["error"] != ""]
df

# %% [markdown]
# To fine-tune a model that does not fit in 16-bit, load it in 4-bit and train LoRA adapters on
# top (QLoRA): tutorial **07-training**.
