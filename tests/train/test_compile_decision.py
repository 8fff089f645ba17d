"""compile="auto" by the run's length and the compile cache; the cache's key, files and loading."""

from __future__ import annotations

import os
import stat

import pytest

from nvkit.train.compile import (COMPILE_MIN_STEPS_COLD, COMPILE_MIN_STEPS_WARM, CompileCache,
                                 compile_decision)


def test_short_runs_do_not_compile_long_ones_do():
    on, why = compile_decision("auto", "cuda", 20, cache_warm=False)
    assert on is False and "short run (20 steps)" in why and str(COMPILE_MIN_STEPS_COLD) in why
    assert compile_decision("auto", "cuda", COMPILE_MIN_STEPS_COLD, False)[0] is True
    assert compile_decision("auto", "cuda", COMPILE_MIN_STEPS_COLD - 1, False)[0] is False
    # a warm cache makes compiling pay back sooner
    assert COMPILE_MIN_STEPS_WARM < COMPILE_MIN_STEPS_COLD
    on, why = compile_decision("auto", "cuda", COMPILE_MIN_STEPS_WARM, cache_warm=True)
    assert on is True and "warm" in why
    assert compile_decision("auto", "cuda", COMPILE_MIN_STEPS_WARM - 1, True)[0] is False


def test_explicit_choices_and_the_cpu():
    assert compile_decision(True, "cpu", 1, False) == (True, "on (compile=True)")
    assert compile_decision(False, "cuda", 10_000, True) == (False, "off (compile=False)")
    on, why = compile_decision("auto", "cpu", 10_000, True)
    assert on is False and "CPU" in why


def test_the_run_says_what_it_decided(s, tmp_path):
    import nvkit
    run = nvkit.finetune(s, ["The H200 has 141 GB of memory."] * 4, max_steps=1, batch_size=2, seq_len=64,
                         output_dir=str(tmp_path / "r"))
    run.result(timeout=300)
    assert run.info["compile"] is False and run.info["compile_reason"].startswith("off: the model is on the CPU")


def _facts(**over):
    base = dict(config={"model_type": "qwen3", "hidden_size": 64}, dtype="torch.bfloat16", lora={"r": 16},
                batch_size=8, seq_len=512, gradient_checkpointing=False, kbit=False, capability=(9, 0),
                budget=0.5, torch="2.11", transformers="5.22", peft="0.17")
    base.update(over)
    return base


def test_cache_key_follows_everything_that_changes_the_code(tmp_path):
    a = CompileCache(_facts(), root=str(tmp_path))
    assert CompileCache(_facts(), root=str(tmp_path)).path == a.path
    for change in (dict(seq_len=1024), dict(lora={"r": 8}), dict(dtype="torch.float16"), dict(torch="2.12"),
                   dict(capability=(8, 0)), dict(config={"model_type": "qwen3", "hidden_size": 128})):
        assert CompileCache(_facts(**change), root=str(tmp_path)).path != a.path, change
    assert not a.warm and a.load().startswith("cold")


def test_cache_files_are_private_and_a_bad_one_is_ignored(tmp_path):
    import torch
    root = tmp_path / "compile"
    cache = CompileCache(_facts(), root=str(root))
    torch.compiler.reset()
    f = torch.compile(lambda x: (x.sin() * 2 + 1).sum())
    f(torch.randn(8))
    said = cache.save()
    assert said.startswith("saved"), said
    assert cache.warm
    assert stat.S_IMODE(os.stat(cache.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(root).st_mode) & 0o077 == 0
    assert cache.load().startswith("warm")
    with open(cache.path, "wb") as fh:
        fh.write(b"not artifacts")
    assert cache.load().startswith("cold (the saved artifacts could not be loaded")


def test_a_symlinked_cache_folder_is_not_written_through(tmp_path):
    import torch
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "compile")
    cache = CompileCache(_facts(), root=str(tmp_path / "compile"))
    torch.compile(lambda x: x.cos().sum())(torch.randn(4))
    assert cache.save().startswith("not saved")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("steps", [1, 59, 299])
def test_estimate_follows_the_decision(steps):
    from nvkit.memory.estimate import estimate
    compiled = compile_decision("auto", "cuda", steps, False)[0]
    e = estimate("qwen3-0.6b", mode="lora", batch_size=8, seq_len=512, compiled=compiled)
    assert e.parts["activations"] == estimate("qwen3-0.6b", mode="lora", batch_size=8, seq_len=512,
                                              path="plain").parts["activations"]
    assert "fused loss" in e.formulas["logits"]  # the default path is nvkit's
