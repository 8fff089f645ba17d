"""Every parallel strategy and launcher of nvkit.launch on ONE GPU (issue 41), so the plumbing (NCCL,
the DeepSpeed configs, FSDP2, the accelerate config, the tensor-parallel plan, the adapter saved
whole and loaded back) is proven on every GPU run, whatever machine is lent: DDP, FSDP2, ZeRO-2 with
optimizer offload, ZeRO-3 and tensor-parallel LoRA under torchrun, DDP and ZeRO-3 under accelerate,
each ≥ 10 LoRA steps on the Qwen3-0.6B shape (random weights) with a finite, falling loss and an
adapter that PEFT loads onto the base model and generates with; tensor-parallel generation equal to
one GPU's greedy text. Then the table (strategy, launcher, loss first -> last, steps/s, peak, wall),
printed and, where NVKIT_GPU_OUT names a file, written there as JSON; and ZeRO-3's speed against
the issue's target. tests/gpu/test_parallel_gpu.py is the same on two GPUs.

Run: HF_HUB_OFFLINE=1 python -m pytest tests/gpu/test_strategies_one_gpu.py -q -s -p no:cacheprovider
(DeepSpeed and a PEFT with the tensor-parallel hooks travel in .whl-ds: scripts/gpu_wheels_ds.sh).
"""

from __future__ import annotations

import json
import math
import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

import nvkit  # noqa: E402
from nvkit.train import strategies as st  # noqa: E402
from nvkit.units import fmt_bytes  # noqa: E402

DATA = [{"prompt": f"Question {i}: what is on GPU {i % 8}?", "response": f"GPU {i % 8} holds shard {i}."}
        for i in range(256)]
STEPS = 12
SETTINGS = {"data": DATA, "max_steps": STEPS, "batch_size": 8, "seq_len": 128, "learning_rate": 1e-3}
# issue 41's target for ZeRO-3 on this one-GPU run: steps/s, and its share of DDP's
ZERO3_MIN_RATE, ZERO3_MIN_SHARE = 1.5, 0.40

# (test id, strategy, launcher, offload, title in the table)
CASES = [
    ("ddp-torchrun", "ddp", "torchrun", None, "DDP"),
    ("fsdp-torchrun", "fsdp", "torchrun", None, "FSDP2"),
    ("zero2-offload-torchrun", "zero2", "torchrun", "optimizer", "ZeRO-2, optimizer offload"),
    ("zero3-torchrun", "zero3", "torchrun", None, "ZeRO-3"),
    ("ddp-accelerate", "ddp", "accelerate", None, "DDP"),
    ("zero3-accelerate", "zero3", "accelerate", None, "ZeRO-3"),
    ("tp-torchrun", "tp", "torchrun", None, "tensor parallel (LoRA)"),
]
_rows: dict[str, dict] = {}


@pytest.fixture(scope="module")
def shaped():
    return nvkit.demo.shaped("qwen3-0.6b")


def _adapter_generates(base: str, adapter_dir: str) -> None:
    """PEFT loads the saved adapter onto the base model whole (every LoRA matrix of the model from
    the file, as trained: not a rank's shard, not the zero start of lora_B) and generates with it."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16, device_map={"": 0})
    try:
        model = PeftModel.from_pretrained(model, adapter_dir)
        lora = {n: p for n, p in model.named_parameters() if ".lora_A." in n or ".lora_B." in n}
        assert lora and len(lora) == len(saved), (len(lora), len(saved))
        for name, p in lora.items():
            key = name.replace(".default.", ".")
            assert key in saved and saved[key].shape == p.shape, name
            assert torch.equal(saved[key].to(p.device, p.dtype), p.detach()), name
        assert any(bool(p.abs().max() > 0) for n, p in lora.items() if ".lora_B." in n)  # it trained
        tok = AutoTokenizer.from_pretrained(base)
        ids = tok("Question 3: what is on GPU 3?", return_tensors="pt").to("cuda:0")
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=4, do_sample=False)
        assert out.shape[1] > ids["input_ids"].shape[1]
    finally:
        del model
        torch.cuda.empty_cache()


def _row(title: str, launcher: str, loss: str, rate, peak, wall: float, **extra) -> dict:
    return {"strategy": title, "launcher": launcher, "loss": loss, "steps_per_s": rate, "peak_bytes": peak,
            "wall_s": round(wall, 1), **extra}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_strategy_trains_on_one_gpu(shaped, tmp_path, case):
    key, strategy, launcher, offload, title = case
    if strategy in ("zero2", "zero3"):
        why = st.deepspeed_problem()
        if why:
            pytest.skip(why)
    t0 = time.monotonic()
    run = nvkit.launch({"model": shaped, **SETTINGS}, nproc_per_node=1, strategy=strategy, launcher=launcher,
                       offload=offload, gpus=[0], run_dir=str(tmp_path / key))
    run.result(timeout=540)
    wall = time.monotonic() - t0
    print(run.command)
    print(run.text(10))
    assert run.returncode == 0 or run.ended_after_done, run.text(60)
    assert run.ranks == [0]
    setup = run.setup(0)
    assert setup["strategy"] == strategy and setup["device"] == "cuda" and setup["precision"] == "bf16", setup
    if strategy in ("fsdp", "zero3"):  # one decoder layer gathered at a time (ZeRO-3: zero3_settings)
        assert setup["unit"] == "Qwen3DecoderLayer", setup
    if launcher == "accelerate":
        assert "accelerate launch" in run.command
    losses = [r["loss"] for r in run.history if r.get("event") == "log" and r.get("rank") == 0]
    assert len(losses) >= 10, losses
    assert all(math.isfinite(x) for x in losses), losses
    assert sum(losses[-3:]) < sum(losses[:3]), losses  # falling
    sm = run.summary()
    assert sm["steps"] == STEPS and sm["adapter_dir"], sm
    _adapter_generates(shaped, run.adapter_dir)
    _rows[key] = _row(title, launcher, f"{losses[0]:.2f} → {losses[-1]:.2f}", sm["steps_per_s"],
                      max(sm["peak_memory"].values()) if sm["peak_memory"] else None, wall,
                      loss_first=losses[0], loss_last=losses[-1], steps=sm["steps"])


def test_tensor_parallel_generation_equals_one_gpu(tmp_path):
    prompts = ["NVIDIA GPUs are", "The H200 has", "Tensor parallelism"]
    demo = nvkit.demo.path()
    s = nvkit.load(demo, dtype="float32", device_map="cuda:0")
    try:
        one = [s.generate(p, max_new_tokens=16, do_sample=False) for p in prompts]
    finally:
        s.unload()
    t0 = time.monotonic()
    run = nvkit.launch_generate(prompts, model=demo, nproc_per_node=1, gpus=[0], max_new_tokens=16, dtype="float32",
                                run_dir=str(tmp_path / "tp-gen"))
    run.result(timeout=300)
    wall = time.monotonic() - t0
    print(run.command, run.texts, one)
    assert run.setup(0)["device"] == "cuda" and run.setup(0)["dtype"] == "float32"
    assert [t.strip() for t in run.texts] == [t.strip() for t in one]
    peaks = run.summary()["peak_memory"]
    _rows["tp-generate"] = _row("tensor parallel generation", "torchrun", "equals one GPU's greedy text", None,
                                max(peaks.values()) if peaks else None, wall)


def _fmt_rate(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "—"


def test_table():
    """The side-by-side table, in the issue's order; JSON to NVKIT_GPU_OUT for the docs."""
    if not _rows:
        pytest.skip("no strategy ran")
    order = [c[0] for c in CASES] + ["tp-generate"]
    rows = [dict(_rows[k], id=k) for k in order if k in _rows]
    gpu = torch.cuda.get_device_name(0)
    print(f"\n[gpu] every strategy on one {gpu} (nproc_per_node=1): LoRA on the Qwen3-0.6B shape, "
          f"{STEPS} steps, batch 8 × 128")
    print("| strategy | launcher | loss first → last | steps/s | peak | wall |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        peak = fmt_bytes(r["peak_bytes"]) if r["peak_bytes"] else "—"
        print(f"| {r['strategy']} | {r['launcher']} | {r['loss']} | {_fmt_rate(r['steps_per_s'])} | {peak} | "
              f"{r['wall_s']:.1f} s |")
    out = os.environ.get("NVKIT_GPU_OUT")
    if out:
        import importlib.metadata as md
        versions = {}
        for name in ("torch", "transformers", "peft", "accelerate", "deepspeed"):
            try:
                versions[name] = md.version(name)
            except md.PackageNotFoundError:
                versions[name] = None
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"gpu": gpu, "steps": STEPS, "batch": [8, 128], "model": "qwen3-0.6b shape",
                       "versions": versions, "rows": rows}, f, indent=2)
        print(f"[gpu] table written to {out}")
    for r in rows:  # a row is only worth printing when its run was healthy
        assert r["wall_s"] > 0 and (r["peak_bytes"] is None or r["peak_bytes"] > 0), r


def test_zero3_speed_against_ddp():
    """Issue 41's target: on this one-GPU run ZeRO-3 shards nothing, so what it costs beyond DDP is
    overhead; it must reach ZERO3_MIN_RATE steps/s and ZERO3_MIN_SHARE of DDP's rate."""
    ddp, zero3 = _rows.get("ddp-torchrun"), _rows.get("zero3-torchrun")
    if not ddp or not zero3:
        pytest.skip("needs the DDP and ZeRO-3 torchrun runs of this file (DeepSpeed missing, or deselected)")
    rate, base = zero3["steps_per_s"], ddp["steps_per_s"]
    assert rate and base, (zero3, ddp)
    print(f"[gpu] ZeRO-3 {rate:.2f} steps/s, DDP {base:.2f} steps/s: {rate / base:.0%} of DDP "
          f"(target ≥ {ZERO3_MIN_RATE} steps/s and ≥ {ZERO3_MIN_SHARE:.0%})")
    assert rate >= ZERO3_MIN_RATE and rate >= ZERO3_MIN_SHARE * base, (rate, base)
