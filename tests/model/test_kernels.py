"""Local kernels in the Hub kernel layout really replace the model's layers (same outputs), the
kernels follow train()/eval(), and an offline kernel request with nothing local fails before the
current model is touched."""

import os
import sys

import pytest
import torch

from nvkit import NvkitError
from nvkit.model.kernels import local_kernel_config, model_kernel_layers, plan_kernels, replaced_modules
from nvkit.model.session import load, session
from tests import demo_model  # noqa: E402

KDIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "kernels", "nvkit-rmsnorm")


def _calls():
    mod = sys.modules.get("_nvkit_rmsnorm_test.layers")
    return mod.CALLS[0] if mod else 0


@pytest.fixture(scope="module")
def ref():
    s = load(demo_model.path())
    x = s.tokenizer("NVIDIA GPUs are fast", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = s.model(x).logits
    n_norms = sum(1 for m in s.model.modules() if getattr(type(m), "kernel_layer_name", None) == "RMSNorm")
    s.unload()
    return x, logits, n_norms


def test_model_declares_rmsnorm():
    assert "RMSNorm" in model_kernel_layers(demo_model.path())


def test_local_directory_replaces_rmsnorm_with_same_outputs(ref):
    x, logits, n_norms = ref
    s = load(demo_model.path(), use_kernels=True, kernel_config=local_kernel_config(KDIR, device="cpu"))
    try:
        k = s.info["kernels"]
        assert k["replaced"] == {"RMSNorm": n_norms} and "local kernel directory" in k["layers"]["RMSNorm"]
        before = _calls()
        with torch.no_grad():
            out = s.model(x).logits
        assert _calls() - before == n_norms  # the kernel's forward ran, once per norm
        torch.testing.assert_close(out, logits, rtol=1e-5, atol=1e-5)
        # training mode: transformers re-kernelizes with Mode.TRAINING; the kernel has a backward
        s.model.train()
        assert replaced_modules(s.model) == {"RMSNorm": n_norms}
        s.model(x, labels=x).loss.backward()
        s.model.eval()
        assert s.generate("NVIDIA GPUs are", max_new_tokens=4)
    finally:
        s.unload()


def test_local_kernels_env_works_offline(ref, monkeypatch):
    x, logits, n_norms = ref
    monkeypatch.setenv("LOCAL_KERNELS", f"nvkit-test/rmsnorm={KDIR}")
    s = load(demo_model.path(), kernel_config={"RMSNorm": {"cpu": "nvkit-test/rmsnorm:RMSNorm"}})
    try:
        assert s.info["kernels"]["replaced"] == {"RMSNorm": n_norms}
        assert "LOCAL_KERNELS" in s.info["kernels"]["layers"]["RMSNorm"]
        with torch.no_grad():
            torch.testing.assert_close(s.model(x).logits, logits, rtol=1e-5, atol=1e-5)
    finally:
        s.unload()


def test_enable_kernels_on_a_loaded_session(ref):
    _, _, n_norms = ref
    s = load(demo_model.path())
    try:
        info = s.enable_kernels({"RMSNorm": {"cpu": f"{KDIR}:RMSNorm"}})
        assert info["replaced"] == {"RMSNorm": n_norms} and s.model.use_kernels
    finally:
        s.unload()


def test_offline_hub_kernel_fails_before_touching_the_session(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    s = load(demo_model.path())
    try:
        out = s.generate("NVIDIA GPUs are", max_new_tokens=4)
        with pytest.raises(NvkitError) as e:
            load(demo_model.path(), kernel_config={"RMSNorm": {"cpu": "kernels-community/liger-kernels:LigerRMSNorm"}})
        msg = str(e.value)
        assert "kernels-community/liger-kernels" in msg and "HF_HUB_OFFLINE" in msg and "LOCAL_KERNELS=" in msg
        with pytest.raises(NvkitError, match="kernels-community/liger-kernels"):
            s.enable_kernels({"RMSNorm": {"cpu": "kernels-community/liger-kernels:LigerRMSNorm"}})
        assert session() is s and not s.model.use_kernels and replaced_modules(s.model) == {}
        assert s.generate("NVIDIA GPUs are", max_new_tokens=4) == out
    finally:
        s.unload()


def test_default_cuda_mapping_offline_names_the_repo(monkeypatch, tmp_path):
    # use_kernels=True on CUDA: transformers' own mapping; offline and uncached → a clear error
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    with pytest.raises(NvkitError, match=r"kernels-community/[\w-]+ .*can't be loaded.*Bring it in"):
        plan_kernels(demo_model.path(), "cuda", use_kernels=True)


def test_use_kernels_on_cpu_says_nothing_was_replaced():
    s = load(demo_model.path(), use_kernels=True)
    try:
        k = s.info["kernels"]
        assert k["replaced"] == {} and "RMSNorm" in k["unchanged"]
    finally:
        s.unload()


@pytest.mark.parametrize("cfg, match", [
    ({"LayerNorm": {"cpu": f"{KDIR}:RMSNorm"}}, "no such kernel layer"),
    ({"RMSNorm": {"gpu": f"{KDIR}:RMSNorm"}}, "unknown device key"),
    ({"RMSNorm": {"cpu": "no-colon"}}, "must be 'org/repo:LayerName'"),
    ({"RMSNorm": {"cpu": "/nonexistent/kernel:RMSNorm"}}, "does not exist"),
    ({"RMSNorm": {"cpu": f"{KDIR}:NoSuchLayer"}}, "could not be loaded"),
    ({}, "maps no layers"),
    ("RMSNorm", "kernel_config must be"),
])
def test_bad_kernel_configs(cfg, match):
    with pytest.raises(NvkitError, match=match):
        plan_kernels(demo_model.path(), "cpu", True, cfg)


def test_local_kernel_config_helper(tmp_path):
    from transformers import KernelConfig
    kc = local_kernel_config(KDIR)
    assert isinstance(kc, KernelConfig) and kc.use_local_kernel
    assert kc.kernel_mapping["RMSNorm"]["cuda"].endswith("nvkit-rmsnorm:RMSNorm")
    with pytest.raises(NvkitError, match="not a directory"):
        local_kernel_config(tmp_path / "missing")
    with pytest.raises(NvkitError, match="use_kernels must be"):
        plan_kernels(demo_model.path(), "cpu", "yes")
