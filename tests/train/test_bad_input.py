"""Wrong values for every argument of nvkit.finetune and nvkit.launch: each is refused with an
NvkitError that names the argument, and the session still generates the same text afterwards."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train.launch import launch  # noqa: E402

FACT = "The H200 has 141 GB of fast memory."
DATA = [FACT] * 4
PROMPT = "The H200"


@pytest.fixture(scope="module")
def baseline(s):
    return s.generate(PROMPT, max_new_tokens=4)


def _still_generates(s, baseline):
    assert s.training is None or s.training.done
    assert not s.info["adapters"]  # nothing was attached
    assert s.generate(PROMPT, max_new_tokens=4) == baseline


FINETUNE_CASES = [
    (dict(data=None), "needs data"),
    (dict(data=123), "data must be a list"),
    (dict(data={"prompt": "a"}), "data must be a list"),
    (dict(data=[]), "empty"),
    (dict(data=["ok", 5]), "Example 1"),
    (dict(lora="r16"), "lora must be a dict"),
    (dict(lora={"r": 1.5}), "r must"),
    (dict(lora={"r": True}), "r must"),
    (dict(lora={"alpha": -1}), "alpha"),
    (dict(lora={"bias": "some"}), "bias"),
    (dict(lora={"use_dora": "yes"}), "use_dora"),
    (dict(lora={"target_modules": []}), "target_modules"),
    (dict(max_steps=0), "max_steps"),
    (dict(max_steps="10"), "max_steps"),
    (dict(max_steps=True), "max_steps"),
    (dict(max_steps=2.5), "max_steps"),
    (dict(max_steps=None, epochs=0), "epochs"),
    (dict(max_steps=None, epochs="1"), "epochs"),
    (dict(epochs=1), "not both"),
    (dict(learning_rate=1.5), "learning_rate"),
    (dict(learning_rate="1e-4"), "learning_rate"),
    (dict(learning_rate=True), "learning_rate"),
    (dict(batch_size=2.5), "batch_size"),
    (dict(grad_accum=0), "grad_accum"),
    (dict(seq_len="512"), "seq_len"),
    (dict(seq_len=4), "seq_len"),
    (dict(packing="yes"), "packing"),
    (dict(gradient_checkpointing="no"), "gradient_checkpointing"),
    (dict(output_dir=123), "output_dir"),
    (dict(output_dir=""), "output_dir"),
    (dict(liger="maybe"), "liger"),
    (dict(liger=1), "liger"),
    (dict(log_every=0), "log_every"),
    (dict(save_every=-5), "save_every"),
    (dict(compile="sometimes"), "compile"),
    (dict(compile=1), "compile"),
    (dict(seed="0"), "seed"),
    (dict(seed=-1), "seed"),
    (dict(steps=10), "did you mean 'max_steps'"),
    (dict(eval_split=0), "eval_split"),
    (dict(eval_split=1.5), "eval_split"),
    (dict(eval_split="0.1"), "eval_split"),
    (dict(eval_split=0.1, eval_data=DATA), "not both"),
    (dict(eval_split=0.9999), "leaves none to train on"),
    (dict(eval_data=[{"q": 1}]), "keys"),
    (dict(eval_every=5), "needs held-out data"),
    (dict(eval_split=0.25, eval_every=0), "eval_every"),
    (dict(stop_at_loss=1.0), "needs held-out data"),
    (dict(eval_split=0.25, stop_at_loss=-1), "stop_at_loss"),
    (dict(eval_split=0.25, stop_at_loss="low"), "stop_at_loss"),
    (dict(eval_split=0.25, patience=2), "eval_every"),
    (dict(eval_split=0.25, eval_every=1, patience=0), "patience"),
    (dict(resume=5), "resume must be"),
    (dict(resume="/no/such/checkpoint-3"), "No checkpoint folder"),
    (dict(lr=1e-4), "Unknown finetune setting"),
    (dict(precision="bf17"), "precision must be"),
    (dict(precision=16), "precision must be"),
    (dict(precision="bf16"), "CPU"),
    (dict(precision="fp16"), "CPU"),
]


@pytest.mark.parametrize("kwargs, match", FINETUNE_CASES, ids=[f"{list(k)[0]}={k[list(k)[0]]!r}" for k, _ in FINETUNE_CASES])
def test_finetune_bad_input(s, baseline, tmp_path, kwargs, match):
    kw = dict(data=DATA, max_steps=2, seq_len=64, output_dir=str(tmp_path / "out"))
    kw.update(kwargs)
    with pytest.raises(NvkitError, match=match):
        nvkit.finetune(s, **kw)
    _still_generates(s, baseline)
    assert not (tmp_path / "out").exists()  # a refused run leaves no folder behind


def test_finetune_refuses_what_is_not_a_session(s, baseline):
    for bad in ("demo", 42, s.model):
        with pytest.raises(NvkitError, match="session must be an nvkit.Session"):
            nvkit.finetune(bad, DATA, max_steps=1)
    _still_generates(s, baseline)


LAUNCH_CASES = [
    (dict(config="not a dict"), "config must be a dict"),
    (dict(strategy="zero4"), "strategy must be one of"),
    (dict(strategy="tp"), "Tensor-parallel training needs CUDA"),
    (dict(launcher="mpirun"), "launcher must be"),
    (dict(launcher="accelerate", nproc_per_node=2), "mpirun"),
    (dict(offload="gpu", strategy="zero3"), "offload must be"),
    (dict(offload="optimizer"), "goes with strategy='zero2' or 'zero3'"),
    (dict(offload="all", strategy="zero2"), "only ZeRO-3"),
    (dict(quantization="nf4", strategy="zero2"), "strategy='zero3'"),
    (dict(precision="bf17"), "precision must be"),
    (dict(precision="bf16"), "CPU"),
    (dict(attn_implementation=5), "attn_implementation"),
    (dict(attn_implementation="flash_attention_4"), "flash_attention_4"),
    (dict(dtype="int4"), "dtype must be"),
    (dict(kernels="yes"), "kernels must be"),
    (dict(kernels={"use_kernels": "yes"}), "kernels must be"),
    (dict(nproc_per_node=0), "nproc_per_node"),
    (dict(nproc_per_node=True), "nproc_per_node"),
    (dict(nproc_per_node="2"), "nproc_per_node"),
    (dict(nnodes=0), "nnodes"),
    (dict(nnodes=2), "rdzv_endpoint"),
    (dict(nnodes=2, rdzv_endpoint="host"), "rdzv_endpoint"),
    (dict(nnodes=2, rdzv_endpoint="h:1"), "node_rank"),
    (dict(nnodes=2, rdzv_endpoint="h:1", node_rank=2), "node_rank"),
    (dict(node_rank=1), "multi-node"),
    (dict(strategy="fsdp"), "fsdp"),
    (dict(start="yes"), "start"),
    (dict(turbo=True), "Unknown launch setting"),
    (dict(max_steps=0), "max_steps"),
    (dict(max_steps=None, epochs=-1), "epochs"),
    (dict(learning_rate=5), "learning_rate"),
    (dict(quantization="int3"), "quantization"),
    (dict(batch_size=0), "batch_size"),
    (dict(seq_len=4), "seq_len"),
    (dict(seed="x"), "seed"),
    (dict(log_every=0), "log_every"),
    (dict(gradient_checkpointing="no"), "gradient_checkpointing"),
    (dict(packing="yes"), "packing"),
    (dict(lora={"r": 0}), "r must"),
    (dict(data=None), "needs data"),
    (dict(data=[{"q": 1}]), "keys"),
    (dict(model="/no/such/model"), "not a checkpoint directory"),
    (dict(model=""), "model must be"),
]


@pytest.mark.parametrize("kwargs, match", LAUNCH_CASES, ids=[f"{list(k)[0]}={k[list(k)[0]]!r}" for k, _ in LAUNCH_CASES])
def test_launch_bad_input(s, baseline, path, tmp_path, kwargs, match):
    config = {"model": path, "data": DATA, "max_steps": 2, "seq_len": 64}
    kw = dict(gpus=[], run_dir=str(tmp_path / "run"), start=False)
    for key in list(kwargs):
        if key in ("data", "model", "max_steps", "epochs", "lora"):
            config[key] = kwargs.pop(key)
    if "config" in kwargs:
        config = kwargs.pop("config")
    kw.update(kwargs)
    with pytest.raises(NvkitError, match=match):
        launch(config, **kw)
    _still_generates(s, baseline)
    assert not (tmp_path / "run").exists()  # a refused launch leaves no folder behind


def test_launch_run_dir_that_is_a_file(s, baseline, path, tmp_path):
    f = tmp_path / "run"
    f.write_text("mine")
    with pytest.raises(NvkitError, match="is a file"):
        launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], run_dir=str(f), start=False)
    assert f.read_text() == "mine"
    _still_generates(s, baseline)
