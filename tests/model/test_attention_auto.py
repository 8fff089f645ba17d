"""The default attention choice per model class (issue 19 item 7): a tiny Gemma2 (its class
refuses sdpa) built from a config, saved with the demo tokenizer, loaded offline on the CPU."""

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config

import nvkit
from nvkit.errors import NvkitError
from nvkit.model import backends


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma2-tiny")
    torch.manual_seed(0)
    cfg = Gemma2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=2155, max_position_embeddings=256)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    demo = nvkit.demo.path()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        try:
            shutil.copy(f"{demo}/{name}", d / name)
        except FileNotFoundError:
            pass
    return str(d)


def test_auto_picks_a_backend_the_class_supports_and_sdpa_by_name_says_which_do(gemma2_dir):
    import transformers as T
    assert "sdpa" not in backends.class_backends(T.Gemma2ForCausalLM)
    assert backends.class_backends(T.Qwen3ForCausalLM)[:2] == ("eager", "sdpa")
    assert backends.resolve_attention("auto", "cpu", model_class=T.Qwen3ForCausalLM) == "sdpa"
    assert backends.resolve_attention("auto", "cpu", model_class=T.Gemma2ForCausalLM) == "eager"
    s = nvkit.load(gemma2_dir, device_map="cpu", dtype="float32")  # the default: "auto"
    try:
        assert s.info["attention"] == "eager" and isinstance(s.generate("Hello", max_new_tokens=2), str)
        with pytest.raises(NvkitError, match=r"Gemma2ForCausalLM does not support attention backend 'sdpa'.*eager"):
            s.set_attention("sdpa")
        assert s.info["attention"] == "eager"  # refused: nothing changed
    finally:
        s.unload()
    with pytest.raises(NvkitError, match=r"does not support attention backend 'sdpa'\. It supports: eager, "
                                         r"flash_attention_2.*flex_attention; of those, these work here: eager"):
        nvkit.load(gemma2_dir, device_map="cpu", attn_implementation="sdpa")
    demo = nvkit.load("demo", device_map="cpu")
    try:
        assert demo.info["attention"] == "sdpa"  # a class with sdpa keeps it
    finally:
        demo.unload()
