"""The parallel strategies of nvkit.launch on the CPU: what each writes (config, DeepSpeed and
accelerate files, the line), which combinations are refused and why, the per-GPU estimates, the
session's settings carried into a run, and real gloo runs: DeepSpeed ZeRO-2 and ZeRO-3 through
Trainer on two ranks, accelerate as the launcher, tensor-parallel generation on two ranks (same
greedy text as one process) and the tensor-parallel LoRA preparation on two ranks."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train import strategies as st  # noqa: E402
from nvkit.train.launch import launch, launch_generate  # noqa: E402
from tests import demo_model  # noqa: E402

DATA = ["NVIDIA GPUs are fast.", "The H200 has 141 GB of memory."] * 8
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return demo_model.path()


def _cfg(path, **kw):
    return {"model": path, "data": DATA, "max_steps": 3, "batch_size": 4, "seq_len": 64, **kw}


# --- what a run folder holds -------------------------------------------------------------------

@pytest.mark.parametrize("strategy, offload", [("ddp", None), ("zero2", "optimizer"), ("zero3", None), ("zero3", "all")])
def test_written_config_per_strategy(path, tmp_path, strategy, offload):
    run = launch(_cfg(path), nproc_per_node=2, strategy=strategy, offload=offload, gpus=[],
                 run_dir=str(tmp_path / "r"), start=False)
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["strategy"] == strategy and cfg["offload"] == offload and cfg["launcher"] == "torchrun"
    assert cfg["mode"] == "train" and cfg["precision"] == "fp32"  # the CPU trains in fp32
    assert run.strategy == strategy and "torchrun" in run.command and "--nproc_per_node=2" in run.command
    assert not (tmp_path / "r" / "accelerate.yaml").exists()
    if strategy == "zero3":
        assert any("own loss" in n for n in run.notes)


def test_deepspeed_config_is_one_deepspeed_accepts(tmp_path):
    """The config Trainer gets, filled the way Trainer fills its "auto" values, parses in DeepSpeed
    itself (pydantic-strict: an unknown or misspelt key would be refused)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig
    for strategy, offload in (("zero2", None), ("zero2", "optimizer"), ("zero3", None), ("zero3", "all")):
        cfg = st.deepspeed_config(strategy, offload, cuda=False)
        assert cfg["zero_optimization"]["stage"] == (2 if strategy == "zero2" else 3)
        assert cfg["zero_force_ds_cpu_optimizer"] is False  # no compiled CPU Adam needed
        filled = json.loads(json.dumps(cfg))
        filled.update(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1, train_batch_size=4,
                      gradient_clipping=1.0, bf16={"enabled": False}, fp16={"enabled": False})
        ds = DeepSpeedConfig(filled)
        assert ds.zero_optimization_stage == cfg["zero_optimization"]["stage"]
        assert ds.zero_config.offload_optimizer is None or offload is not None
        if offload == "all":
            assert ds.zero_config.offload_param is not None
        if strategy == "zero3":
            assert ds.zero_config.gather_16bit_weights_on_model_save


def test_accelerate_files_and_line(path, tmp_path):
    run = launch(_cfg(path), nproc_per_node=1, launcher="accelerate", gpus=[], run_dir=str(tmp_path / "a"), start=False)
    words = shlex.split(run.command)
    assert words[words.index("accelerate") + 1] == "launch"
    cfg_file = str(tmp_path / "a" / "accelerate.yaml")
    assert f"--config_file={cfg_file}" in words and "--module" in words and "--num_processes=1" in words
    assert words[-2:] == ["nvkit.train.worker", str(tmp_path / "a")]
    assert run._argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    # accelerate reads the file nvkit wrote
    from accelerate.commands.config.config_args import load_config_from_file
    loaded = load_config_from_file(cfg_file)
    assert loaded.num_processes == 1 and loaded.use_cpu and str(loaded.distributed_type).endswith("NO")
    yaml_gpu = st.accelerate_config(2, "cuda", "bf16")
    assert "distributed_type: 'MULTI_GPU'" in yaml_gpu and "mixed_precision: 'bf16'" in yaml_gpu


def test_strategy_checks_on_gpus():
    """The combinations refused on a GPU machine, each naming what is wrong (pure logic, no CUDA)."""
    from transformers import AutoConfig
    demo = AutoConfig.from_pretrained(nvkit.demo.path())  # 4 heads, 2 KV heads, a TP plan
    assert st.check("fsdp", device="cuda", nproc=2) == []
    notes = st.check("fsdp", device="cuda", nproc=2, quantization="nf4")
    assert any("bnb_4bit_quant_storage" in n for n in notes)
    assert any("same batches" in n for n in st.check("tp", device="cuda", nproc=2, config=demo))
    st.check("tp", device="cpu", nproc=2, mode="generate", config=demo)  # generation runs on the CPU
    cases = [
        (dict(strategy="tp", device="cuda", nproc=3, config=demo), "do not divide"),
        (dict(strategy="tp", device="cuda", nproc=2, quantization="nf4", config=demo), "cannot be cut"),
        (dict(strategy="tp", device="cpu", nproc=2, config=demo), "needs CUDA"),
        (dict(strategy="ddp", device="cuda", nproc=2, mode="generate"), "tensor parallel"),
        (dict(strategy="fsdp", device="cpu", nproc=2), "needs CUDA"),
        (dict(strategy="zero2", device="cuda", nproc=2, quantization="nf4"), "zero3"),
        (dict(strategy="fsdp", device="cuda", nproc=2, offload="optimizer"), "zero2"),
        (dict(strategy="zero2", device="cuda", nproc=2, offload="all"), "ZeRO-3"),
        (dict(strategy="ddp", device="cpu", nproc=2, launcher="accelerate"), "mpirun"),
        (dict(strategy="pp", device="cuda", nproc=2), "strategy must be one of"),
    ]
    for kw, match in cases:
        with pytest.raises(NvkitError, match=match):
            st.check(kw.pop("strategy"), **kw)
    no_plan = AutoConfig.for_model("gpt2", n_layer=2, n_embd=64, n_head=2)
    with pytest.raises(NvkitError, match="no tensor-parallel plan"):
        st.check("tp", device="cuda", nproc=2, config=no_plan)


def test_missing_deepspeed_says_how_to_install():
    code = ("import sys; sys.modules['deepspeed'] = None\n"
            "from nvkit.train import strategies as st\n"
            "from nvkit.errors import NvkitError\n"
            "try:\n    st.check('zero3', device='cuda', nproc=2)\nexcept NvkitError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "pip install 'nvkit[deepspeed]'" in out.stdout, out.stderr


def test_per_gpu_estimates_split_the_model():
    kw = dict(batch_size=8, seq_len=512)
    one = nvkit.estimate("qwen3-0.6b", mode="lora", path="nvkit", compiled=False, **kw)
    ddp = st.per_gpu_estimate("qwen3-0.6b", "ddp", 2, **kw)
    fsdp = st.per_gpu_estimate("qwen3-0.6b", "fsdp", 2, **kw)
    z2 = st.per_gpu_estimate("qwen3-0.6b", "zero2", 2, offload="optimizer", **kw)
    z3 = st.per_gpu_estimate("qwen3-0.6b", "zero3", 4, offload="all", **kw)
    tp = st.per_gpu_estimate("qwen3-0.6b", "tp", 2, **kw)
    assert ddp.total > one.total and ddp.parts["weights"] == one.parts["weights"]
    assert fsdp.parts["weights"] < one.parts["weights"] and fsdp.parts["AdamW states"] * 2 <= one.parts["AdamW states"]
    assert z2.parts["weights"] == one.parts["weights"] and z2.parts["AdamW states"] == 0
    assert z3.parts["weights"] < fsdp.parts["weights"] and "offload" in z3.formulas["weights"]
    assert tp.parts["weights"] < one.parts["weights"] and tp.parts["activations"] < one.parts["activations"]
    budget = ddp.total - 1  # DDP just does not fit, FSDP2 (sharded weights and state) does
    rows = st.compare("qwen3-0.6b", 2, budget, **kw)
    assert [r["strategy"] for r in rows] == list(st.STRATEGIES)
    assert all(r["estimate"] is not None for r in rows)
    fits = {r["strategy"]: r["fits"] for r in rows}
    assert fits["ddp"] is False and fits["fsdp"] is True
    assert st.advice(rows, budget).startswith("Too big for one GPU with DDP") and "FSDP2" in st.advice(rows, budget)
    assert "fits one GPU" in st.advice(st.compare("qwen3-0.6b", 2, 10 * ddp.total, **kw), 10 * ddp.total)
    with pytest.raises(NvkitError, match="nproc"):
        st.per_gpu_estimate("demo", "ddp", 0)
    with pytest.raises(NvkitError, match="strategy must be one of"):
        st.per_gpu_estimate("demo", "megatron", 2)


# --- the session's settings --------------------------------------------------------------------

def test_session_settings_carry_into_the_run(path, tmp_path):
    s = nvkit.load(path, attn_implementation="eager")
    try:
        run = launch({"data": DATA, "max_steps": 2, "seq_len": 64}, gpus=[], run_dir=str(tmp_path / "s"), start=False)
        cfg = json.loads((tmp_path / "s" / "config.json").read_text())
        assert cfg["model"] == s.path and cfg["attn_implementation"] == "eager" and cfg["dtype"] == "float32"
        assert cfg["quantization"] is None and "kernels" not in cfg
        # a setting given explicitly wins over the session's
        launch({"data": DATA, "max_steps": 2, "seq_len": 64, "attn_implementation": "sdpa"}, gpus=[],
               run_dir=str(tmp_path / "t"), start=False)
        assert json.loads((tmp_path / "t" / "config.json").read_text())["attn_implementation"] == "sdpa"
        assert run.mode == "train"
    finally:
        s.unload()


def test_session_kernels_carry_into_the_run(path, tmp_path):
    from nvkit.model.kernels import local_kernel_config
    kdir = os.path.join(ROOT, "tests", "data", "kernels", "nvkit-rmsnorm")
    s = nvkit.load(path, use_kernels=True, kernel_config=local_kernel_config(kdir, device="cpu"))
    try:
        assert s.kernels and s.kernels["request"]["use_kernels"] is True
        launch({"data": DATA, "max_steps": 2, "seq_len": 64}, gpus=[], run_dir=str(tmp_path / "k"), start=False)
        cfg = json.loads((tmp_path / "k" / "config.json").read_text())
        assert cfg["kernels"]["kernel_config"]["RMSNorm"]["cpu"].endswith(":RMSNorm")
    finally:
        s.unload()


def test_qlora_session_carries_and_is_refused_where_it_cannot_run(path, tmp_path):
    s = nvkit.load(path, quantization="nf4")
    try:
        launch({"data": DATA, "max_steps": 2, "seq_len": 64}, gpus=[], run_dir=str(tmp_path / "q"), start=False)
        cfg = json.loads((tmp_path / "q" / "config.json").read_text())
        assert cfg["quantization"] == "nf4" and "dtype" not in cfg
        with pytest.raises(NvkitError, match="zero3"):
            launch({"data": DATA, "max_steps": 2}, strategy="zero2", gpus=[], run_dir=str(tmp_path / "q2"), start=False)
        with pytest.raises(NvkitError, match="cannot cut"):
            launch_generate("NVIDIA GPUs are", gpus=[], nproc_per_node=2, run_dir=str(tmp_path / "g"), start=False)
        assert not (tmp_path / "q2").exists() and not (tmp_path / "g").exists()
        assert s.generate("The H200", max_new_tokens=2)
    finally:
        s.unload()


def test_launch_generate_bad_input(path, tmp_path):
    for kw, match in ((dict(prompts=[]), "prompts"), (dict(prompts=[""]), "prompts"), (dict(prompts=5), "prompts"),
                      (dict(max_new_tokens=0), "max_new_tokens"), (dict(do_sample="no"), "do_sample"),
                      (dict(seed=-1), "seed"), (dict(temperature=0.5), "Unknown launch_generate"),
                      (dict(launcher="mpirun"), "launcher"), (dict(nproc_per_node=3), "do not divide")):
        args = dict(prompts=["NVIDIA GPUs are"], model=path, nproc_per_node=2, gpus=[], run_dir=str(tmp_path / "x"),
                    start=False)
        args.update(kw)
        with pytest.raises(NvkitError, match=match):
            launch_generate(**args)
        assert not (tmp_path / "x").exists()


# --- real runs on the CPU (gloo) -----------------------------------------------------------------

def _finished(run):
    run.result(timeout=600)
    assert run.returncode == 0 or run.ended_after_done, run.text(40)
    return run


@pytest.mark.parametrize("strategy, offload", [("zero2", "optimizer"), ("zero3", None)])
def test_deepspeed_zero_on_two_cpu_ranks(path, tmp_path, strategy, offload):
    pytest.importorskip("deepspeed")
    run = _finished(launch(_cfg(path), nproc_per_node=2, strategy=strategy, offload=offload, gpus=[],
                           run_dir=str(tmp_path / strategy)))
    assert run.ranks == [0, 1]
    assert run.setup(0)["strategy"] == strategy and run.setup(1)["precision"] == "fp32"
    # ZeRO-3 gathers a whole decoder layer at a time (strategies.zero3_settings), ZeRO-2 gathers nothing
    assert run.setup(0)["unit"] == ("Qwen3DecoderLayer" if strategy == "zero3" else None)
    logs = {(r["rank"], r["step"]): r["loss"] for r in run.history if r.get("event") == "log"}
    assert sorted(logs) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert logs[(0, 3)] == pytest.approx(logs[(1, 3)], rel=1e-4)  # one reduced loss on both ranks
    sm = run.summary()
    assert sm["steps"] == 3 and sm["final_loss"] > 0 and set(sm["peak_memory"]) == {0, 1}
    # the adapter is whole (gathered from the shards) and fits the model
    s = nvkit.load(path)
    try:
        s.load_adapter(run.adapter_dir)
    finally:
        s.unload()


def test_accelerate_launcher_runs_for_real(path, tmp_path):
    run = _finished(launch(_cfg(path), nproc_per_node=1, launcher="accelerate", gpus=[], run_dir=str(tmp_path / "acc")))
    assert run.launcher == "accelerate" and run.ranks == [0]
    assert [r["step"] for r in run.history if r.get("event") == "log"] == [1, 2, 3]
    assert all(r["tokens_per_s"] > 0 for r in run.history if r.get("event") == "step")
    assert os.path.isfile(os.path.join(run.adapter_dir, "adapter_model.safetensors"))


def test_tensor_parallel_generation_matches_one_process(path, tmp_path):
    prompts = ["NVIDIA GPUs are", "The H200 has"]
    run = _finished(launch_generate(prompts, model=path, nproc_per_node=2, gpus=[], max_new_tokens=8,
                                    run_dir=str(tmp_path / "tp")))
    assert run.ranks == [0, 1] and run.mode == "generate" and len(run.texts) == 2
    s = nvkit.load(path, dtype="float32")
    try:
        one = [s.generate(p, max_new_tokens=8, do_sample=False) for p in prompts]
    finally:
        s.unload()
    assert [t.strip() for t in run.texts] == [t.strip() for t in one]
    gen = [r for r in run.history if r.get("event") == "generated"]
    assert {r["rank"] for r in gen} == {0, 1} and all(r["new_tokens"] > 0 for r in gen)


def test_tensor_parallel_lora_preparation_on_two_ranks(path, tmp_path):
    """nvkit's TP model preparation (the worker's own load and the row-wise fix) trains and saves a
    whole adapter that loads into the plain model."""
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        os.path.join(ROOT, "tests", "train", "tp_lora_ranks.py"), path, str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    # every row-wise layer's A takes its global input width once prepared (fix_tp_lora, or PEFT itself)
    assert r0["sharded"] == "DTensor" and r0["rowwise"] > 0 and r0["mismatched"] == 0 and r0["foreach"] is False
    assert r0["losses"] == pytest.approx(r1["losses"], rel=1e-5)
    assert min(r0["losses"][-3:]) < r0["losses"][0]
    s = nvkit.load(path)
    try:
        s.load_adapter(str(tmp_path / "adapter-0"))
        assert s.generate("The H200", max_new_tokens=2)
    finally:
        s.unload()


def test_a_cuda_launch_starts_no_more_processes_than_gpus_are_chosen():
    st.check_processes(2, 2)
    st.check_processes(1, 4)
    with pytest.raises(NvkitError, match=r"nproc_per_node=2 starts one process per GPU, but 1 GPU\(s\).*gpus=\[\]"):
        st.check_processes(2, 1)
    with pytest.raises(NvkitError, match="nproc_per_node=0"):
        st.check_processes(1, 0)
