"""s.compare (base vs tuned from one loaded model) and s.export (merged checkpoint or adapter, with a
model card), on the CPU with the demo model."""

from __future__ import annotations

import json
import os

import pytest
import torch

import nvkit
from nvkit.errors import NvkitError

PROMPTS = ["The H200 has", "NVIDIA GPUs are"]
FACT = "The H200 has 141 GB of fast memory and it is the best GPU for training."


@pytest.fixture(scope="module")
def tuned(s, tmp_path_factory):
    """The base model's greedy answers, then a quick fine-tune that changes them."""
    base = [s.generate(p, max_new_tokens=8) for p in PROMPTS]
    run = nvkit.finetune(s, [FACT] * 16, max_steps=15, batch_size=8, seq_len=64, learning_rate=1e-2, packing=False,
                         eval_data=[FACT], output_dir=str(tmp_path_factory.mktemp("tuned") / "run"))
    run.result(timeout=600)
    tuned = [s.generate(p, max_new_tokens=8) for p in PROMPTS]
    assert tuned != base  # the adapter changed something, or the comparison below would prove nothing
    return base, tuned, run


@pytest.fixture(autouse=True)
def _no_adapter_left():
    yield  # this module keeps its trained adapter on the session (overrides the conftest's cleanup)


def test_compare_off_is_the_base_model_and_on_is_the_adapter(s, tuned):
    base, after, _ = tuned
    c = s.compare(PROMPTS, max_new_tokens=8)
    assert [r.base for r in c] == base and [r.tuned for r in c] == after
    assert all(r.base_tokens_per_s > 0 and r.tuned_tokens_per_s > 0 for r in c)
    assert s.generate(PROMPTS[0], max_new_tokens=8) == after[0]  # the adapter is on again afterwards
    assert s.info["adapters"] == ["default"]
    frame = c.to_frame()
    assert list(frame.columns[:3]) == ["prompt", "base", "tuned"] and len(frame) == 2
    assert "tok/s" in str(c) and "tuned (default)" in c._repr_html_()
    one = s.compare(PROMPTS[0], max_new_tokens=8, do_sample=True, seed=7, temperature=0.9)
    again = s.compare(PROMPTS[0], max_new_tokens=8, do_sample=True, seed=7, temperature=0.9)
    assert [(r.base, r.tuned) for r in one] == [(r.base, r.tuned) for r in again]  # same seed, same text


def test_compare_escapes_html(s, tuned):
    c = s.compare(["<b>GPU</b>"], max_new_tokens=2)
    assert "<b>GPU</b>" not in c._repr_html_() and "&lt;b&gt;GPU&lt;/b&gt;" in c._repr_html_()


@pytest.mark.parametrize("args, kw, match", [
    (([],), {}, "prompts"),
    ((["ok", 3],), {}, "prompts"),
    ((PROMPTS,), dict(stream=print), "stream"),
    ((PROMPTS,), dict(fast=True), "fast"),
    ((PROMPTS,), dict(max_new_tokens=0), "max_new_tokens"),
])
def test_compare_bad_input(s, tuned, args, kw, match):
    with pytest.raises(NvkitError, match=match):
        s.compare(*args, **kw)
    assert s.generate(PROMPTS[0], max_new_tokens=8) == tuned[1][0]


def test_export_merged_reloads_with_plain_transformers(s, tuned, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    _, after, run = tuned
    out = s.export(str(tmp_path / "merged"))
    names = set(os.listdir(out))
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md",
            "nvkit.json"} <= names and not any(n.startswith("adapter") for n in names)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    for prompt, want in zip(PROMPTS, after):
        enc = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        assert tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True) == want
    card = (tmp_path / "merged" / "README.md").read_text()
    assert "base_model:" in card and "| steps | 15 |" in card and "r=16" in card and "eval after (final)" in card
    assert f"loss {run.eval_history[-1]['eval_loss']:.4f}" in card
    assert s.info["adapters"] == ["default"]  # the session keeps its adapter
    assert s.generate(PROMPTS[0], max_new_tokens=8) == after[0]


def test_export_adapter_and_replace_only_its_own(s, tuned, path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    _, after, _ = tuned
    out = s.export(str(tmp_path / "adapter"), merge=False)
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(os.listdir(out))
    assert json.loads((tmp_path / "adapter" / "nvkit.json").read_text())["kind"] == "export"
    base = AutoModelForCausalLM.from_pretrained(path)
    model = PeftModel.from_pretrained(base, out)
    enc = s.tokenizer(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=s.tokenizer.pad_token_id)
    assert s.tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True) == after[0]
    assert s.export(out, merge=False) == out  # its own export is replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(NvkitError, match="did not write"):
        s.export(str(mine))
    assert os.listdir(mine) == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(NvkitError, match="is a file"):
        s.export(str(tmp_path / "file"))
    with pytest.raises(NvkitError, match="merge must be"):
        s.export(str(tmp_path / "x"), merge="yes")
    with pytest.raises(NvkitError, match="folder path"):
        s.export("")


def test_without_an_adapter(s, tuned, tmp_path):
    base, _, _ = tuned
    s.unload_adapter()
    with pytest.raises(NvkitError, match="compare needs an adapter"):
        s.compare(PROMPTS)
    with pytest.raises(NvkitError, match="merge=False exports the adapter"):
        s.export(str(tmp_path / "a"), merge=False)
    out = s.export(str(tmp_path / "plain"))  # the model as the session holds it, with a card saying so
    card = (tmp_path / "plain" / "README.md").read_text()
    assert "no adapter" in card and "| steps |" not in card
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out)
    enc = s.tokenizer(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=s.tokenizer.pad_token_id)
    assert s.tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True) == base[0]
