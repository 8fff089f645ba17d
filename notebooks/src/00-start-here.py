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
# # Start here: nvkit in ten minutes
#
# nvkit runs Hugging Face Transformers on NVIDIA GPUs from a notebook. You pick GPUs, an attention
# backend, Hub kernels and quantization in small panels, load a model into the kernel, generate
# text, run a short LoRA fine-tune and watch GPU memory live. Every panel can print the Python it
# runs (`panel.code()`), so whatever you click can become a cell you keep.
#
# Everything in these tutorials also runs on a laptop without a GPU: nvkit ships a tiny demo model
# (`nvkit.load("demo")`, a 4 M parameter Qwen3 trained on a small corpus) and never needs the
# Hugging Face Hub for it. Cells that only make sense on a CUDA GPU print why they were skipped.
#
# | notebook | topic |
# |---|---|
# | 00-start-here | what nvkit is, `nvkit doctor`, the whole app in one widget |
# | 01-check-the-gpu | is CUDA usable here, how many GPUs, the driver's view vs PyTorch's |
# | 02-select-gpus | choosing and ordering GPUs: `CUDA_VISIBLE_DEVICES`, `PCI_BUS_ID`, torchrun lines |
# | 03-attention-backends | sdpa, FlashAttention 2/3/4, switching, measuring |
# | 04-inference | load, `device_map`, generate, chat, batches, `%nvkit generate`, the fast path |
# | 05-hub-kernels | `use_kernels`, `KernelConfig`, local kernels, train/eval switching |
# | 06-quantization | 4-bit and 8-bit, footprint, estimate vs measurement |
# | 07-training | Trainer, bf16/fp16, LoRA and QLoRA with the fine-tune panel |
# | 08-distributed-training | torchrun, DDP vs FSDP2, `nvkit.launch` |
# | 09-gpu-memory | where memory goes, the live monitor, estimates, out-of-memory post-mortems |

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

# %% [markdown]
# ## Is this machine ready? `nvkit doctor`
#
# In a terminal, `nvkit doctor` answers the first questions: can PyTorch use CUDA, which GPUs the
# driver reports, which versions are installed, and which attention backends and quantization
# methods work here (and why the others don't). The same entry point runs inside the notebook:

# %%
from nvkit.cli import doctor_report, main as nvkit_cli

exit_code = nvkit_cli(["doctor"])  # prints exactly what `nvkit doctor` prints in a terminal
assert exit_code == 0

# %% [markdown]
# The same facts come as data from `doctor_report()`, for your own checks:

# %%
report = doctor_report()
working = [b["name"] for b in report["attention_backends"] if b["available"]]
print("CUDA usable:", report["cuda_available"], "· CUDA devices:", report["cuda_device_count"])
print("attention backends that work here:", ", ".join(working))
assert "sdpa" in working  # PyTorch's own attention works everywhere

# %% [markdown]
# ## The whole kit in one widget: `nvkit.panel()`
#
# Five tabs, one per step: **GPUs** (choose and order them), **Model** (what to load and how, with
# a memory estimate before loading), **Generate**, **Fine-tune** and **Memory** (a live chart).
# Each tab is also a panel of its own: `nvkit.GPUSelector()`, `nvkit.LoadPanel()`,
# `nvkit.GeneratePanel()`, `nvkit.FinetunePanel()`, `nvkit.MemoryChart()`.

# %%
import nvkit

app = nvkit.panel()
app.parts["Model"].model.value = MODEL  # the Model tab starts on this notebook's model
app

# %% [markdown]
# `app.code()` is the Python for what the tabs are set to now; change a tab and run it again:

# %%
print(app.code())
assert "nvkit.select_gpus(" in app.code() and "nvkit.load(" in app.code()

# %% [markdown]
# ## The same thing from code
#
# `nvkit.load` returns a `Session`; `s.model` and `s.tokenizer` are the plain transformers objects.
# Generation runs in a worker thread: Interrupt stops it cleanly, and `await s.agenerate(...)`
# keeps the notebook's widgets responsive while it runs.

# %%
s = nvkit.load(MODEL)
print(s.summary())

prompt = "NVIDIA GPUs are"
text = s.generate(prompt, max_new_tokens=24)
print(prompt + text)
print(s.last_stats)
assert isinstance(text, str) and text

# %% [markdown]
# ## Or from a cell: `%nvkit`
#
# `%load_ext nvkit` adds the `%nvkit` magic (`%nvkit?` lists its commands). It uses the model that
# is loaded, or loads the demo model when none is.

# %%
# %load_ext nvkit
# %nvkit generate -n 16 "A GPU is"

# %%
freed = s.unload()
print(f"unloaded, {freed / 2**20:.1f} MiB freed")

# %% [markdown]
# Next: **01-check-the-gpu**.
