"""The shipped demo model and the random-weight shapes (CPU, offline)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import nvkit.demo as demo
from nvkit.errors import NvkitError

PROMPT = "NVIDIA GPUs are"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(demo.path())


@pytest.fixture(scope="module")
def model():
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(demo.path()).eval()


def _corpus_words() -> set[str]:
    return set(re.findall(r"[A-Za-z]+", Path(demo.CORPUS).read_text(encoding="utf-8").lower()))


def test_import_is_light():
    code = "import sys, nvkit.demo; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_shipped_files():
    d = Path(demo.path())
    assert (d / "model.safetensors").stat().st_size < 12 * 2**20
    assert not list(d.glob("*.bin"))
    assert 150_000 <= Path(demo.CORPUS).stat().st_size <= 300_000
    info = json.loads((d / "nvkit_demo.json").read_text())
    assert info["sample"]["prompt"] == PROMPT


def test_tokenizer_round_trip(tokenizer):
    text = "NVIDIA GPUs are fast. Use sdpa or FlashAttention 2; LoRA rank 16, 4-bit NF4 ok! Ünïcödé → 😀"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert max(ids) < len(tokenizer)
    # common corpus words are single tokens with the space attached (byte-level BPE)
    assert len(tokenizer(" memory", add_special_tokens=False)["input_ids"]) == 1


def test_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|endoftext|>"
    for tok in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        ids = tokenizer(tok, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == tok


def test_chat_template(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is LoRA?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is LoRA?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    assert plain == "<|im_start|>user\nWhat is LoRA?<|im_end|>\n"


def test_model_loads(model):
    assert model.config.model_type == "qwen3"
    assert type(model).__name__ == "Qwen3ForCausalLM"
    n = sum(p.numel() for p in model.parameters())
    assert 1e6 <= n <= 10e6
    assert model.config.tie_word_embeddings
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA like the real one


def test_greedy_generation_is_words(model, tokenizer):
    import torch
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    new = tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    words = re.findall(r"[A-Za-z]+", new.lower())
    assert len(words) >= 4, new
    vocab = _corpus_words()
    known = sum(w in vocab for w in words)
    assert known / len(words) >= 0.7, new
    assert new.startswith(" "), new  # a clean continuation: decoded with its leading space


def test_chat_generation_stops(model, tokenizer):
    import torch
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the KV cache?"}],
                                           add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=60, do_sample=False)
    new = out[0][inputs["input_ids"].shape[1]:].tolist()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in new  # the generation_config stops on <|im_end|>
    answer = tokenizer.decode(new, skip_special_tokens=True)
    assert len(re.findall(r"[A-Za-z]+", answer)) >= 3, answer


def test_shaped_config_qwen3_06b():
    c = demo.shaped_config("qwen3-0.6b")
    assert c.model_type == "qwen3"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (
        1024, 28, 16, 8, 128, 3072, 151936, 40960)
    assert c.tie_word_embeddings is True
    assert c.rope_parameters["rope_theta"] == 1_000_000
    assert c.rms_norm_eps == 1e-6
    assert str(c.dtype).endswith("bfloat16")
    assert demo.shaped_config("QWEN3-0.6B").hidden_size == 1024


def test_shaped_config_others():
    c = demo.shaped_config("qwen3-1.7b")
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.num_key_value_heads) == (2048, 28, 6144, 8)
    c = demo.shaped_config("llama-3.2-1b")
    assert c.model_type == "llama"
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.intermediate_size, c.vocab_size) == (2048, 16, 32, 8, 64, 8192, 128256)
    assert c.rope_parameters["rope_type"] == "llama3" and c.tie_word_embeddings is True


@pytest.mark.parametrize("name,low,high", [("qwen3-0.6b", 0.55e9, 0.65e9), ("qwen3-1.7b", 1.6e9, 1.8e9),
                                           ("llama-3.2-1b", 1.2e9, 1.3e9)])
def test_shaped_param_count_on_meta(name, low, high):
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(demo.shaped_config(name))
    n = sum(p.numel() for p in m.parameters())
    assert low <= n <= high, n


def test_unknown_shape_lists_names(tmp_path):
    with pytest.raises(NvkitError) as e:
        demo.shaped_config("gpt-9")
    assert "qwen3-0.6b" in str(e.value) and "llama-3.2-1b" in str(e.value)
    with pytest.raises(NvkitError):
        demo.shaped("gpt-9", cache_dir=tmp_path)
    assert "qwen3-0.6b" in demo.SHAPES


def test_shaped_tiny_builds_once(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path))
    d = Path(demo.shaped("qwen3-tiny"))
    assert d == tmp_path / "shaped" / "qwen3-tiny"
    weights = d / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert demo.shaped("qwen3-tiny") == str(d)  # reused, not rebuilt
    assert weights.stat().st_mtime_ns == stamp
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left behind
    m = AutoModelForCausalLM.from_pretrained(d)
    assert m.dtype == torch.bfloat16 and m.config.vocab_size == 151936
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) < m.config.vocab_size
    ids = tok("NVIDIA GPUs are", return_tensors="pt")
    with torch.inference_mode():
        out = m.generate(**ids, max_new_tokens=3, do_sample=False, min_new_tokens=3)
    assert out.shape[1] == ids["input_ids"].shape[1] + 3
    # ids the tokenizer cannot spell never win: the noise decodes to text, not to ""
    assert (out[0, ids["input_ids"].shape[1]:] < len(tok)).all()
    assert tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    # an explicit cache_dir holds <name> directly
    assert demo.shaped("qwen3-tiny", cache_dir=tmp_path / "other") == str(tmp_path / "other" / "qwen3-tiny")


# the published parameter counts (model cards and config.json), within 0.2 %
PUBLISHED = {"qwen3-0.6b": 0.596e9, "llama-3.2-1b": 1.236e9, "gemma-3-1b": 1.000e9, "gemma-3-4b": 3.880e9,
             "phi-4-mini": 3.836e9, "smollm3-3b": 3.075e9, "olmo-2-1b": 1.485e9, "olmoe-1b-7b": 6.919e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_shape_has_its_published_size(name):
    """Built on the meta device (no memory): the config transformers makes of the fields is the
    published model's, its layer kinds included."""
    import torch
    from transformers import AutoModelForCausalLM
    cfg = demo.shaped_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n / PUBLISHED[name] - 1) < 0.002, (name, n)
    assert type(model).__name__ == cfg.architectures[0]
    if name.startswith("gemma-3"):
        kinds = cfg.layer_types
        assert kinds[5] == "full_attention" and kinds.count("full_attention") == cfg.num_hidden_layers // 6
    if name == "smollm3-3b":
        assert cfg.no_rope_layers[:4] == [1, 1, 1, 0]  # every fourth layer without RoPE
