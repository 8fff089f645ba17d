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
# # Hub kernels
#
# `use_kernels=True` replaces supported layers (activations, RMSNorm, rotary embeddings, MoE
# layers, ...) with optimized kernels downloaded from the Hugging Face Hub; NVIDIA GPUs have the
# widest coverage. A `KernelConfig` chooses the kernels yourself, with `"cuda"` as the device key
# for NVIDIA-specific mappings. Kernels follow the model's mode: `model.train()` and
# `model.eval()` switch to the training or inference variant.
#
# Kernels come from the Hub, so they need the network (or a local copy). nvkit checks a kernels
# request before touching the loaded model and says what is missing; a local kernel directory
# works offline, and on the CPU too.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

# %%
import nvkit
import torch
from nvkit.model.backends import hub_offline, kernels_problem
from nvkit.model.kernels import model_kernel_layers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
print("kernels package:", kernels_problem() or "installed, in the range transformers accepts")
print("Hub offline (HF_HUB_OFFLINE):", hub_offline())

# %% [markdown]
# Transformers marks the layers a kernel may replace; this model has these (the reference logits
# are for a comparison further down):

# %%
plain = nvkit.load(MODEL)
layers = model_kernel_layers(plain.model)
print("kernel layers:", layers)
assert "RMSNorm" in layers
ids = plain.tokenizer("NVIDIA GPUs are fast", return_tensors="pt").input_ids.to(plain.device)
with torch.no_grad():
    reference = plain.model(ids).logits.float()
plain.unload();

# %% [markdown]
# ## `use_kernels=True`
#
# nvkit reports, per layer, which kernel replaced it and from where, or why it stayed as it was.
# Offline without cached kernels, the load is refused before anything changes.

# %%
try:
    s = nvkit.load(MODEL, use_kernels=True)
    k = s.info["kernels"]
    print("replaced:", k["replaced"] or "nothing")
    for layer, why in k.get("unchanged", {}).items():
        print(f"  {layer}: {why}")
except nvkit.NvkitError as e:
    print("nvkit.load(use_kernels=True) refused:", e)

# %% [markdown]
# ## `KernelConfig` with a `"cuda"` key
#
# The mapping goes from the model's kernel layer names to `"org/repo:LayerClass"` per device.

# %%
from transformers import KernelConfig

kc = KernelConfig({"RMSNorm": {"cuda": "kernels-community/liger_kernels:LigerRMSNorm"}})
print(kc.kernel_mapping)
if DEVICE != "cuda":
    print("Skipped loading with it: a 'cuda' mapping applies on a CUDA GPU (this machine has none).")
else:
    try:
        s = nvkit.load(MODEL, use_kernels=True, kernel_config=kc)
        print("replaced:", s.info["kernels"]["replaced"])
    except nvkit.NvkitError as e:
        print("refused before loading:", e)

# %% [markdown]
# ## A local kernel
#
# A kernel is a directory in the Hub's layout: `build/<variant>/<package>/` with a `layers`
# module, plus `metadata.json`. `torch-universal` is the variant for pure PyTorch or Triton code.
# We write a small RMSNorm kernel and load the model with it; `local_kernel_config` builds the
# `KernelConfig(use_local_kernel=True)` for a directory (a plain dict for the CPU, which
# `KernelConfig` does not accept but nvkit does).

# %%
# the kernel's code: a pure PyTorch RMSNorm (a real kernel would launch CUDA or Triton code here)
LAYERS_PY = '''import torch
from torch import nn

CALLS = [0]  # counts forward calls, so we can see the kernel run


class RMSNorm(nn.Module):
    """Replaces the forward of the model's RMSNorm layers. A kernel layer defines no __init__:
    kernels swaps in its forward and keeps the module's own weight and epsilon."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        CALLS[0] += 1
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)
'''

# %%
import json
import sys
import tempfile
from pathlib import Path

kernel_dir = Path(tempfile.mkdtemp(prefix="nvkit-tutorial-")) / "my-rmsnorm"
variant = kernel_dir / "build" / "torch-universal"
(variant / "my_rmsnorm").mkdir(parents=True)
(variant / "my_rmsnorm" / "__init__.py").write_text("from . import layers\n")
(variant / "my_rmsnorm" / "layers.py").write_text(LAYERS_PY)
(variant / "metadata.json").write_text(json.dumps(
    {"id": "_my_rmsnorm_tutorial", "name": "my-rmsnorm", "version": 1, "license": "Apache-2.0",
     "python-depends": [], "backend": {"type": DEVICE}}))
print(*sorted(str(p.relative_to(kernel_dir)) for p in kernel_dir.rglob("*") if p.is_file()), sep="\n")

# %%
from nvkit.model.kernels import local_kernel_config, replaced_modules

s = nvkit.load(MODEL, use_kernels=True, kernel_config=local_kernel_config(kernel_dir, device=DEVICE))
print(s.info["kernels"])
calls = sys.modules["_my_rmsnorm_tutorial.layers"].CALLS
before = calls[0]
with torch.no_grad():
    out = s.model(ids).logits.float()
print(f"the kernel ran {calls[0] - before} times in one forward pass")
assert s.info["kernels"]["replaced"].get("RMSNorm", 0) > 0 and calls[0] > before
torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)  # same maths, same logits

# %% [markdown]
# ## Training and inference modes
#
# `model.train()` switches every kernelized layer to the kernel's training variant (one with a
# backward) and `model.eval()` back; nvkit's fine-tunes (tutorial 07) rely on it.

# %%
s.model.train()
print("training mode:", replaced_modules(s.model))
loss = s.model(ids, labels=ids).loss
loss.backward()
print(f"loss {loss.item():.3f}, gradients through the kernel: "
      f"{sum(p.grad is not None for p in s.model.parameters())} tensors")
s.model.eval()
s.model.zero_grad(set_to_none=True)
print("inference mode:", replaced_modules(s.model))
assert replaced_modules(s.model).get("RMSNorm", 0) > 0
text = s.generate("NVIDIA GPUs are", max_new_tokens=12)
assert text
s.unload();

# %% [markdown]
# Kernels can also be added to a model already loaded: `s.enable_kernels(kernel_config)` (checked
# first; on error the model stays as it was).
#
# Next: **06-quantization**.
