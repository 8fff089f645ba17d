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
# # Distributed training: DDP, FSDP2, DeepSpeed ZeRO and tensor parallelism
#
# A notebook kernel is one process, and multi-GPU training wants one process per GPU talking over
# NCCL. `torchrun --nproc_per_node=4 ...` or `accelerate launch ...` starts them. Which strategy:
#
# - **DDP**: every GPU holds a whole copy of the model and trains on its own share of the
#   batches; the gradients are averaged. Simple and fast when the model fits one GPU.
# - **FSDP2**: parameters, gradients and optimizer state are sharded across the GPUs and each
#   layer is gathered just before it runs: for models that don't fit one GPU.
# - **DeepSpeed ZeRO-2 / ZeRO-3**: ZeRO-2 shards gradients and optimizer state, ZeRO-3 the
#   parameters too (like FSDP); either can move state to CPU memory (offload).
# - **Tensor parallelism**: every weight matrix is cut across the GPUs; all of them work on the
#   same batch, layer by layer. For layers too big for one GPU, and for generation.
#
# `nvkit.launch` writes a run folder and starts nvkit's training program (`nvkit.train.worker`, a
# module of nvkit, so no script is generated) with torchrun or accelerate on the selected GPUs,
# streaming every rank's metrics back into the notebook. The run folder holds `launch.sh` (the
# line), `config.json` (the settings), `data.jsonl` (the examples, already tokenized here) and
# `logs/` (one log per rank): copy it to a cluster and run the same line. On the CPU the same
# program runs over gloo instead of NCCL.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

NPROC = int(os.environ.get("NVKIT_NPROC", "0"))  # processes; 0: one per visible GPU (2 on the CPU)
STEPS = int(os.environ.get("NVKIT_STEPS", "3"))  # steps of the first run; the comparison runs at least 10

# %%
import nvkit
import torch

n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
nproc = NPROC or n_gpus or 2
print(f"{n_gpus} CUDA GPU(s) visible; running {nproc} process(es)")
s = nvkit.load(MODEL)  # a launched run trains this model, with its attention backend, dtype and kernels
print(s)

# %% [markdown]
# ## The Launch panel
#
# The GPUs come from the GPUs tab (`nvkit.select_gpus`). Each strategy says what it does and
# needs, and the table puts every strategy's per-GPU memory estimate side by side (which fit the
# chosen GPUs, and which cannot run here and why). Below it is the exact line Start will run;
# switch the launcher to see the `accelerate launch` form. After the run, each rank's measured
# peak stands beside the estimate. It is also a tab of `nvkit.panel()`, and the Fine-tune panel's
# "run on" choice opens it with that panel's data and settings.

# %%
panel = nvkit.LaunchPanel()
panel.nproc.value = nproc
panel.steps.value = STEPS
panel.batch.value = 2
panel.seq_len.value = 64
panel

# %%
run = panel.start()  # the Start button (Stop ends every rank after the same step, adapter saved)
print(run.command)
await run
print(run)
print(sorted(os.listdir(run.run_dir)))
assert run.returncode == 0 and run.ranks == list(range(nproc))
assert os.path.isdir(run.adapter_dir)

# %%
import pandas as pd

logs = pd.DataFrame([r for r in run.history if r.get("event") == "log"])
print(logs[["step", "rank", "loss", "grad_norm", "learning_rate"]].sort_values(["step", "rank"]).to_string(index=False))
print(run.summary())

# %% [markdown]
# ## Per-GPU memory, strategy by strategy
#
# `nvkit.estimate` for one LoRA step, split the way each strategy splits the model: DDP keeps
# everything on every GPU, FSDP2 and ZeRO-3 divide the weights and the adapter state and hold a
# layer or two whole while they run, ZeRO-2 divides only gradients and optimizer state, tensor
# parallelism gives each GPU its slice of every layer (and activations shrink with it).

# %%
from nvkit.train import strategies
from nvkit.units import fmt_bytes

print(strategies.advice(panel.rows, panel.gpu_memory))
pd.DataFrame([{"strategy": r["title"],
               "per-GPU estimate": fmt_bytes(r["estimate"].total) if r["estimate"] else "-",
               "fits": r["fits"], "note": r["why_not"] or r["missing"] or ""} for r in panel.rows])

# %% [markdown]
# ## DDP vs FSDP2 vs ZeRO-3 vs tensor parallel, on the same data
#
# The same panel, one strategy after the other: steps per second, the peak memory of the busiest
# GPU beside its estimate, and the final loss. Sharding needs at least two GPUs to mean anything.

# %%
if n_gpus < 2:
    print(f"Skipped: the comparison shards the model across GPUs and needs at least 2 CUDA GPUs "
          f"(this machine has {n_gpus}).")
else:
    panel.steps.value = max(STEPS, 10)
    panel.batch.value = 8
    panel.seq_len.value = 128
    table = []
    for name in ("ddp", "fsdp", "zero3", "tp"):
        panel.strategy.value = name
        row = next(r for r in panel.rows if r["strategy"] == name)
        if row["estimate"] is None:
            print(f"{row['title']}: not run: {row['why_not'] or row['missing']}")
            continue
        run = panel.start()
        if run is None:
            print(f"{row['title']}: not run: {panel.status.value}")
            continue
        await run
        sm = run.summary()
        table.append({"strategy": row["title"], "steps/s": round(sm["steps_per_s"] or 0.0, 2),
                      "PyTorch peak per GPU (max)": fmt_bytes(max(sm["peak_memory"].values())),
                      "estimate (without the CUDA context)":
                          fmt_bytes(row["estimate"].total - row["estimate"].parts.get("CUDA context", 0)),
                      "final loss": round(sm["final_loss"], 4), "adapter": bool(sm["adapter_dir"])})
        assert run.returncode == 0 and sm["steps"] == panel.steps.value
    print(pd.DataFrame(table).to_string(index=False))

# %% [markdown]
# ## Tensor-parallel generation
#
# `nvkit.launch_generate` cuts the model across the processes (transformers' plan for it) and
# returns the texts; with greedy decoding they are the ones a single process writes. It runs on
# the CPU as well.

# %%
prompts = ["NVIDIA GPUs are", "The H200 has"]
# one process per GPU: with fewer than two GPUs the two processes run on the CPU (gloo)
where = {} if n_gpus >= 2 else {"gpus": []}
gen = nvkit.launch_generate(prompts, nproc_per_node=2, max_new_tokens=12, **where)
await gen
for p, t in zip(prompts, gen.texts):
    print(f"{p!r} → {t!r}")
single = [s.generate(p, max_new_tokens=12) for p in prompts]
print("same as one process:", [a.strip() for a in gen.texts] == [b.strip() for b in single])
assert len(gen.texts) == len(prompts)

# %% [markdown]
# ## accelerate, and several machines
#
# `launcher="accelerate"` runs `accelerate launch` with a config file nvkit writes into the run
# folder (the strategy is still nvkit's, set through Trainer's arguments, so the metrics are the
# same). Several machines: run the same line on every node with the node count, each node's rank
# and a rendezvous address (node 0's). `start=False` writes the run and gives the line without
# starting anything; use the same run directory name on every node: it is the rendezvous id. The
# line pins the GPUs chosen here, one process each: `nproc_per_node` is that count (nvkit refuses a
# line that starts more processes than it makes GPUs visible).

# %%
import tempfile

config = {"data": [{"prompt": "What does DDP replicate?", "response": "The whole model."}] * 8,
          "max_steps": STEPS, "batch_size": 2, "seq_len": 64}
plan = nvkit.launch(config, nproc_per_node=1, launcher="accelerate", run_dir=tempfile.mkdtemp(prefix="nvkit-acc-"),
                    start=False)
print(plan.command)
print(open(os.path.join(plan.run_dir, "accelerate.yaml")).read())

multinode_dir = os.path.join(tempfile.mkdtemp(), "nvkit-multinode")
per_node = len(nvkit.selection().devices) or 4  # the GPUs chosen here (no GPU here: a 4-GPU node's line)
for node in (0, 1):
    plan = nvkit.launch(config, nproc_per_node=per_node, nnodes=2, node_rank=node, rdzv_endpoint="10.0.0.1:29500",
                        run_dir=multinode_dir, start=False)
    print(f"node {node}:", plan.command)
    assert f"--node_rank={node}" in plan.command and "--nnodes=2" in plan.command
    assert f"--nproc_per_node={per_node}" in plan.command
    assert "--rdzv_id=nvkit-multinode" in plan.command

# %% [markdown]
# Next: **09-gpu-memory**.
