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
# # Training: the fine-tune loop, Trainer, precision, LoRA and QLoRA
#
# `TrainingArguments` finds the NVIDIA GPU by itself, so `Trainer` needs no device setting. Use
# bf16 mixed precision on Ampere or newer and fp16 on older GPUs. nvkit's fine-tunes are
# transformers' `Trainer` plus PEFT LoRA, run in a worker thread with the loss and memory drawn
# live. This tutorial walks the loop a fine-tune really is: look at the data, train a short run,
# watch the held-out loss, compare with the base model, stop and resume, and export the result.

# %%
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")

STEPS = int(os.environ.get("NVKIT_STEPS", "4"))  # training steps per run; a few show the loop

# %% [markdown]
# ## LoRA with the fine-tune panel
#
# Data (examples inline or a `.jsonl`/`.json`/`.csv`/`.txt` file), LoRA and training settings, an
# estimate of the peak memory, Start and Stop, then loss and memory on one time axis. Start
# returns at once; `await` the run (or `run.result()`) to wait for it. The panel's examples are
# nvkit's demo lesson (`nvkit.demo.lesson`): questions the demo model already answers, each answer
# ending with one more sentence, which a short run teaches (below, on questions it never saw).

# %%
import nvkit

s = nvkit.load(MODEL)
panel = nvkit.FinetunePanel()
panel.steps.value = STEPS
panel.batch.value = 4
panel.seq_len.value = 64
panel

# %%
run = panel.start()  # the Start button
await run
print(run)
print(panel.code())

# %%
import math

import pandas as pd

history = pd.DataFrame(run.history)
history["memory_MiB"] = history["memory"] / 2**20  # GPU allocated on CUDA, process RSS on the CPU
print(history[["step", "loss", "tokens_per_s", "memory_MiB"]].round(3).to_string(index=False))
print(run.summary())
assert run.error is None and run.step == STEPS
assert all(math.isfinite(x) for x in history["loss"])
assert os.path.isdir(run.adapter_dir)

# %% [markdown]
# What nvkit changes from PEFT + `Trainer` as documented: the loss runs the LM head chunk by chunk
# (the full logits, most of a small model's peak, never exist), and on a GPU each decoder layer is
# compiled under an activation-memory budget, so the compiler keeps half of what the backward
# needs and recomputes the cheapest rest. Measured on an H200 (Qwen3-0.6B shape, LoRA r=16,
# 8 × 512): 27.8 k tokens/s at 4.8 GiB peak against 16.9 k at 17.0 GiB; `nvkit bench --lora`
# measures it on your GPU. The run predicted its own peak before it started, for the batches its
# rows make: `run.estimate`, the number the panel showed (`nvkit.train.finetune.run_estimate` gives
# it for any data and settings), and the prediction stands beside the measurement. On a GPU that is
# the device's memory, CUDA context included; on the CPU it is the process memory the run adds (its
# tensors, what the C allocator keeps between steps, the model), measured from where training
# starts, since the whole process also holds Python, torch and every import.

# %%
from nvkit.memory import comparisons
from nvkit.units import fmt_bytes

train = [c for c in comparisons(frame=False) if c.what == "train"][-1]
print(run.estimate)
print(train)
print({k: run.info.get(k) for k in ("compile", "activation_budget", "loss")})
assert train.estimate is run.estimate and "fused loss" in train.estimate.formulas["logits"]
assert f"<b>{fmt_bytes(run.estimate.total)}</b>" in panel.estimate.value  # the panel's number is the run's

# %% [markdown]
# After the run the session generates with the adapter attached. `s.merge_adapter()` folds it into
# the weights; `s.unload_adapter()` removes it; `s.load_adapter(dir)` brings a saved one back.

# %%
print(s.info["adapters"])
text = s.generate("What does nvkit do?", chat=True, max_new_tokens=24)
print(text)
assert s.info["adapters"] and isinstance(text, str)
s.unload_adapter()
assert not s.info["adapters"]

# %% [markdown]
# ## See the data first
#
# The lesson: questions about GPUs and nvkit that the demo model already answers, each answer
# followed by the same sentence. It teaches a habit rather than facts, so what the run learned
# shows on questions that are not in the data: `lesson.HELD_OUT` keeps some aside for that.
#
# `nvkit.train.data.preview` shows each example as the model will see it: the chat template
# applied, its token count, whether it is longer than `seq_len`, and the tokens that carry the loss
# (between ⟦ ⟧; highlighted in the HTML view). The totals say how many sequences a run packs and
# how many steps one epoch takes, before any time is spent training.

# %%
from nvkit.demo import lesson
from nvkit.train.data import preview

data = lesson.TRAIN
print(len(data), "examples; each answer ends with", repr(lesson.SIGN_OFF))
print(len(lesson.HELD_OUT), "held out:", [row["prompt"] for row in lesson.HELD_OUT])
p = preview(data, s.tokenizer, seq_len=64, n=2, batch_size=4)
print(p)
assert p.totals["rows"] == len(data) and p.totals["too_long"] == 0 and "⟦" in p.rows[0].marked

# %% [markdown]
# ## A short run, evaluated
#
# `eval_data=lesson.HELD_OUT` evaluates on the questions kept out of training (`eval_split=0.2`
# would hold out a fifth of `data` instead): their loss and perplexity are measured before the
# first step, every `eval_every` steps and at the end, with the same fused loss as training (no
# full logits). `lesson.STEPS` steps at `lesson.LEARNING_RATE` are what the demo model needs to
# learn the habit (CPU seconds). `run.info["compile_reason"]` says whether the decoder layers were
# compiled: on a GPU only runs long enough to pay the compile time back are (or shorter ones once
# the compile cache is warm); short runs start at once.

# %%
run = nvkit.finetune(s, data, max_steps=lesson.STEPS, eval_data=lesson.HELD_OUT, eval_every=10, batch_size=8,
                     seq_len=64, learning_rate=lesson.LEARNING_RATE)
await run
print(run)
print("compile:", run.info["compile_reason"])

# %% [markdown]
# The training loss (one row per step) and the held-out loss (one row per evaluation) on one step
# axis; `run.summary()` holds the evaluation before and after. A training loss that falls while
# the held-out loss rises is the run learning its examples by heart: `patience=N` (with
# `eval_every`) ends a run after N evaluations without improvement, `stop_at_loss=` once the
# held-out loss reaches a target.

# %%
steps = pd.DataFrame(run.history)[["step", "loss"]]
evals = pd.DataFrame(run.eval_history)[["step", "eval_loss", "eval_perplexity"]]
print(steps.merge(evals, on="step", how="outer").sort_values("step").round(4).to_string(index=False))
sm = run.summary()
print({k: round(v, 4) for k, v in sm.items() if k.startswith("eval_")})
assert [e["step"] for e in run.eval_history][0] == 0 and run.eval_history[-1]["step"] == lesson.STEPS
assert math.isfinite(sm["eval_loss_before"]) and sm["eval_loss_after"] < sm["eval_loss_before"]

# %% [markdown]
# ## Did it change the answers?
#
# `s.compare(prompts)` answers each prompt twice with the one loaded model: with the adapter
# switched off (that is the base model) and on, same seed and settings (here the chat template,
# as in training), side by side with the speed of each side. The questions are the held-out ones:
# the base model answers and stops; the tuned one gives its answer and then the sentence the
# lesson taught, on questions it never trained on.

# %%
questions = list(lesson.HELD_OUT_QUESTIONS[:3])
comparison = s.compare(questions, max_new_tokens=40, chat=True)
display(comparison)
signed = [r.tuned.rstrip().endswith(lesson.SIGN_OFF) for r in comparison]
print("tuned answers that end with the lesson's sentence:", sum(signed), "of", len(signed))
assert len(comparison) == 3 and all(r.base_tokens_per_s > 0 for r in comparison)
if MODEL == "demo":  # what the lesson was made for; another model may need more steps
    assert any(signed) and not any(lesson.SIGN_OFF in r.base for r in comparison)

# %% [markdown]
# ## Stop, then go on
#
# Stop (the panel's button, `run.stop()` or the notebook's Interrupt) ends a run after the current
# step and writes a resumable checkpoint beside the adapter: the optimizer, the learning-rate
# schedule, the random state and the position in the data. `resume=True` continues the latest one
# (`max_steps` is the total), so stopping costs nothing. Here the run stops itself after two steps.

# %%
import tempfile

out = tempfile.mkdtemp(prefix="nvkit-resume-")
run = nvkit.finetune(s, data, max_steps=2 * STEPS, batch_size=4, seq_len=64, output_dir=out)
run.subscribe(lambda record: record["step"] >= 2 and run.stop())
await run
print(run.summary()["stop_reason"], "· checkpoint:", os.path.basename(run.checkpoint))
run = nvkit.finetune(s, data, max_steps=2 * STEPS, batch_size=4, seq_len=64, output_dir=out, resume=True)
await run
print("resumed from", os.path.basename(run.info["resumed_from"]), "· steps", [r["step"] for r in run.history])
assert run.history[0]["step"] == 4 and run.step == 2 * STEPS

# %% [markdown]
# ## Take it elsewhere
#
# `s.export(folder)` writes a standalone checkpoint with the adapter merged into the weights
# (safetensors, tokenizer, generation config and a README model card that says what the model was
# trained on); plain `transformers` loads it, and so do vLLM, TGI and llama.cpp's converter.
# `merge=False` writes the adapter with the same card. nvkit never writes into a folder that holds
# files it did not write.

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # the weight-loading bar would only fill this page
folder = s.export(os.path.join(tempfile.mkdtemp(), "tuned"))
print(sorted(os.listdir(folder)))
print(open(os.path.join(folder, "README.md")).read()[:600])
model = AutoModelForCausalLM.from_pretrained(folder, dtype=s.model.dtype, device_map=str(s.device))
tok = AutoTokenizer.from_pretrained(folder)
question = lesson.HELD_OUT_QUESTIONS[0]
prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
enc = tok(prompt, return_tensors="pt").to(s.device)
ids = model.generate(**enc, max_new_tokens=32, do_sample=False, pad_token_id=tok.pad_token_id)
reloaded = tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
in_session = s.generate(question, chat=True, max_new_tokens=32)
print("reloaded:  ", reloaded, "\nin session:", in_session)
del model
s.unload_adapter();

# %% [markdown]
# ## Precision
#
# `TrainingArguments` finds the device by itself; the precision is a choice: bf16 from compute
# capability 8.0 (Ampere), fp16 before, fp32 on the CPU. `nvkit.model.precision.precision` makes it for
# nvkit's runs, and plain transformers takes it like this:

# %%
import tempfile

import torch
from nvkit.model.precision import precision
from transformers import TrainingArguments

device_type = "cuda" if torch.cuda.is_available() else "cpu"
capability = torch.cuda.get_device_capability(0) if device_type == "cuda" else None
prec = precision(device_type, capability)  # bf16 from capability 8.0, fp16 before, fp32 on the CPU
args = TrainingArguments(output_dir=tempfile.mkdtemp(), bf16=prec == "bf16", fp16=prec == "fp16",
                         report_to=[])
print("precision:", prec, "· TrainingArguments.device:", args.device)
assert args.device.type == device_type and prec == run.info["precision"]

# %% [markdown]
# `torch.cuda.is_bf16_supported()` can say True on GPUs older than Ampere (it emulates), so nvkit
# checks the compute capability itself. On the CPU `bf16=True` raises: training stays in fp32.

# %% [markdown]
# ## QLoRA: LoRA on a 4-bit model
#
# For a model that does not fit in 16-bit, load it in 4-bit (nf4) and train LoRA adapters on top;
# `nvkit.finetune` notices the quantized model and prepares it for k-bit training.

# %%
s = nvkit.load(MODEL, quantization="nf4")
data = [
    {"prompt": "Which GPUs support bf16?", "response": "Ampere and newer, compute capability 8.0 and up."},
    {"prompt": "What does QLoRA train?", "response": "LoRA adapters on top of a 4-bit model."},
    {"prompt": "How does PyTorch reach an NVIDIA GPU?", "response": "Through CUDA, as the device 'cuda'."},
]
run = nvkit.finetune(s, data, max_steps=STEPS, batch_size=2, seq_len=64)
await run
print(run)
print({k: run.info[k] for k in ("precision", "qlora", "loss")})
assert run.error is None and run.info["qlora"] and run.history

# %% [markdown]
# ## From a cell
#
# `%%nvkit finetune` takes one example per line (plain text, or JSON like below; one kind per run)
# and trains the loaded model, printing the loss as it goes. Here it trains a fresh adapter on the
# 4-bit model, after the one above is removed.

# %%
# %load_ext nvkit
s.unload_adapter();

# %%
# %%nvkit finetune --steps 2 --batch-size 2 --seq-len 64
{"prompt": "What is a CUDA graph?", "response": "A recorded sequence of GPU work replayed with one launch."}
{"prompt": "What is NCCL?", "response": "NVIDIA's library for collective communication between GPUs."}

# %%
assert nvkit.session().info["adapters"]  # the magic's run attached its adapter
s.unload();

# %% [markdown]
# Next: **08-distributed-training**.
