"""On a CUDA GPU (the H200): sdpa / eager / FA4 load, generate and take a training step with
logits close to sdpa; FA2/FA3 take the Hub-kernel path or fail with the clear offline message;
bitsandbytes nf4/int8 load and generate; a local kernel with a "cuda" KernelConfig key; and the
bench table for the Qwen3-0.6B shape (run with -s to see it)."""

import os

import pytest
import torch

import nvkit
from nvkit import NvkitError
from nvkit.model.kernels import local_kernel_config
from nvkit.model.session import load
from tests import demo_model  # noqa: E402

KDIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "kernels", "nvkit-rmsnorm")
PROMPT = "NVIDIA GPUs are"


def _ids(s):
    return s.tokenizer([PROMPT + " fast and the kernels are small"], return_tensors="pt").input_ids.to(s.device)


@pytest.fixture(scope="module")
def sdpa_ref():
    s = load(demo_model.path(), dtype="bfloat16", attn_implementation="sdpa")
    x = _ids(s)
    with torch.no_grad():
        logits = s.model(x).logits.float().cpu()
    s.unload()
    return x.cpu(), logits


def test_table_on_this_gpu():
    t = nvkit.attention_backends("cuda")
    print("\n" + str(t) + "\n" + str(nvkit.quantization_methods("cuda")))
    assert t["sdpa"].available and t["eager"].available
    cap = torch.cuda.get_device_capability(0)
    if cap < (8, 0):
        assert "GPU too old" in t["flash_attention_2"].reason


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flash_attention_4"])
def test_backend_generates_trains_and_matches_sdpa(backend, sdpa_ref):
    c = nvkit.attention_backends("cuda")[backend]
    if not c.available:
        pytest.skip(f"{backend} not available here: {c.reason}")
    x, ref = sdpa_ref
    s = load(demo_model.path(), dtype="bfloat16", attn_implementation=backend)
    try:
        assert s.info["attention"] == backend and s.device.type == "cuda"
        assert s.generate(PROMPT, max_new_tokens=16) and s.last_stats.new_tokens > 0
        x = x.to(s.device)
        with torch.no_grad():
            logits = s.model(x).logits.float().cpu()
        # bf16 attention kernels differ in summation order: close, not equal
        torch.testing.assert_close(logits, ref, rtol=0.05, atol=0.15)
        assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9
        s.model.train()
        opt = torch.optim.SGD(s.model.parameters(), lr=1e-4)
        loss = s.model(x, labels=x).loss
        loss.backward()
        assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in s.model.parameters() if p.grad is not None)
        opt.step()
        s.model.eval()
    finally:
        s.unload()


@pytest.mark.parametrize("backend, repo", [("flash_attention_2", "kernels-community/flash-attn2"),
                                           ("flash_attention_3", "kernels-community/vllm-flash-attn3")])
def test_fa2_fa3_hub_path_or_clear_offline_message(backend, repo):
    c = nvkit.attention_backends("cuda")[backend]
    print(f"\n{backend}: available={c.available} source={c.source} reason={c.reason}")
    if c.available:
        s = load(demo_model.path(), dtype="bfloat16", attn_implementation=backend)
        try:
            assert s.generate(PROMPT, max_new_tokens=8)
        finally:
            s.unload()
        return
    if "GPU too old" in c.reason:
        pytest.skip(c.reason)
    assert repo in c.source
    with pytest.raises(NvkitError) as e:
        load(demo_model.path(), dtype="bfloat16", attn_implementation=backend)
    assert repo in str(e.value) and "LOCAL_KERNELS" in str(e.value) and "Backends that work here" in str(e.value)


@pytest.mark.parametrize("method", ["nf4", "int8"])
def test_bnb_on_gpu(method):
    s = load(demo_model.path(), dtype="bfloat16", quantization=method)
    try:
        assert s.info["quantization"] == method and s.device.type == "cuda"
        assert s.generate(PROMPT, max_new_tokens=12) and s.last_stats.new_tokens > 0
        print(f"\n{method}: footprint {s.info['footprint_bytes']} reported, {s.info['measured_bytes']} measured")
    finally:
        s.unload()


def test_local_kernel_with_cuda_key(sdpa_ref):
    x, ref = sdpa_ref
    s = load(demo_model.path(), dtype="bfloat16", use_kernels=True, kernel_config=local_kernel_config(KDIR))
    try:
        assert s.info["kernels"]["replaced"].get("RMSNorm", 0) > 0
        with torch.no_grad():
            logits = s.model(x.to(s.device)).logits.float().cpu()
        torch.testing.assert_close(logits, ref, rtol=0.02, atol=0.05)
        s.model.train()
        s.model(x.to(s.device), labels=x.to(s.device)).loss.backward()
        s.model.eval()
    finally:
        s.unload()


def test_bench_qwen3_0_6b_shape():
    import pandas as pd
    from nvkit.demo import shaped
    path = shaped("qwen3-0.6b")
    table = nvkit.attention_backends("cuda")
    backends = [b for b in ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flash_attention_4")
                if b in ("sdpa", "eager") or table[b].available]
    df = nvkit.bench(path, backends=backends, quantizations=[None, "nf4", "int8"], prompt_len=512, new_tokens=64,
                     batch_size=1, repeats=3, dtype="bfloat16")
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print("\n" + df.drop(columns=["peak_memory_bytes"]).to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    ok = df[df["error"] == ""]
    assert len(ok) >= 3 and (ok["decode_tok_s"] > 0).all()
    assert df.set_index("row").loc["nvkit sdpa", "match_rate"] >= 0.95
