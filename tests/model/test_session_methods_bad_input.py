"""The session's own methods with wrong arguments (set_attention, enable_kernels, load_adapter,
merge_adapter, unload_adapter): NvkitError, and the session keeps its model and generates as before."""

import dataclasses
import json
import shutil

import pytest

from tests.refusals import refused


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A real LoRA adapter for the demo model (B starts at zero, so it changes no output)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    import nvkit.demo
    d = tmp_path_factory.mktemp("adapter") / "good"
    base = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(d)
    return d


def test_set_attention_refuses(survivor):
    s = survivor.session
    refused(lambda: s.set_attention(5), "attn_implementation must be", survivor=survivor)
    refused(lambda: s.set_attention(""), "attn_implementation must be", survivor=survivor)
    refused(lambda: s.set_attention("bogus"), "Unknown attention backend 'bogus'", "sdpa", survivor=survivor)
    refused(lambda: s.set_attention("paged|sdpa"), "continuous batching", survivor=survivor)
    if s.device.type == "cpu":
        refused(lambda: s.set_attention("flash_attention_2"), "can't be used here", "needs a CUDA GPU", survivor=survivor)
        refused(lambda: s.set_attention("kernels-community/flash-attn2"), "kernels-community/flash-attn2", survivor=survivor)
    assert s.model.config._attn_implementation == "sdpa"


def test_enable_kernels_refuses(survivor):
    s = survivor.session
    refused(lambda: s.enable_kernels(5), "kernel_config must be", survivor=survivor)
    refused(lambda: s.enable_kernels({}), "maps no layers", survivor=survivor)
    refused(lambda: s.enable_kernels({"RMSNorm": {"gpu": "/x:RMSNorm"}}), "unknown device key", survivor=survivor)
    refused(lambda: s.enable_kernels({"RMSNorm": {"cpu": "no-colon"}}), "must be 'org/repo:LayerName'", survivor=survivor)
    assert not s.model.use_kernels


def test_load_adapter_refuses(survivor, adapter, tmp_path):
    s = survivor.session
    refused(lambda: s.load_adapter(5), "adapter_dir must be a directory path", survivor=survivor)
    refused(lambda: s.load_adapter(""), "adapter_dir must be a directory path", survivor=survivor)
    refused(lambda: s.load_adapter(tmp_path / "missing"), "No adapter directory", survivor=survivor)
    refused(lambda: s.load_adapter(tmp_path), "holds no adapter_config.json", survivor=survivor)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    refused(lambda: s.load_adapter(broken), "unreadable", survivor=survivor)

    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(adapter / "adapter_config.json", no_weights)
    refused(lambda: s.load_adapter(no_weights), "no adapter weights", survivor=survivor)

    elsewhere = tmp_path / "other-model"
    shutil.copytree(adapter, elsewhere)
    cfg = json.loads((elsewhere / "adapter_config.json").read_text())
    cfg["target_modules"] = ["no_such_proj"]
    (elsewhere / "adapter_config.json").write_text(json.dumps(cfg))
    refused(lambda: s.load_adapter(elsewhere), "Could not load the adapter", "only fits the model", survivor=survivor)

    refused(lambda: s.load_adapter(adapter, name="a.b"), "without dots", survivor=survivor)
    refused(lambda: s.load_adapter(adapter, name=5), "without dots", survivor=survivor)
    assert not s.info["adapters"]


def test_adapter_twice_and_merge_or_unload_without_one(survivor, adapter):
    s = survivor.session
    refused(lambda: s.merge_adapter(), "no adapter to merge", survivor=survivor)
    refused(lambda: s.unload_adapter(), "no adapter to unload", survivor=survivor)
    assert s.load_adapter(adapter) == "default"
    try:
        refused(lambda: s.load_adapter(adapter, name="default"), "already on the model", survivor=survivor)
    finally:
        s.unload_adapter()
    survivor.check()


def test_methods_of_an_unloaded_session_say_so(survivor, adapter):
    ghost = dataclasses.replace(survivor.session, model=None, tokenizer=None)
    for call in (lambda: ghost.set_attention("sdpa"), lambda: ghost.load_adapter(adapter),
                 lambda: ghost.merge_adapter(), lambda: ghost.unload_adapter(), lambda: ghost.enable_kernels({}),
                 lambda: ghost.generate("NVIDIA GPUs are")):
        refused(call, "was unloaded", "nvkit.load('demo')", survivor=survivor)
