"""The fast path's compile artifacts on disk: what the key holds, and a store in one process
making the next process's compile a cache hit (inductor on the CPU here; the GPU run is
tests/gpu/test_fast_session_gpu.py)."""

import os
import subprocess
import sys
import textwrap

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from nvkit.generate.fast import artifacts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny(seed=0, dtype=torch.float32, **shape):
    torch.manual_seed(seed)
    cfg = Qwen3Config(**{**dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, vocab_size=128), **shape})
    cfg._name_or_path = f"/somewhere/{seed}"
    return AutoModelForCausalLM.from_config(cfg).to(dtype)


def test_key_holds_the_shape_dtype_options_and_versions_not_the_weights_or_name():
    opts = dict(k=8, attention="triton-fused", length=4096, lora=None)
    a = artifacts.key(tiny(0), opts, torch.device("cpu"))
    assert a == artifacts.key(tiny(1), opts, torch.device("cpu"))  # other weights, other path: same compiled code
    assert a != artifacts.key(tiny(0, dtype=torch.bfloat16), opts, torch.device("cpu"))
    assert a != artifacts.key(tiny(0, num_hidden_layers=3), opts, torch.device("cpu"))
    assert a != artifacts.key(tiny(0), dict(opts, length=8192), torch.device("cpu"))
    assert a != artifacts.key(tiny(0), dict(opts, lora=(16, "torch.float32")), torch.device("cpu"))
    assert a != artifacts.key(tiny(0), dict(opts, k=4), torch.device("cpu"))


def test_artifacts_of_one_process_make_the_next_compile_a_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "nvkit"))
    assert artifacts.folder() == tmp_path / "nvkit" / "fast-decode"
    assert artifacts.restore("nothing-here") is False

    def run(code, inductor_dir):
        env = dict(os.environ, PYTHONPATH=ROOT, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / inductor_dir))
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    step = "f = torch.compile(lambda x: (x.sin() * 2 + x.cos()).sum(), fullgraph=True, dynamic=False)\nf(torch.randn(64))\n"
    out = run("import torch\nfrom nvkit.generate.fast import artifacts\n" + step
              + "print(artifacts.store('abc'))\n", "inductor-first")
    assert out.strip().endswith("abc.bin") and (tmp_path / "nvkit" / "fast-decode" / "abc.bin").is_file()
    # a second process with an empty inductor cache of its own: only the artifacts can make it a hit
    out = run("import torch\nfrom torch._dynamo.utils import counters\nfrom nvkit.generate.fast import artifacts\n"
              "print('restored', artifacts.restore('abc'))\n" + step
              + "print('hits', counters['inductor']['fxgraph_cache_hit'])\n", "inductor-second")
    assert "restored True" in out and "hits 1" in out, out
    (tmp_path / "nvkit" / "fast-decode" / "abc.bin").write_bytes(b"damaged")
    assert artifacts.restore("abc") is False  # a damaged file costs the compile it would save, nothing more
