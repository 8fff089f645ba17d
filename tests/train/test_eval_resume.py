"""Evaluation, stop rules, resumable checkpoints and resume of nvkit.finetune, on the CPU."""

from __future__ import annotations

import _thread
import json
import math
import os

import pytest
import torch

import nvkit
from nvkit.errors import NvkitError
from nvkit.model.saving import owned
from nvkit.train import data as D

QA = [{"prompt": f"Which GPU holds shard {i}?", "response": f"GPU {i % 4} holds shard {i}."} for i in range(16)]
FACT = "The H200 has 141 GB of fast memory."


def _adapter_tensors(folder):
    from safetensors.torch import load_file
    return load_file(os.path.join(folder, "adapter_model.safetensors"))


def test_eval_before_every_n_and_at_the_end_with_the_models_own_loss(s, tmp_path):
    # the held-out rows fit one batch, so the eval loss before the first step (adapter B = 0: the
    # base model) must equal transformers' own loss over the same batch, full logits and all
    held = QA[:3]
    rows, _ = D.prepare(held, s.tokenizer, 64, "auto")
    batch = D.Collator(s.tokenizer.pad_token_id)(rows)
    with torch.no_grad():
        want = float(s.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
    run = nvkit.finetune(s, QA[3:], eval_data=held, eval_every=2, max_steps=5, batch_size=4, seq_len=64,
                         learning_rate=1e-2, output_dir=str(tmp_path / "r"))
    run.result(timeout=600)
    ev = run.eval_history
    assert [e["step"] for e in ev] == [0, 2, 4, 5]
    assert ev[0]["eval_loss"] == pytest.approx(want, rel=1e-4)
    assert all(e["eval_perplexity"] == pytest.approx(math.exp(e["eval_loss"]), rel=1e-9) for e in ev)
    assert ev[-1]["eval_loss"] < ev[0]["eval_loss"]
    assert ev[0]["eval_tokens"] == sum(1 for r in rows for t in r.labels[1:] if t != D.IGNORE)
    sm = run.summary()
    assert sm["eval_loss_before"] == ev[0]["eval_loss"] and sm["eval_loss_after"] == ev[-1]["eval_loss"]
    assert sm["eval_perplexity_after"] < sm["eval_perplexity_before"]
    assert run.info["eval"]["from"] == "eval_data" and run.info["eval"]["examples"] == 3
    assert len(run.history) == 5 and run.stop_reason is None
    card = json.loads((tmp_path / "r" / "adapter" / "nvkit.json").read_text())
    assert card["eval_after"]["eval_loss"] == ev[-1]["eval_loss"]
    assert {e.kind for e in nvkit.events.events()} >= {"train-eval"}


def test_eval_split_holds_rows_out_of_training(s, tmp_path):
    seen = []
    run = nvkit.finetune(s, QA, eval_split=0.25, max_steps=2, batch_size=4, seq_len=64, output_dir=str(tmp_path / "r"))
    run.subscribe(seen.append, what="eval")
    run.result(timeout=600)
    assert run.info["data"]["examples"] == 12 and run.info["eval"]["examples"] == 4
    assert [e["step"] for e in run.eval_history] == [0, 2]
    again, held = D.split(list(range(16)), 0.25, 0)
    assert len(held) == 4 and sorted(again + held) == list(range(16))
    assert D.split(list(range(16)), 0.25, 0) == (again, held)  # the same seed holds out the same rows


def test_stop_rules(s, tmp_path):
    run = nvkit.finetune(s, QA, eval_split=0.25, eval_every=1, stop_at_loss=1e6, max_steps=6, batch_size=4,
                         seq_len=64, output_dir=str(tmp_path / "a"))
    run.result(timeout=600)
    assert run.step < 6 and "stop_at_loss" in run.stop_reason and not run.stopped
    s.unload_adapter()
    # an unreachable target never fires; a learning rate too small to move the loss runs out of patience
    run = nvkit.finetune(s, QA, eval_split=0.25, eval_every=1, patience=2, stop_at_loss=1e-9, max_steps=8,
                         batch_size=4, seq_len=64, learning_rate=1e-12, output_dir=str(tmp_path / "b"))
    run.result(timeout=600)
    assert run.step == 2 and "patience=2" in run.stop_reason
    assert [e["step"] for e in run.eval_history] == [0, 1, 2]


def test_ten_steps_equal_five_plus_resumed_five(s, tmp_path):
    """Optimizer moments, the learning-rate schedule, the random state (LoRA dropout), the data order
    and the step count all continue: the resumed half logs the same losses and learning rates as the
    straight run and ends on the same adapter."""
    kw = dict(max_steps=10, batch_size=4, seq_len=64, learning_rate=5e-3, seed=3)
    straight = nvkit.finetune(s, QA, save_every=5, output_dir=str(tmp_path / "a"), **kw)
    straight.result(timeout=600)
    ck = tmp_path / "a" / "checkpoint-5"
    assert owned(str(ck), "checkpoint") and {"optimizer.pt", "scheduler.pt", "rng_state.pth",
                                                "trainer_state.json"} <= set(os.listdir(ck))
    s.unload_adapter()
    resumed = nvkit.finetune(s, QA, resume=str(ck), output_dir=str(tmp_path / "b"), **kw)
    resumed.result(timeout=600)
    assert resumed.info["resumed_from"] == str(ck)
    assert [r["step"] for r in resumed.history] == [6, 7, 8, 9, 10]
    a = {r["step"]: r for r in straight.history}
    for r in resumed.history:
        assert r["learning_rate"] == pytest.approx(a[r["step"]]["learning_rate"], rel=1e-9)
        assert r["loss"] == pytest.approx(a[r["step"]]["loss"], rel=1e-3)
    wa, wb = _adapter_tensors(straight.adapter_dir), _adapter_tensors(resumed.adapter_dir)
    assert wa.keys() == wb.keys()
    moved = max(float((wa[k] - _adapter_tensors(str(ck))[k]).abs().max()) for k in wa)
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst <= 1e-3 * moved, (worst, moved)  # agreement far tighter than what steps 6-10 changed


def test_resume_refuses_other_data_or_settings(s, tmp_path):
    run = nvkit.finetune(s, QA, save_every=2, max_steps=2, batch_size=4, seq_len=64, output_dir=str(tmp_path / "a"))
    run.result(timeout=600)
    before = s.generate("GPU 3", max_new_tokens=4)
    with pytest.raises(NvkitError, match="data: checkpoint"):
        nvkit.finetune(s, QA[:8], resume=True, max_steps=4, batch_size=4, seq_len=64, output_dir=str(tmp_path / "a"))
    with pytest.raises(NvkitError, match="batch_size: checkpoint 4, now 2"):
        nvkit.finetune(s, QA, resume=run.checkpoint, max_steps=4, batch_size=2, seq_len=64)
    with pytest.raises(NvkitError, match="already at step 2"):
        nvkit.finetune(s, QA, resume=True, max_steps=2, batch_size=4, seq_len=64, output_dir=str(tmp_path / "a"))
    with pytest.raises(NvkitError, match="not a resumable checkpoint"):
        nvkit.finetune(s, QA, resume=run.adapter_dir, max_steps=4, batch_size=4, seq_len=64)
    with pytest.raises(NvkitError, match="no resumable checkpoint"):
        nvkit.finetune(s, QA, resume=True, max_steps=4, output_dir=str(tmp_path / "empty"))
    assert s.generate("GPU 3", max_new_tokens=4) == before


def test_stop_writes_a_checkpoint_that_resume_true_continues(s, tmp_path):
    kw = dict(max_steps=6, batch_size=4, seq_len=64, output_dir=str(tmp_path / "r"))
    run = nvkit.finetune(s, QA, **kw)
    run.subscribe(lambda rec: rec["step"] >= 2 and run.stop())
    run.result(timeout=600)
    assert run.stopped and run.stop_reason == "stopped by the user" and run.step == 3
    assert run.checkpoint == str(tmp_path / "r" / "checkpoint-3")
    assert run.summary()["checkpoint"] == run.checkpoint and os.path.isdir(run.adapter_dir)
    s.unload_adapter()
    more = nvkit.finetune(s, QA, resume=True, **kw)  # the latest checkpoint of output_dir
    more.result(timeout=600)
    assert [r["step"] for r in more.history] == [4, 5, 6] and more.progress["step"] == 6
    assert not [n for n in os.listdir(tmp_path / "r") if n.startswith(".")]


def test_interrupt_stops_with_a_resumable_checkpoint(s, tmp_path):
    run = nvkit.finetune(s, QA, max_steps=6, batch_size=4, seq_len=64, output_dir=str(tmp_path / "r"))
    run.subscribe(lambda rec: rec["step"] == 2 and _thread.interrupt_main())  # the notebook's Interrupt
    with pytest.raises(KeyboardInterrupt):
        run.result(timeout=600)
    assert run.done and run.stopped and run.step == 3
    assert run.checkpoint and os.path.isfile(os.path.join(run.checkpoint, "optimizer.pt"))
    s.unload_adapter()
    again = nvkit.finetune(s, QA, resume=True, max_steps=6, batch_size=4, seq_len=64)  # the session's last run
    again.result(timeout=600)
    assert again.info["resumed_from"] == run.checkpoint and again.history[0]["step"] == 4
