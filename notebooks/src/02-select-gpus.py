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
# # Select and order GPUs
#
# `CUDA_VISIBLE_DEVICES` chooses which GPUs a process may use and in which order:
# `CUDA_VISIBLE_DEVICES=2,0` makes GPU 2 `cuda:0` and GPU 0 `cuda:1`; an empty value means no GPU
# at all. Three rules make it work as intended:
#
# 1. **Put it on the same line as the command** (`CUDA_VISIBLE_DEVICES=2,0 torchrun train.py`).
#    An `export` you forgot sends later runs to the wrong GPUs without a word.
# 2. **Set `CUDA_DEVICE_ORDER=PCI_BUS_ID`.** By default CUDA numbers GPUs fastest first, which can
#    differ from `nvidia-smi`'s numbering; with PCI_BUS_ID the indices are `nvidia-smi`'s.
# 3. **Set it before CUDA starts.** CUDA reads it once per process.
#
# `nvkit.select_gpus` does all three for this kernel; `nvkit.launch_command` writes the line for
# scripts. This notebook never starts CUDA before the last section, so every choice takes effect.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

# %% [markdown]
# ## The GPUs of this machine
#
# Indices are `nvidia-smi`'s. On a machine without an NVIDIA GPU this tutorial uses nvkit's fake
# inventory (`NVKIT_FAKE_GPUS=4`, four H200s): only nvkit's view of the hardware is fake, the
# variables it sets and the mapping it computes are the real ones.

# %%
import nvkit

gpus = nvkit.gpus()
if not gpus:
    os.environ["NVKIT_FAKE_GPUS"] = "4"
    gpus = nvkit.gpus()
    print("No NVIDIA GPU on this machine: using NVKIT_FAKE_GPUS=4 (four fake H200s) below.")
for g in gpus:
    print(g)

# %% [markdown]
# ## Choose and order: `nvkit.select_gpus`
#
# The guide's example: GPU 2 as `cuda:0` and GPU 0 as `cuda:1` (on a machine with fewer GPUs, the
# ones there are, in reverse order).

# %%
usable = [d.index for d in nvkit.selection().devices]  # all GPUs, unless the kernel started with a subset
choice = [2, 0] if {0, 2} <= set(usable) else usable[::-1]
sel = nvkit.select_gpus(choice)
print(sel)
assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, choice))
assert [d.index for d in sel.devices] == choice  # cuda:i is the i-th GPU of the choice

# %% [markdown]
# `nvkit.selection()` tells what is in force in this process at any time:

# %%
print(nvkit.selection())
print(nvkit.selection().mapping["cuda:0"])

# %% [markdown]
# ## CPU only
#
# An empty `CUDA_VISIBLE_DEVICES` hides every GPU: PyTorch then runs on the CPU.
# `nvkit.select_gpus([])` sets it (and `%nvkit select cpu` does the same from a cell).

# %%
cpu = nvkit.select_gpus([])
print(cpu)
assert cpu.cpu_only and os.environ["CUDA_VISIBLE_DEVICES"] == ""

# %% [markdown]
# ## nvidia-smi's order and CUDA's: `PCI_BUS_ID`
#
# `nvidia-smi` numbers GPUs by PCI bus id. CUDA, unless told otherwise, puts the fastest first, so
# in a machine with mixed GPUs "GPU 1" can mean two different cards. Here is what nvkit notices
# when the order variable is missing:

# %%
for g in gpus:
    print(f"nvidia-smi GPU {g.index}: bus {g.pci_bus_id} · {g.name}")

os.environ.pop("CUDA_DEVICE_ORDER")
os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, choice))  # as a hand-written export would
print(nvkit.selection())
assert any("PCI_BUS_ID" in note for note in nvkit.selection().notes)

# %% [markdown]
# Selecting through nvkit always sets both variables:

# %%
sel = nvkit.select_gpus(choice)
assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
assert not any("is not PCI_BUS_ID" in note for note in sel.notes), sel.notes
print(sel.env_line)

# %% [markdown]
# ## The selector panel
#
# Tick GPUs in the order you want them (`cuda:0` first), reorder with the arrows, or choose
# *CPU only* / *All GPUs*, then **Apply**. The panel starts from the choice in force and shows the
# `cuda:i` mapping and the matching torchrun line as you click; `.code()` is the call Apply makes.

# %%
selector = nvkit.GPUSelector()
selector

# %%
print(selector.code())
assert selector.code().strip().endswith(f"nvkit.select_gpus({choice})")

# %% [markdown]
# ## The line for scripts: torchrun and accelerate
#
# A training script runs in a new process, so it needs the variables on its own command line.
# `nvkit.launch_command` writes it for this kernel's choice (or `gpus=` another one); the process
# count defaults to the number of GPUs chosen.

# %%
line = nvkit.launch_command("train.py")
print(line)
print(nvkit.launch_command("train.py", launcher="accelerate"))
print(nvkit.launch_command("train.py", gpus=[]))  # no GPU: CUDA_VISIBLE_DEVICES= (empty)
expected = (f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={','.join(map(str, choice))} "
            f"torchrun --nproc_per_node={len(choice)} train.py")
assert line == expected, line

# %% [markdown]
# ## Once CUDA has started, a new choice waits for a restart
#
# After the first CUDA call the process keeps its GPUs. nvkit then changes nothing, says so, and
# keeps the new choice for this kernel: after *Kernel ▸ Restart* it is applied as soon as nvkit is
# imported, before any CUDA work. (The selector panel shows the same warning.)

# %%
if os.environ.get("NVKIT_FAKE_GPUS"):
    print("Skipped: starting CUDA needs a real NVIDIA GPU (this machine has none; the GPUs above are fake).")
else:
    import torch

    nvkit.select_gpus(None)  # all GPUs again
    if not torch.cuda.is_available():  # this call starts CUDA
        print("Skipped: the driver lists GPUs but CUDA is not usable in this process (see nvkit doctor).")
    else:
        torch.cuda.init()
        later = nvkit.select_gpus([])
        print(later)
        assert later.restart_needed and not later.in_force
        print(nvkit.select_gpus(None))  # back to what is in force: nothing waits for a restart

# %% [markdown]
# Next: **03-attention-backends**.
