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
# # Attention backends
#
# `attn_implementation` chooses the attention code when a model is loaded, for inference and for
# training alike:
#
# | backend | needs | when the package is missing |
# |---|---|---|
# | `sdpa` (default) | PyTorch | built in; on CUDA it picks flash / memory-efficient kernels itself |
# | `eager` | PyTorch | built in; plain matmuls, slowest |
# | `flash_attention_2` | Ampere or newer | Hub kernel `kernels-community/flash-attn2` |
# | `flash_attention_3` | Ampere or newer (written for Hopper) | Hub kernel `kernels-community/vllm-flash-attn3` |
# | `flash_attention_4` | Hopper or newer | Hub kernel `kernels-community/flash-attn4` |
#
# Transformers falls back to a Hub kernel without saying so, and offline that fails deep inside
# `from_pretrained`. nvkit checks first: each backend is listed with whether it works on this
# device and, when it doesn't, why.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

# %%
import nvkit
import torch

backends = nvkit.attention_backends()
backends

# %%
for c in backends:
    if not c.available:
        print(f"{c.name}: {c.reason}")
assert backends["sdpa"].available and backends["eager"].available

# %% [markdown]
# ## Choosing a backend in the Model panel
#
# Unavailable backends are greyed out (hover for the reason). Here the panel is set to `eager`
# from code, as a click would, then loads; `.code()` is the `nvkit.load` call it makes.

# %%
panel = nvkit.LoadPanel(model=MODEL)
panel.select_attention("eager")
panel

# %%
print(panel.code())
s = await panel.load()  # loads in a worker thread; the notebook stays responsive
print(s.summary())
assert "attn_implementation='eager'" in panel.code()
assert s.info["attention"] == "eager"

# %% [markdown]
# ## Switching on a loaded model
#
# `s.set_attention(name)` switches without reloading the weights; an unknown or unusable backend
# raises `NvkitError` with the reason and leaves the model as it was. `"auto"` picks by what
# `nvkit.bench` measured: on an H200 with the Qwen3-0.6B shape (prompt 512, batch 1) sdpa prefilled
# 20.1 k tok/s against FlashAttention-4's 13.1 k, and decoded 41.8 against 33.7 tok/s, so sdpa comes
# first and the FlashAttention backends follow. Pass a backend by name to use it anyway.

# %%
prompt = "NVIDIA GPUs are"
eager_text = s.generate(prompt, max_new_tokens=16)
print("now:", s.set_attention("sdpa"))
sdpa_text = s.generate(prompt, max_new_tokens=16)
print("eager:", repr(eager_text))
print("sdpa: ", repr(sdpa_text))
print("same greedy text:", eager_text == sdpa_text)
assert s.info["attention"] == "sdpa" and sdpa_text

# %%
unusable = [c.name for c in backends if not c.available]
if not unusable:
    print("Every backend works on this device: no refusal to show.")
else:
    try:
        s.set_attention(unusable[0])
        raise AssertionError(f"{unusable[0]} was accepted although it is listed as unavailable")
    except nvkit.NvkitError as e:
        print(e)
    assert s.info["attention"] == "sdpa"  # unchanged
print("auto picks:", s.set_attention("auto"))

# %% [markdown]
# ## FlashAttention on this GPU
#
# On a GPU with FlashAttention installed (`pip install 'nvkit[fa4]'` brings FlashAttention-4 for
# Hopper and newer), load with it directly. Without the package, nvkit tells you which Hub kernel
# transformers would fetch instead and whether it is in your local cache.

# %%
flash = [c.name for c in backends if c.available and c.name.startswith("flash_attention")]
if not torch.cuda.is_available():
    print("Skipped: FlashAttention needs a CUDA GPU (Ampere or newer; FA4 Hopper or newer), and this machine has none.")
elif not flash:
    print("Skipped: no FlashAttention version is usable on this GPU:")
    for c in backends:
        if c.name.startswith("flash_attention"):
            print(f"  {c.name}: {c.reason}")
else:
    s = nvkit.load(MODEL, attn_implementation=flash[0])
    text = s.generate(prompt, max_new_tokens=16)
    print(s.summary())
    print(prompt + text)
    assert s.info["attention"] == flash[0] and text

# %% [markdown]
# ## Measure: `nvkit.bench`
#
# Every available backend on the same random prompts, against plain transformers with sdpa: time
# to first token (prefill), decode speed, peak memory, and how many greedy tokens match the
# reference. On the CPU with the demo model the numbers are tiny; on a GPU use a real-size model.

# %%
to_try = ["sdpa", "eager"] + flash
df = nvkit.bench(MODEL, backends=to_try, prompt_len=64, new_tokens=16, repeats=1)
assert (df["error"] == "").all(), df[df["error"] != ""]
assert len(df) == len(to_try) + 1  # plus the plain-transformers reference row
df

# %%
from nvkit.benchmarks import bench_chart

bench_chart(df)

# %% [markdown]
# Next: **04-inference**.
