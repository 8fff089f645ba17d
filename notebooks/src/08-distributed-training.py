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
# # Distributed training: torchrun, DDP and FSDP2
#
# A notebook kernel is one process, and multi-GPU training wants one process per GPU talking over
# NCCL. `torchrun --nproc_per_node=4 train.py` (or `accelerate launch`) starts them. Which
# strategy:
#
# - **DDP**: every GPU holds a full copy of the model and sees different batches; gradients are
#   averaged. Simple and fast when the model and its optimizer state fit one GPU.
# - **FSDP2**: parameters, gradients and optimizer state are sharded across GPUs and gathered
#   layer by layer: for models that don't fit one GPU.
# - DeepSpeed ZeRO and tensor parallelism are the other options the guide names.
#
# `nvkit.launch` writes a plain transformers + PEFT training script for your settings and runs it
# with torchrun on the selected GPUs, streaming every rank's metrics back into the notebook. On
# the CPU it runs the same DDP script over gloo instead of NCCL.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

NPROC = int(os.environ.get("NVKIT_NPROC", "0"))  # processes; 0: one per visible GPU (2 on the CPU)
STEPS = int(os.environ.get("NVKIT_STEPS", "3"))

# %%
import tempfile

import nvkit
import torch

n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
nproc = NPROC or n_gpus or 2
print(f"{n_gpus} CUDA GPU(s) visible; running {nproc} process(es)")
print(nvkit.launch_command("train.py", nproc_per_node=nproc))

# %% [markdown]
# ## `nvkit.launch`: a DDP run
#
# The settings are `nvkit.finetune`'s. The data is checked and tokenized here in the notebook, so
# a bad example fails in a second rather than on every rank. The run directory holds the script,
# its `config.json`, the data and per-rank logs: copy it to a cluster and run the same line.

# %%
data = [
    {"prompt": "What does DDP replicate?", "response": "The whole model, on every GPU."},
    {"prompt": "What does FSDP shard?", "response": "Parameters, gradients and optimizer state."},
    {"prompt": "Which backend do GPUs use?", "response": "NCCL."},
    {"prompt": "Which backend does the CPU use?", "response": "gloo."},
]
config = {"model": MODEL, "data": data, "max_steps": STEPS, "batch_size": 2, "seq_len": 64}
run = nvkit.launch(config, nproc_per_node=nproc, strategy="ddp", run_dir=tempfile.mkdtemp(prefix="nvkit-ddp-"))
print(run.command)
await run
print(run)

# %%
import pandas as pd

logs = pd.DataFrame([r for r in run.history if r.get("event") == "log"])
print(logs[[c for c in ("step", "rank", "loss", "grad_norm", "learning_rate") if c in logs]]
      .sort_values(["step", "rank"]).to_string(index=False))
assert run.returncode == 0 and run.ranks == list(range(nproc))
assert os.path.isdir(run.adapter_dir)
print(sorted(os.listdir(run.run_dir)))

# %% [markdown]
# ## FSDP2
#
# Sharding only pays off across GPUs, so FSDP needs CUDA (NCCL). With one GPU it runs, but there
# is nothing to shard across.

# %%
if n_gpus < 2:
    print(f"Skipped: FSDP2 shards the model across GPUs and needs at least 2 CUDA GPUs (this machine has {n_gpus}).")
else:
    run = nvkit.launch(config, nproc_per_node=n_gpus, strategy="fsdp", run_dir=tempfile.mkdtemp(prefix="nvkit-fsdp-"))
    print(run.command)
    await run
    print(run)
    assert run.returncode == 0 and run.ranks == list(range(n_gpus))

# %% [markdown]
# ## Several machines
#
# Run the same line on every node with the node count, each node's rank and a rendezvous address
# (node 0's). `start=False` writes the run and gives the line without starting anything. Use the
# same run directory name on every node: it is the rendezvous id.

# %%
multinode_dir = os.path.join(tempfile.mkdtemp(), "nvkit-multinode")
for node in (0, 1):
    plan = nvkit.launch(config, nproc_per_node=8, nnodes=2, node_rank=node, rdzv_endpoint="10.0.0.1:29500",
                        run_dir=multinode_dir, start=False)
    print(f"node {node}:", plan.command)
    assert f"--node_rank={node}" in plan.command and "--nnodes=2" in plan.command
    assert "--rdzv_id=nvkit-multinode" in plan.command

# %% [markdown]
# Next: **09-gpu-memory**.
