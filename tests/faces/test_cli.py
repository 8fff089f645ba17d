"""The ``nvkit`` console script on a CPU-only machine: ``doctor`` is clear and exits 0, and every
form of ``nvkit bench`` the help and README show runs (in a subprocess, as typed, at small sizes)."""

import json
import os
import subprocess
import sys

import pytest


def _nvkit(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "nvkit.cli", *args], capture_output=True, text=True, env=e, timeout=300)


def test_doctor_cpu_only_says_so_and_exits_0():
    r = _nvkit("doctor", env={"NVKIT_FAKE_GPUS": ""})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "torch.cuda.is_available() = False" in out
    assert "No CUDA GPU is visible here" in out
    for pkg in ("torch", "transformers", "peft", "kernels", "bitsandbytes"):
        assert pkg in out


def test_doctor_json_is_machine_readable():
    r = _nvkit("doctor", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["cuda_available"] is False and data["cuda_device_count"] == 0
    assert data["versions"]["transformers"].startswith("5.")


def test_unknown_subcommand_fails_with_usage():
    r = _nvkit("frobnicate")
    assert r.returncode != 0 and "invalid choice" in r.stderr


# --- nvkit bench: each documented form, as a user types it, at CPU sizes ------------------------

def _bench(tmp_path, *args):
    # the shaped checkpoints go to this test's own cache; NVKIT_FAKE_GPUS="": this CPU, no inventory
    r = _nvkit("bench", *args, "--json", env={"NVKIT_CACHE": str(tmp_path / "cache"), "NVKIT_FAKE_GPUS": ""})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_bench_help_is_the_benchmarks_own():
    r = _nvkit("bench", "--help")
    assert r.returncode == 0, r.stderr
    for words in ("--decode", "--lora", "shape:qwen3-0.6b", "[--lora] tokens per training row", "[default, --decode]"):
        assert words in r.stdout, words


def test_bench_compare_on_demo(tmp_path):
    rows = _bench(tmp_path, "demo", "--backends", "sdpa", "--quant", "none", "--prompt-len", "6", "--new-tokens", "3",
                  "--repeats", "1", "--device-map", "cpu")
    assert [r["row"] for r in rows] == ["transformers (plain)", "nvkit sdpa"]
    assert all(r["tokens"] == 3 and r["decode_tok_s"] > 0 and r["error"] == "" for r in rows)


def test_bench_decode_on_a_directory(tmp_path):
    import nvkit.demo
    directory = nvkit.demo.shaped("qwen3-tiny", cache_dir=tmp_path / "dir")  # a checkpoint on disk, by its path
    rows = _bench(tmp_path, directory, "--decode", "--new-tokens", "3", "--prompt-len", "6", "--n-prompts", "2",
                  "--batch-new-tokens", "2", "--repeats", "1", "--paths", "generate,fast,padded generate,nvkit batch")
    by = {r["path"]: r for r in rows}
    assert by["generate"]["tokens"] == 3 and by["generate"]["tokens_per_s"] > 0
    assert by["fast"]["note"] == "skipped: the fast path needs CUDA"
    assert by["padded generate"]["tokens"] == 4 and by["nvkit batch"]["tokens"] == 4  # 2 prompts x 2 tokens
    assert "produced" not in by["padded generate"]["note"] + by["nvkit batch"]["note"]


def test_bench_lora_on_a_shape(tmp_path):
    # the README's form (it crashed: run() got an unexpected keyword argument 'prompt_len')
    rows = _bench(tmp_path, "shape:qwen3-tiny", "--lora", "--batch-size", "2", "--seq-len", "32", "--steps", "2",
                  "--warmup", "1", "--variants", "nvkit", "--device", "cpu", "--learning-rate", "1e-3")
    assert [r["variant"] for r in rows] == ["plain", "nvkit"]
    for r in rows:  # it trained: finite, falling loss and a finite gradient norm
        assert r["error"] == "" and r["final_loss"] < r["first_loss"] and r["grad_norm"] > 0, r
        assert r["tokens_per_s"] > 0
