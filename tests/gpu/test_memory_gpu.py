"""GPU checks of nvkit.memory / nvkit.estimate (run by the lead on the H200):

- an absurd batch provokes a CUDA OOM that is reported and recovered without restarting;
- predicted vs measured peak for the Qwen3-0.6B shape: inference at batch 1 and 8, one LoRA step;
- the sampler's overhead on decode speed (printed; a benchmark, not a timed assertion).

Run: HF_HUB_OFFLINE=1 python -m pytest tests/gpu/test_memory_gpu.py -m gpu -s
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

from nvkit.benchmarks import sampler as sampler_bench
import nvkit  # noqa: E402
from nvkit import memory  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.units import fmt_bytes  # noqa: E402

TOLERANCE = 0.15


@pytest.fixture(scope="module")
def qwen_dir():
    return nvkit.demo.shaped("qwen3-0.6b")


@pytest.fixture(scope="module")
def session(qwen_dir):
    memory.sampler(rate_hz=20)  # NVML peaks between samples: sample fast while measuring
    s = nvkit.load(qwen_dir, dtype="bfloat16", device_map="cuda")
    yield s
    s.unload()


def _report(label, est, c):
    print(f"\n{label}: predicted {fmt_bytes(est.total)} · measured (NVML peak) {fmt_bytes(c.measured)} · "
          f"error {c.error:+.1%} · torch peak allocated {fmt_bytes(c.measured_torch_allocated)}, "
          f"reserved {fmt_bytes(c.measured_torch_reserved)}\n{est}")


def test_oom_is_recovered_without_restart(session):
    # A list of prompts would go through continuous batching, which sizes its cache to what is
    # free and never runs out; so cap this process's allocator just above the weights and send one
    # long prompt whose KV cache and prefill activations cannot fit.
    torch.cuda.set_per_process_memory_fraction((session.info["footprint_bytes"] + 512 * 2**20)
                                               / torch.cuda.get_device_properties(0).total_memory)
    try:
        with pytest.raises(NvkitError) as ei:
            session.generate("NVIDIA GPUs are " * 12000, max_new_tokens=2, fast=False)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    msg = str(ei.value)
    print("\n" + msg)
    assert "Out of GPU memory during generate" in msg and "still usable" in msg
    assert "smaller batch" in msg
    assert isinstance(ei.value.__cause__, torch.OutOfMemoryError)
    memory.release()
    # memory came back: what is allocated is the weights again (plus small leftovers)
    assert torch.cuda.memory_allocated() < session.info["footprint_bytes"] + 256 * 2**20
    # same session, no restart. (Random weights over a 152k vocabulary mostly pick ids the demo
    # tokenizer has no text for, so the text may be empty: count the tokens instead.)
    session.generate("NVIDIA GPUs are", max_new_tokens=8, fast=False)
    assert session.last_stats.new_tokens >= 1 and not session.last_stats.stopped
    assert nvkit.events.events()[-1].kind == "generate-end"


@pytest.mark.parametrize("batch", [1, 8])
def test_inference_estimate_within_15_percent(session, batch):
    prompt_len, new = 512, 512
    ids = torch.randint(1000, 5000, (batch, prompt_len), device="cuda")
    est = nvkit.estimate("qwen3-0.6b", batch_size=batch, seq_len=prompt_len + new, prompt_len=prompt_len)
    memory.expect(est)
    try:
        nvkit.events.record("generate-start", f"estimate check, batch {batch}")
        with torch.inference_mode():
            session.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                   min_new_tokens=new, do_sample=False)
        nvkit.events.record("generate-end", f"estimate check, batch {batch}")
    finally:
        memory.expect(None)
    c = memory.last_comparison()
    _report(f"inference batch {batch} × ({prompt_len} + {new})", est, c)
    assert abs(c.error) <= TOLERANCE


def test_lora_estimate_within_15_percent(qwen_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    cur = nvkit.session(required=False)
    if cur is not None:
        cur.unload()
    memory.release()
    B, S = 4, 512
    est = nvkit.estimate("qwen3-0.6b", mode="lora", batch_size=B, seq_len=S, lora_r=16, path="plain")
    # The estimate's assumptions: PEFT all-linear LoRA (fp32 adapters, dropout 0), AdamW, the
    # standard (unfused) loss, no autocast. nvkit.finetune fuses the loss and is printed apart.
    memory.expect(est)
    try:
        nvkit.events.record("train-start", "estimate check")
        m = AutoModelForCausalLM.from_pretrained(qwen_dir, dtype=torch.bfloat16, device_map="cuda")
        m = get_peft_model(m, LoraConfig(r=16, target_modules="all-linear", lora_dropout=0.0))
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(1000, 5000, (B, S), device="cuda")
        for _ in range(2):
            out = m(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del out
        torch.cuda.synchronize()
        nvkit.events.record("train-end", "estimate check")
    finally:
        memory.expect(None)
    c = memory.last_comparison()
    _report(f"LoRA r=16, batch {B} × {S}", est, c)
    del m, opt
    memory.release()
    assert abs(c.error) <= TOLERANCE


def test_finetune_predicts_its_own_peak(qwen_dir):
    """nvkit.finetune sets the nvkit-path estimate (fused loss, compiled layers under the
    activation budget) as the expectation; at 4 × 512 (the calibration point was 8 × 512) it must
    land within 15 % of the measured peak, like the other estimates."""
    from nvkit import demo
    cur = nvkit.session(required=False)
    if cur is not None:
        cur.unload()
    memory.release()
    memory.sampler(rate_hz=20)
    s = nvkit.load(qwen_dir, dtype="bfloat16", device_map="cuda")
    try:
        with open(demo.CORPUS, encoding="utf-8") as f:
            text = f.read()
        # 120-character rows (~25 tokens): packing joins short rows but never splits a long one, so
        # short rows fill the 512-token sequences (≈ 495 tokens each, checked with nvkit.data.prepare)
        text = text * (800 * 120 // len(text) + 1)  # the corpus is shorter than that: repeat it
        rows = [text[i:i + 120] for i in range(0, 800 * 120, 120)]
        memory.expect(None)
        run = nvkit.finetune(s, rows, max_steps=4, batch_size=4, seq_len=512, packing=True, compile=True)
        run.result()
        c = memory.last_comparison()
        assert c.what == "train" and c.estimate is not None
        _report("nvkit.finetune LoRA r=16, batch 4 × 512 (nvkit path)", c.estimate, c)
        assert abs(c.error) <= TOLERANCE
    finally:
        s.unload()


def test_sampler_overhead_on_decode():
    r = sampler_bench.overhead_benchmark("qwen3-0.6b", new_tokens=256, rounds=5, rate_hz=5)
    print(f"\nsampler overhead: {r['tok_s_without']:.1f} tok/s without, {r['tok_s_with']:.1f} with (5 Hz, "
          f"{r['path']} path): {r['difference']:+.2%}, rounds spread {r['noise']:.2%}; "
          f"{r['seconds_per_sample'] * 1e6:.0f} µs per sample")
    assert r["tok_s_without"] > 0 and r["tok_s_with"] > 0
