"""What the parallel strategies need and what nvkit sets for them: the PEFT release that tensor-
parallel LoRA needs (the refusal names it, pyproject's ``tp`` extra pins it, the GPU wheels carry
it), and the ZeRO-3 settings nvkit derives from the model (the decoder layer gathered whole), which
must give the gradients DeepSpeed's default hooking gives, with far fewer hooks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train import strategies as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
Version = pytest.importorskip("packaging.version").Version


@pytest.fixture(scope="module")
def demo_config():
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(nvkit.demo.path())  # Qwen3: a tensor-parallel plan, 4 heads, 2 KV heads


def _fake_peft(monkeypatch, version: str, with_hooks: bool) -> None:
    """A peft package of ``version`` in sys.modules, with or without the tensor-parallel LoRA hook."""
    lora_model = types.ModuleType("peft.tuners.lora.model")
    if with_hooks:
        lora_model.get_tp_plan_and_mesh = lambda model, key: (None, None)
    lora = types.ModuleType("peft.tuners.lora")
    lora.model = lora_model
    tuners = types.ModuleType("peft.tuners")
    tuners.lora = lora
    peft = types.ModuleType("peft")
    peft.__version__ = version
    peft.tuners = tuners
    for name, module in (("peft", peft), ("peft.tuners", tuners), ("peft.tuners.lora", lora),
                         ("peft.tuners.lora.model", lora_model)):
        monkeypatch.setitem(sys.modules, name, module)


# --- tensor-parallel LoRA: the PEFT it needs ------------------------------------------------------

def test_tp_refusal_names_the_peft_release_that_has_the_hooks(monkeypatch, demo_config):
    """The GPU image's PEFT 0.21.0 lacks the hook; the refusal names the release that has it and
    how to get it, and never a release at or below the refused one."""
    _fake_peft(monkeypatch, "0.21.0", with_hooks=False)
    why = st.tp_lora_problem()
    assert why and "PEFT 0.21.0 cannot" in why, why
    assert f"PEFT {st.TP_LORA_PEFT} and newer can" in why and st.TP_INSTALL in why, why
    named = [Version(v) for v in re.findall(r"\d+\.\d+(?:\.\d+)?", why)]
    assert max(named) == Version(st.TP_LORA_PEFT) > Version("0.21.0"), why
    with pytest.raises(NvkitError, match=re.escape(f"PEFT {st.TP_LORA_PEFT} and newer can")):
        st.check("tp", device="cuda", nproc=2, config=demo_config)
    # generation needs no adapters: the same PEFT does not stop it
    st.check("tp", device="cuda", nproc=2, mode="generate", config=demo_config)


def test_tp_accepts_a_peft_with_the_hooks(monkeypatch, demo_config):
    _fake_peft(monkeypatch, st.TP_LORA_PEFT, with_hooks=True)
    assert st.tp_lora_problem() is None
    assert any("same batches" in n for n in st.check("tp", device="cuda", nproc=2, config=demo_config))


def test_missing_peft_names_the_release_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # an import of it raises ImportError
    why = st.tp_lora_problem()
    assert "PEFT is not installed" in why and st.TP_LORA_PEFT in why and st.TP_INSTALL in why, why


def test_installed_peft_trains_tensor_parallel_lora(demo_config):
    """The PEFT this suite runs with (the test extra pins the same floor) has the hook, and the check
    names its real release: the constant is no later than the first release that works."""
    import peft
    assert Version(peft.__version__) >= Version(st.TP_LORA_PEFT), peft.__version__
    assert st.tp_lora_problem() is None
    st.check("tp", device="cuda", nproc=2, config=demo_config)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _peft_requirement(reqs: list[str]):
    from packaging.requirements import Requirement
    found = [Requirement(r) for r in reqs if Requirement(r).name == "peft"]
    assert len(found) == 1, reqs
    return found[0]


def test_tp_extra_pins_the_peft_the_check_needs():
    """pyproject's `tp` extra and the test extra admit exactly the releases the check accepts: from
    TP_LORA_PEFT on, not the one before (so the pin and the check cannot drift apart)."""
    extras = _pyproject()["project"]["optional-dependencies"]
    for extra in ("tp", "test"):
        spec = _peft_requirement(extras[extra]).specifier
        assert spec.contains(st.TP_LORA_PEFT), (extra, str(spec))
        assert not spec.contains("0.21.0"), (extra, str(spec))
        floors = [s.version for s in spec if s.operator == ">="]
        assert floors == [st.TP_LORA_PEFT], (extra, str(spec))
    assert st.TP_INSTALL == "pip install 'nvkit[tp]'"


def test_gpu_wheels_carry_that_peft_and_the_pinned_deepspeed():
    """scripts/gpu_wheels_ds.sh fills the folder the GPU strategy runs carry: a PEFT the check
    accepts (the GPU image's is older) and the DeepSpeed pyproject pins."""
    text = open(os.path.join(ROOT, "scripts", "gpu_wheels_ds.sh"), encoding="utf-8").read()
    peft = re.findall(r"\bpeft==([\w.]+)", text)
    assert len(peft) == 1 and Version(peft[0]) >= Version(st.TP_LORA_PEFT), peft
    ds = re.findall(r"\bdeepspeed==([\w.]+)", text)
    assert ds and set(ds) == {_pyproject()["project"]["optional-dependencies"]["deepspeed"][0].split("==")[1]}, ds
    assert "../shared/gpu/install.sh .whl-ds/install.sh" in text


# --- ZeRO-3: the settings nvkit derives from the model --------------------------------------------

def test_zero3_settings_follow_the_model():
    from nvkit.train.worker import DecoderLayer, _strategy_arguments
    s = st.zero3_settings("Qwen3DecoderLayer", layer_params=15_730_944, adapter_matrix=16 * 3072)
    assert s["leaf_module"] == {"classes": ["Qwen3DecoderLayer"]}
    # DeepSpeed's own values where the model is small, the model's sizes where it is large
    assert s["stage3_prefetch_bucket_size"] == st.DS_PREFETCH_BUCKET
    assert s["stage3_param_persistence_threshold"] == st.DS_PERSISTENCE_THRESHOLD
    big = st.zero3_settings("LlamaDecoderLayer", layer_params=855_654_400, adapter_matrix=64 * 28_672)
    assert big["stage3_prefetch_bucket_size"] == 855_654_400  # at least the next whole layer
    assert big["stage3_param_persistence_threshold"] == 64 * 28_672  # every LoRA matrix whole
    # the worker builds them from the model's decoder layer and the LoRA rank; ZeRO-2 gets none
    layer = DecoderLayer("Qwen3DecoderLayer", 15_730_944, 3072)
    cfg = {"strategy": "zero3", "offload": None, "lora": {"r": 64}}
    zero = _strategy_arguments(cfg, layer, cuda=True)["deepspeed"]["zero_optimization"]
    assert zero["leaf_module"] == {"classes": ["Qwen3DecoderLayer"]} and zero["stage"] == 3
    assert zero["stage3_param_persistence_threshold"] == 64 * 3072
    zero2 = _strategy_arguments({**cfg, "strategy": "zero2"}, None, cuda=True)["deepspeed"]["zero_optimization"]
    assert not any(k.startswith("stage3_") or k == "leaf_module" for k in zero2)


def test_zero3_leaf_setting_is_left_out_for_a_deepspeed_without_it(monkeypatch):
    monkeypatch.setattr(st, "_deepspeed_version", lambda: (0, 17))
    assert "leaf_module" not in st.zero3_settings("Qwen3DecoderLayer", 1, 1)
    monkeypatch.setattr(st, "_deepspeed_version", lambda: (0, 19))
    assert "leaf_module" in st.zero3_settings("Qwen3DecoderLayer", 1, 1)


def test_decoder_layer_of_the_qwen3_shape():
    from nvkit.train.worker import decoder_layer
    layer = decoder_layer(nvkit.demo.path())
    assert layer.name == "Qwen3DecoderLayer" and layer.params > 0 and layer.widest > 0


def test_zero3_config_with_the_model_settings_is_one_deepspeed_accepts():
    pytest.importorskip("deepspeed")
    import json

    from deepspeed.runtime.config import DeepSpeedConfig
    cfg = st.deepspeed_config("zero3", "optimizer", cuda=False,
                              zero3=st.zero3_settings("Qwen3DecoderLayer", 855_654_400, 64 * 28_672))
    filled = json.loads(json.dumps(cfg))
    filled.update(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1, train_batch_size=4,
                  gradient_clipping=1.0, bf16={"enabled": False}, fp16={"enabled": False})
    z = DeepSpeedConfig(filled).zero_config
    assert z.leaf_module.classes == ["Qwen3DecoderLayer"]
    assert z.prefetch_bucket_size == 855_654_400 and z.param_persistence_threshold == 64 * 28_672


def _zero3_pass(model: str, out: str, variant: str) -> dict:
    import torch
    script = os.path.join(ROOT, "tests", "train", "zero3_grads_rank.py")
    p = subprocess.run([sys.executable, script, model, out, variant], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return torch.load(out)


def test_zero3_leaf_layers_give_the_same_gradients_with_far_fewer_hooks(tmp_path):
    """Where the ZeRO-3 time went on one GPU: a hook pair per module, and a LoRA model has many.
    nvkit's settings gather each decoder layer whole: the same loss and LoRA gradients as DeepSpeed's
    default hooking (with and without gradient checkpointing), from a fraction of the hooks."""
    pytest.importorskip("deepspeed")
    import torch
    from tests import demo_model
    model = demo_model.path()
    from transformers import AutoConfig
    layers = AutoConfig.from_pretrained(model).num_hidden_layers
    plain = _zero3_pass(model, str(tmp_path / "plain.pt"), "plain")
    for variant in ("nvkit", "nvkit+checkpointing"):
        tuned = _zero3_pass(model, str(tmp_path / f"{variant}.pt"), variant)
        # DeepSpeed's own linear under its default hooking, torch's F.linear under nvkit's settings
        assert plain["linear_swapped"] and not tuned["linear_swapped"], variant
        assert tuned["loss"] == pytest.approx(plain["loss"], rel=1e-6), variant
        assert tuned["grads"].keys() == plain["grads"].keys()
        assert all(g.abs().max() > 0 for g in plain["grads"].values())  # every LoRA matrix gets a gradient
        for name, g in plain["grads"].items():
            torch.testing.assert_close(tuned["grads"][name], g, rtol=1e-4, atol=1e-6, msg=f"{variant}: {name}")
        assert tuned["leaves"] == layers and plain["leaves"] == 0
        assert tuned["hooks"] * 5 < plain["hooks"], (tuned["hooks"], plain["hooks"])


# --- tensor parallel on one process ---------------------------------------------------------------

@pytest.mark.parametrize("world, placed", [(1, {"": 0}), (2, None)])
def test_tensor_parallel_on_one_gpu_places_the_model_on_it(monkeypatch, world, placed):
    """With one process transformers cuts nothing and places nothing: the worker gives the model its
    GPU (the one-GPU strategy runs); with several, transformers places each rank's slice itself (a
    device map beside a tensor-parallel plan is refused)."""
    import torch
    import transformers

    from nvkit.train.worker import load_model
    seen = {}

    def from_pretrained(path, **kw):
        seen.update(kw)
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    load_model({"model": "m"}, "tp", torch.bfloat16, "cuda", 0, world)
    assert seen["distributed_config"].tp_size == world
    assert seen.get("device_map") == placed
