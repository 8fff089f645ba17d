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
# # Check the GPU: is CUDA usable here?
#
# Two programs can tell you about your GPUs, and they don't always agree:
#
# - the **driver**, through NVML (the library behind `nvidia-smi`): every GPU in the machine,
#   in PCI bus order, with memory and utilization. Asking NVML does not start CUDA.
# - **PyTorch**, through the CUDA runtime: only the GPUs this process may use
#   (`CUDA_VISIBLE_DEVICES`), numbered `cuda:0`, `cuda:1`, ... Asking it starts CUDA's driver.
#
# nvkit lists GPUs with NVML, so a GPU choice made afterwards (tutorial 02) still counts.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

# %% [markdown]
# ## What the driver sees

# %%
import nvkit
from nvkit.hardware import nvml_status

gpus = nvkit.gpus()
print(nvml_status())
for g in gpus:
    print(g)
print("CUDA started in this process yet?", nvkit.selection().cuda_initialized)
assert not nvkit.selection().cuda_initialized  # reading NVML never starts CUDA

# %% [markdown]
# `%nvkit gpus` prints the same as a table, with the processes using each GPU:

# %%
# %load_ext nvkit
# %nvkit gpus

# %% [markdown]
# ## What PyTorch sees
#
# The guide's check. On a machine with four usable GPUs it prints `True 4`; without a GPU (or
# without a working driver) `False 0`.

# %%
import torch

print(torch.cuda.is_available(), torch.cuda.device_count())

# %% [markdown]
# `torch.cuda.is_available()` already starts the CUDA driver when there is one. From then on, this
# process keeps the GPUs it saw, whatever `CUDA_VISIBLE_DEVICES` says later: choose GPUs before
# anything touches CUDA.

# %%
print("CUDA started in this process now?", nvkit.selection().cuda_initialized)
# NVML lists every GPU of the machine; CUDA only those this process may use
assert len(gpus) >= torch.cuda.device_count()

# %% [markdown]
# ## Each CUDA device in detail
#
# The compute capability decides what a GPU can do: bf16 arithmetic and FlashAttention 2/3 need
# 8.0 (Ampere) or newer, FlashAttention-4 9.0 (Hopper) or newer.

# %%
if not torch.cuda.is_available():
    print("Skipped: per-device properties need a CUDA GPU (this machine has none).")
else:
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        cc = (p.major, p.minor)
        precision = "bf16" if cc >= (8, 0) else "fp16 (bf16 needs Ampere or newer)"
        print(f"cuda:{i}: {p.name} · capability {p.major}.{p.minor} · "
              f"{p.total_memory / 2**30:.1f} GiB · {p.multi_processor_count} SMs · train in {precision}")
    free, total = torch.cuda.mem_get_info(0)
    print(f"cuda:0 free now: {free / 2**30:.1f} of {total / 2**30:.1f} GiB")
    assert total > 0

# %% [markdown]
# ## The doctor agrees

# %%
from nvkit.cli import doctor_report

r = doctor_report()
print({k: r[k] for k in ("cuda_available", "cuda_device_count", "torch_cuda_build")})
assert r["cuda_available"] == torch.cuda.is_available()
assert r["cuda_device_count"] == torch.cuda.device_count()

# %% [markdown]
# ## Where a model lands
#
# Without a `device_map`, `nvkit.load` puts the model on `cuda` when a GPU is usable and on the CPU
# otherwise, and says which in its summary.

# %%
s = nvkit.load(MODEL)
print(s.summary())
assert s.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
x = torch.ones(3, device=s.device)
print("a tensor on the model's device:", x.device)
s.unload();

# %% [markdown]
# Next: **02-select-gpus**.
