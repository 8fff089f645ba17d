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
# # Inference: load, generate, chat, batch
#
# `device_map="cuda"` puts the whole model on one GPU; `device_map="auto"` spreads a model that
# does not fit one GPU over the visible ones (and the CPU if need be). nvkit's default is `cuda`
# when a GPU is usable, else the CPU.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

DEVICE_MAP = os.environ.get("NVKIT_DEVICE_MAP") or None  # None: cuda when a GPU is usable, else cpu

# %%
import nvkit
import torch

HAS_CUDA = torch.cuda.is_available()
s = nvkit.load(MODEL, device_map=DEVICE_MAP)
print(s.summary())
print("placement:", s.info["placement"])

# %% [markdown]
# ## The guide's code, on the loaded model
#
# `s.model` and `s.tokenizer` are the plain transformers objects, so the guide's generate call
# works on them unchanged:

# %%
prompt = "NVIDIA GPUs are"
inputs = s.tokenizer(prompt, return_tensors="pt").to(s.model.device)
output = s.model.generate(**inputs, max_new_tokens=30, do_sample=False)
plain = s.tokenizer.decode(output[0], skip_special_tokens=True)
print(plain)
assert plain.startswith(prompt) and len(plain) > len(prompt)

# %% [markdown]
# ## `s.generate`
#
# The same in one call, in a worker thread (Interrupt stops it cleanly), with statistics.
# `stream=` receives the text as it comes.

# %%
text = s.generate(prompt, max_new_tokens=30, stream=lambda piece: print(piece, end="", flush=True))
print()
print(s.last_stats)
assert isinstance(text, str) and text
if not HAS_CUDA:  # on the CPU both run transformers' generate: same greedy tokens
    assert prompt + text == plain

# %% [markdown]
# `await s.agenerate(...)` does the same while the notebook keeps serving widget clicks (a Stop
# button, for instance):

# %%
text = await s.agenerate("A GPU is", max_new_tokens=20)
print("A GPU is" + text)
assert text

# %% [markdown]
# ## Chat
#
# `chat=True` wraps the prompt with the tokenizer's chat template; `system=` and `history=` give
# the rest of the conversation.

# %%
reply = s.generate("What does CUDA_VISIBLE_DEVICES do?", chat=True, system="You answer briefly.",
                   max_new_tokens=40)
print(reply)
history = [{"role": "user", "content": "What does CUDA_VISIBLE_DEVICES do?"},
           {"role": "assistant", "content": reply}]
follow_up = s.generate("And CUDA_DEVICE_ORDER?", chat=True, history=history, max_new_tokens=40)
print(follow_up)
assert isinstance(reply, str) and isinstance(follow_up, str)

# %% [markdown]
# ## Batches
#
# A list of prompts gives a list of answers in the same order. On a GPU nvkit runs them all at once
# on its batched fast path: one decode step for many prompts, each at its own position, a KV cache
# sized to the prompts, and a finished prompt's place taken by the next one, so short answers do not
# wait for long ones (`s.last_stats` says how it ran; where it cannot run, transformers' continuous
# batching does). `seed=` makes a sampled list repeatable, each prompt drawing from its own seed.
# On the CPU the list runs as one padded batch.

# %%
prompts = ["NVIDIA GPUs are", "Attention kernels", "Quantization saves"]
outs = s.generate(prompts, max_new_tokens=20)
for p, o in zip(prompts, outs):
    print(f"{p!r} -> {o!r}")
print(s.last_stats)
assert isinstance(outs, list) and len(outs) == len(prompts)

# %% [markdown]
# A prompt's greedy text inside a list can differ from its text alone: the GPU's matrix products
# and attention pick their kernels and the order of their sums by the number of rows, and a near tie
# between two tokens then goes the other way. `deterministic=True` gives every prompt the text it
# gets alone, in a list of any size (batch-invariant kernels on the GPU, at a cost in list
# throughput; on the CPU each prompt runs alone).

# %%
alone = s.generate(prompts[1], max_new_tokens=20, deterministic=True)
together = s.generate(prompts, max_new_tokens=20, deterministic=True)
print(s.last_stats)
assert together[1] == alone

# %% [markdown]
# ## From a cell: `%nvkit generate`
#
# `-n` sets the number of new tokens; `%%nvkit generate --batch` takes one prompt per line.

# %%
# %load_ext nvkit
# %nvkit generate -n 20 "Tensor cores"

# %%
# %%nvkit generate --batch -n 12
NVIDIA GPUs are
The KV cache

# %% [markdown]
# ## The Generate panel
#
# Prompt, chat mode, greedy or sampled decoding, Generate and Stop, the streamed output and the
# statistics. Here it is filled in and started from code, as a click would.

# %%
gen = nvkit.GeneratePanel()
gen.prompt.value = "NVIDIA GPUs are"
gen.max_new_tokens.value = 24
gen

# %%
await gen.start()  # Generate; gen.stop() is the Stop button
print(gen.code())
print(gen.stats.value)
assert gen.text and gen.last_error is None

# %% [markdown]
# ## The fast path (GPU)
#
# For one prompt on a CUDA GPU nvkit decodes with a static KV cache and replays a CUDA graph that
# holds several decode steps, so the GPU is not kept waiting by Python between tokens. It is used
# automatically when it applies (`fast=None`); `fast=True` insists and says why when it can't.
# The first capture takes a few seconds: the decode step runs uncompiled, with nvkit's Triton
# kernels for its norms and activation. Once the session has decoded 30 s on it, the next long
# request compiles the step with `torch.compile` (tens of seconds the first time, less when
# nvkit's on-disk compile cache already holds it, e.g. after a kernel restart), which decodes a
# fifth or so faster; `nvkit.generate.fast.prepare(s)` (a warm-up cell, as below) compiles it at
# once. One KV cache of 4096 tokens (doubled only when a request needs more) serves every request
# that fits it: any prompt length, any number of new tokens; another sampling mode adds a quick
# graph capture. Until the first capture, a short request (under 128 new tokens) takes whichever
# way is expected to answer it sooner, plain `generate` or the capture first (each way's time as
# measured on this machine), and the stats line says which and why; `fast=True` or a longer request
# captures it, and from then on every request takes the fast path. While it captures or compiles,
# `on_progress` (the Generate panel's status line, `%nvkit generate`) shows "preparing fast
# decode… N s".
#
# Not every model family runs the same way: Llama, Mistral, Qwen2, Qwen3, SmolLM3, Granite, OLMo 2,
# Gemma 1/2/3 and Phi-3/4-mini get nvkit's fused step, other families (GPT-2, Starcoder2, the
# mixtures of experts, ...) their own forward, captured the same way, and the stats line names
# which. To see every family side by side on your GPU, with its rate against plain `generate` and
# its share of the memory-bandwidth limit, run in a terminal (minutes):
#
#     nvkit bench --families

# %%
if not HAS_CUDA:
    print("Skipped: the fast path replays CUDA graphs and needs a CUDA GPU (this machine has none).")
else:
    slow = s.generate(prompt, max_new_tokens=64, fast=False)
    slow_stats = s.last_stats
    from nvkit.generate.fast import prepare
    print(f"fast path ready in {prepare(s):.1f} s")  # compiled now, once for the session
    fast = s.generate(prompt, max_new_tokens=64)  # short, and on the fast path: it is compiled now
    print("plain:", slow_stats)
    print("fast: ", s.last_stats)
    assert s.last_stats.path != slow_stats.path and fast

# %% [markdown]
# ## Spreading a model over GPUs: `device_map="auto"`
#
# With several GPUs, accelerate places whole layers on each in turn (`max_memory=` caps each one).

# %%
if not HAS_CUDA:
    print("Skipped: device_map='auto' spreads a model over CUDA GPUs (this machine has none).")
else:
    n = torch.cuda.device_count()
    limits = None if n < 2 else {i: f"{max(1, torch.cuda.get_device_properties(i).total_memory // 2**30 // 4)}GiB"
                                for i in range(n)}
    s = nvkit.load(MODEL, device_map="auto", max_memory=limits)
    print(s.summary())
    for dev, modules in s.info["placement"].items():
        print(f"{dev}: {len(modules)} module(s)")
    if n < 2:
        print("One GPU visible: everything lands on cuda:0.")
    assert s.generate(prompt, max_new_tokens=8)

# %%
print(f"{s.unload() / 2**20:.1f} MiB freed")

# %% [markdown]
# Next: **05-hub-kernels**.
