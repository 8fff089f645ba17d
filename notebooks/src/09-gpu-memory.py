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
# # GPU memory: where it goes
#
# What fills a GPU while a model runs:
#
# - **weights**: parameters × bytes per parameter (2 in bf16, about 0.5 in 4-bit);
# - **KV cache**: keys and values of every token so far, per layer; it grows with batch × context;
# - **activations**: the working set of a forward pass; training keeps them for the backward pass;
# - **gradients and optimizer state** when training (AdamW: two more numbers per trained weight);
# - **logits**: batch × vocabulary floats, large for 150k-token vocabularies;
# - the **CUDA context** and library workspaces (cuBLAS, NCCL): a few hundred MiB per GPU that
#   PyTorch does not count;
# - the **allocator's cache**: PyTorch keeps freed blocks *reserved* for reuse, so `nvidia-smi`
#   shows more than the live tensors.
#
# nvkit shows the driver's view (NVML: the whole device) beside PyTorch's (allocated / reserved),
# and every estimate beside the measurement it predicts.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

BATCH = int(os.environ.get("NVKIT_BATCH", "4"))  # prompts generated at once in the measured run
NEW_TOKENS = int(os.environ.get("NVKIT_NEW_TOKENS", "64"))

# %% [markdown]
# ## The live chart: `nvkit.monitor()`
#
# Per GPU: NVML used, torch reserved and allocated, the device total, the predicted peak, and the
# events (load, generate, unload, your marks) as points you can hover. Without a GPU it draws the
# process memory. It keeps drawing while later cells run work in the background or `await` it.

# %%
import nvkit
import torch
from nvkit.memory import comparisons, format_report, live_tensors

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
chart = nvkit.monitor()
chart

# %% [markdown]
# ## The report: `nvkit.memory_report()`
#
# One row per GPU (or the process, without GPUs). `rest` is NVML used minus torch reserved: the
# CUDA context, library workspaces and other processes. `%nvkit memory` prints the same as text.

# %%
nvkit.mark("before loading")
s = nvkit.load(MODEL)
print(s.summary())
report = nvkit.memory_report(unit="MiB")
report

# %%
print(format_report())
assert len(report) >= 1 and (report["used"] > 0).all()

# %% [markdown]
# ## Estimate, then measure
#
# `nvkit.estimate` predicts the peak from the config alone; nvkit also predicts every generation
# by itself and records the measured peak beside it (`comparisons()`). On a GPU the measurement is
# NVML's peak for the device; on the CPU it is the whole process (Python, PyTorch and all), so
# there the prediction is far below it.

# %%
prompt = "NVIDIA GPUs are"
prompt_len = len(s.tokenizer(prompt)["input_ids"])
est = nvkit.estimate(s, dtype=str(s.dtype).replace("torch.", ""), quantization=s.quantization,
                     seq_len=prompt_len + NEW_TOKENS, prompt_len=prompt_len, device=DEVICE)
print(est)

# %%
nvkit.mark("one prompt")
text = await s.agenerate(prompt, max_new_tokens=NEW_TOKENS, fast=False)
last = comparisons().iloc[-1]
print(f"predicted {last['predicted'] / 2**20:.1f} MiB, measured {last['measured'] / 2**20:.1f} MiB on {last['device']}")
assert text and last["what"] == "generate" and last["predicted"] > 0 and last["measured"] > 0
if DEVICE == "cuda":  # the estimate holds within a factor of two on a GPU
    assert 0.5 < last["predicted"] / last["measured"] < 2, last

# %% [markdown]
# A batch is a different story on a GPU: nvkit's batched fast path holds a paged KV cache sized to
# the batch (every prompt and its new tokens) and keeps it for the next list of about that size, so
# the memory stays held after the answers come back; transformers' continuous batching, where it
# runs instead, reserves a share of the free memory for its cache up front.

# %%
nvkit.mark(f"batch of {BATCH}")
outs = await s.agenerate([prompt] * BATCH, max_new_tokens=NEW_TOKENS)
assert len(outs) == BATCH
runs = comparisons()
last = runs.iloc[-1]
print(f"batch of {BATCH}: predicted {last['predicted'] / 2**20:.1f} MiB, measured {last['measured'] / 2**20:.1f} MiB"
      f" ({s.last_stats.path})")
runs

# %% [markdown]
# ## What holds memory now
#
# `live_tensors` lists the largest tensors still alive and the names in the notebook that hold
# them: the first thing to look at when memory does not come back.

# %%
for t in live_tensors(DEVICE, limit=5):
    print(t)

# %% [markdown]
# ## An out-of-memory post-mortem
#
# When a CUDA allocation fails, PyTorch says how much was asked and how much was free. nvkit's
# load, generate and fine-tune turn that into an `NvkitError` after releasing the failed step,
# with the largest live tensors, other processes on the GPU and what to try next; the session
# stays usable. Here an allocation larger than the free memory fails on purpose.

# %%
if DEVICE != "cuda":
    print("Skipped: a CUDA out-of-memory error needs a CUDA GPU (this machine has none).")
else:
    from nvkit.memory import oom_error

    free, total = torch.cuda.mem_get_info()
    torch.cuda.memory._record_memory_history(max_entries=10000)  # for the snapshot below
    try:
        too_big = torch.empty(free + 2**30, dtype=torch.uint8, device="cuda")
        raise AssertionError("the allocation should not fit")
    except torch.OutOfMemoryError as e:
        print("PyTorch:", str(e).splitlines()[0])
        print()
        print("nvkit:", oom_error(e, "generate", s))
    torch.cuda.memory._dump_snapshot("memory-snapshot.pickle")  # drag it onto https://pytorch.org/memory_viz
    torch.cuda.memory._record_memory_history(enabled=None)
    assert s.generate("NVIDIA GPUs are", max_new_tokens=8)  # still usable

# %% [markdown]
# ## Unloading gives it back
#
# `s.unload()` frees the model and checks that the memory really came back (a reference left in
# a variable, an exception's traceback or IPython's `Out` history would keep it).

# %%
nvkit.mark("unload")
freed = s.unload()
print(f"freed {freed / 2**20:.1f} MiB")
print(s.unload_report)
print(format_report())

# %% [markdown]
# That is the whole path of the guide. Back to **00-start-here** for the list of tutorials.
