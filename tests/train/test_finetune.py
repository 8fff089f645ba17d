"""nvkit.finetune on the CPU: a real LoRA run on a tiny Qwen3, stop, adapters, data checks, decisions."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import nvkit  # noqa: E402
from nvkit.train import data as D  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.model.precision import precision  # noqa: E402
from nvkit.train.finetune import liger_decision, save_atomic, training_arguments  # noqa: E402
from nvkit.train.loss import fused_linear_cross_entropy  # noqa: E402
from tests import demo_model  # noqa: E402

torch.set_num_threads(2)
FACT = "The H200 has 141 GB of fast memory."


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return demo_model.path()


@pytest.fixture
def s(path):
    sess = nvkit.load(path)
    yield sess
    sess.unload()


# --- decisions -----------------------------------------------------------------------------------

def test_precision_by_capability(monkeypatch):
    assert precision("cpu", None) == "fp32"
    assert precision("cuda", (8, 0)) == "bf16"
    assert precision("cuda", (9, 0)) == "bf16"
    assert precision("cuda", (7, 5)) == "fp16"  # Turing: is_bf16_supported() may say True (emulated)
    assert precision("cuda", (6, 1)) == "fp16"
    # the decision uses the capability, never is_bf16_supported
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (7, 0))
    assert precision("cuda", torch.cuda.get_device_capability(0)) == "fp16"


def test_training_arguments_fp32_on_cpu(tmp_path):
    args = training_arguments(str(tmp_path), "fp32", "cpu", max_steps=3, epochs=None, learning_rate=1e-3,
                              batch_size=2, grad_accum=1, log_every=1, seed=0, gradient_checkpointing=False,
                              fused_adamw=False)
    assert not args.bf16 and not args.fp16 and args.disable_tqdm and args.use_cpu


def test_activation_budget_applies_only_inside_and_when_compiling():
    import torch._functorch.config as fc
    before = fc.activation_memory_budget
    from nvkit.train.finetune import ACTIVATION_BUDGET, activation_budget
    with activation_budget(True):
        assert fc.activation_memory_budget == ACTIVATION_BUDGET < 1.0
    assert fc.activation_memory_budget == before
    with activation_budget(False):
        assert fc.activation_memory_budget == before


def test_liger_decision():
    assert liger_decision("auto", "cpu", "qwen3")[0] is False
    assert "CPU" in liger_decision("auto", "cpu", "qwen3")[1]
    assert liger_decision(False, "cuda", "qwen3") == (False, "off (liger=False)")
    with pytest.raises(NvkitError, match="liger=True"):
        liger_decision(True, "cpu", "qwen3")
    with pytest.raises(NvkitError):
        liger_decision("yes", "cuda", "qwen3")


def test_fused_cross_entropy_matches_torch():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    y = torch.randint(0, 50, (37,))
    y[::5] = -100
    loss = fused_linear_cross_entropy(h, w, y, chunk=8)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = torch.nn.functional.cross_entropy(h @ w.t(), y, ignore_index=-100)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)


def test_fused_cross_entropy_asks_python_for_no_tensor_value(monkeypatch):
    # chunks with no targets give the loss and gradients of the rows that have them, and nothing
    # inside the loss reads a tensor's value into Python: on CUDA each read stalls the step's launches
    torch.manual_seed(1)
    h = torch.randn(40, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    y = torch.randint(0, 50, (40,))
    y[:16] = -100  # the first two chunks of 8 carry no target
    y[3] = -100
    reads = []
    for name in ("item", "__bool__", "__int__", "__float__", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, _n=name: reads.append(_n) or _real(self, *a))
    loss = fused_linear_cross_entropy(h, w, y, chunk=8)
    assert reads == [], reads
    monkeypatch.undo()
    loss.backward()
    keep = y != -100
    ref_h = h.detach()[keep].clone().requires_grad_(True)
    ref_w = w.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(ref_h @ ref_w.t(), y[keep])
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5) and (h.grad[~keep] == 0).all()
    assert torch.allclose(h.grad[keep], ref_h.grad, atol=1e-5) and torch.allclose(w.grad, ref_w.grad, atol=1e-5)
    y_none = torch.full((40,), -100)
    assert float(fused_linear_cross_entropy(h.detach(), w.detach(), y_none, chunk=8)) == 0.0


# --- data ------------------------------------------------------------------------------------------

def test_data_kinds_and_masks(s):
    tok = s.tokenizer
    rows, kind = D.tokenize([{"prompt": "Hi there", "response": "Hello!"}], tok, 64)
    assert kind == "prompt-response"
    labels = rows[0].labels
    assert labels[0] == D.IGNORE and labels[-1] != D.IGNORE  # loss on the response only
    n_target = sum(1 for t in labels if t != D.IGNORE)
    assert 0 < n_target < len(labels)
    chat = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                          {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you."}]}]
    rows, kind = D.tokenize(chat, tok, 128)
    assert kind == "chat"
    target = tok.decode([t for t in rows[0].labels if t != D.IGNORE])
    assert "Hello." in target and "See you." in target and "Bye" not in target
    rows, kind = D.tokenize(["one", {"text": "two"}], tok, 64)
    assert kind == "text" and rows[0].labels == rows[0].input_ids
    packed = D.pack(D.tokenize(["a b c"] * 10, tok, 64)[0], 16)
    assert len(packed) < 10 and all(len(p) <= 16 for p in packed)


def test_data_files(s, tmp_path):
    tok = s.tokenizer
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c", "response": "d"}\n')
    (tmp_path / "d.csv").write_text("prompt,response\na,b\nc,d\n")
    (tmp_path / "d.txt").write_text("first paragraph\nstill first\n\nsecond\n")
    assert len(D.tokenize(str(tmp_path / "d.jsonl"), tok, 64)[0]) == 2
    assert D.tokenize(str(tmp_path / "d.csv"), tok, 64)[1] == "prompt-response"
    assert len(D.tokenize(str(tmp_path / "d.txt"), tok, 64)[0]) == 2
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "response": "b"}\n{oops\n')
    with pytest.raises(NvkitError, match="line 2"):
        D.tokenize(str(tmp_path / "bad.jsonl"), tok, 64)
    with pytest.raises(NvkitError, match="not found"):
        D.tokenize(str(tmp_path / "missing.jsonl"), tok, 64)
    (tmp_path / "d.parquet").write_text("x")
    with pytest.raises(NvkitError, match="Unsupported"):
        D.tokenize(str(tmp_path / "d.parquet"), tok, 64)


@pytest.mark.parametrize("bad, match", [
    ([], "empty"),
    ([{"question": "a", "answer": "b"}], "keys"),
    ([{"prompt": "a"}], "keys"),
    ([{"prompt": "a", "response": ""}], "empty"),
    ([{"prompt": "a", "response": 3}], "must be a string"),
    (["fine", {"prompt": "a", "response": "b"}], "one kind"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], "no assistant"),
    ([{"messages": [{"role": "robot", "content": "hi"}]}], "role"),
    ([42], "Example 0"),
    (["word " * 200], "longer than seq_len"),
    ("not/a/file.jsonl", "not found"),
    ({"prompt": "a"}, "list of examples"),
])
def test_bad_data_fails_before_training(s, bad, match):
    before = s.generate("The H200", max_new_tokens=3)
    with pytest.raises(NvkitError, match=match):
        nvkit.finetune(s, bad, max_steps=2, seq_len=64)
    assert getattr(s, "_finetune", None) is None  # nothing started
    assert s.generate("The H200", max_new_tokens=3) == before  # still usable, model untouched


@pytest.mark.parametrize("kwargs, match", [
    (dict(lora={"r": 0}), "r must"),
    (dict(lora={"rank": 8}), "Unknown LoRA"),
    (dict(lora={"dropout": 1.5}), "dropout"),
    (dict(lora={"target_modules": 5}), "target_modules"),
    (dict(learning_rate=0), "learning_rate"),
    (dict(batch_size=0), "batch_size"),
    (dict(max_steps=-1), "max_steps"),
    (dict(max_steps=2, epochs=1), "not both"),
    (dict(seq_len=2), "seq_len"),
    (dict(liger="maybe"), "liger"),
    (dict(compile="sometimes"), "compile"),
    (dict(packing="yes"), "packing"),
])
def test_bad_settings(s, kwargs, match):
    kw = dict(max_steps=2, seq_len=64)
    kw.update(kwargs)
    with pytest.raises(NvkitError, match=match):
        nvkit.finetune(s, [FACT], **kw)


def test_bad_target_modules_error_is_clear(s, tmp_path):
    run = nvkit.finetune(s, [FACT], lora={"target_modules": ["no_such_proj"]}, max_steps=1, seq_len=64,
                         output_dir=str(tmp_path / "x"))
    with pytest.raises(NvkitError, match="target_modules"):
        run.result(timeout=120)
    assert s.generate("The H200", max_new_tokens=3)  # still usable


# --- a real run ----------------------------------------------------------------------------------

def test_lora_run_learns_saves_and_reloads(s, path, tmp_path):
    prompt = "The H200 has"
    before = s.generate(prompt, max_new_tokens=8)
    seen = []
    events_before = len(nvkit.events.events())
    run = nvkit.finetune(s, [FACT] * 16, max_steps=25, batch_size=8, seq_len=64, learning_rate=1e-2,
                         output_dir=str(tmp_path / "run"), packing=False, save_every=20)
    run.subscribe(seen.append)
    assert isinstance(run, nvkit.FinetuneRun)
    run.result(timeout=600)
    assert run.done and not run.stopped and run.error is None
    h = run.history
    assert len(h) == 25 and [r["step"] for r in h] == list(range(1, 26))
    assert set(h[0]) >= {"step", "loss", "learning_rate", "grad_norm", "tokens_per_s", "memory"}
    assert h[-1]["loss"] < h[0]["loss"] - 0.5, [r["loss"] for r in h]
    assert all(r["tokens_per_s"] > 0 and r["memory"] > 0 for r in h)
    assert len(seen) >= 1
    assert run.info["precision"] == "fp32" and run.info["compile"] is False
    assert run.info["loss"].startswith("fused")
    # the run's own prediction (nvkit path: fused loss) was drawn beside its measured peak
    from nvkit import memory
    train = [c for c in memory.comparisons(frame=False) if c.what == "train"][-1]
    assert train.estimate is not None and train.estimate.mode == "lora" and "fused loss" in train.estimate.formulas["logits"]
    # drawn for the batches these rows make: one short fact (plus EOS) padded to 8, not seq_len=64
    from nvkit.train.data import tokenize
    fact_len = len(tokenize([FACT], s.tokenizer, 64)[0][0])
    assert train.estimate.batch_size == 8 and train.estimate.seq_len == -(-fact_len // 8) * 8 < 64
    assert train.measured > 0
    assert run.progress["step"] == 25 and run.progress["eta_s"] is None
    sm = run.summary()
    assert sm["adapter_dir"] == run.adapter_dir and sm["tokens"] > 0
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert os.path.isfile(os.path.join(run.adapter_dir, name))
    assert os.path.isfile(os.path.join(str(tmp_path / "run"), "checkpoint-20", "adapter_config.json"))
    assert not [n for n in os.listdir(tmp_path / "run") if n.startswith(".")]  # no temp dirs left
    kinds = {e.kind for e in nvkit.events.events()[events_before:]}
    assert {"train-step", "checkpoint", "train-start", "train-end"} <= kinds

    after = s.generate(prompt, max_new_tokens=8)  # the session generates with the adapter
    assert after != before
    assert s.info["adapters"]

    # reload into a fresh session, merge, unload
    s2 = nvkit.load(path)
    assert s2.generate(prompt, max_new_tokens=8) == before
    assert s2.load_adapter(run.adapter_dir) == "default"
    assert s2.generate(prompt, max_new_tokens=8) == after
    with pytest.raises(NvkitError, match="already"):
        s2.load_adapter(run.adapter_dir, name="default")
    s2.merge_adapter()
    assert s2.generate(prompt, max_new_tokens=8) == after
    with pytest.raises(NvkitError, match="no adapter"):
        s2.merge_adapter()
    s3 = nvkit.load(path)
    s3.load_adapter(run.adapter_dir)
    s3.unload_adapter()
    assert s3.generate(prompt, max_new_tokens=8) == before
    with pytest.raises(NvkitError, match="no adapter"):
        s3.unload_adapter()
    s3.unload()


def test_stop_mid_run_leaves_valid_adapter(s, path, tmp_path):
    run = nvkit.finetune(s, [FACT] * 64, max_steps=400, batch_size=4, seq_len=64, output_dir=str(tmp_path / "r"))
    deadline = time.monotonic() + 120
    while len(run.history) < 2 and time.monotonic() < deadline and not run.done:
        time.sleep(0.05)
    with pytest.raises(NvkitError, match="fine-tune is training"):
        s.generate("x", max_new_tokens=2)
    with pytest.raises(NvkitError, match="already running"):
        nvkit.finetune(s, [FACT], max_steps=1, seq_len=64)
    run.stop()
    asyncio.run(run.wait())  # the awaitable form
    assert run.stopped and 2 <= run.step < 400
    assert run.progress["step"] == run.step
    s2 = nvkit.load(path)
    s2.load_adapter(run.adapter_dir)
    assert isinstance(s2.generate("The H200", max_new_tokens=3), str)
    s2.unload()


def test_save_atomic_keeps_old_adapter_on_failure(tmp_path):
    class Good:
        def save_pretrained(self, d):
            with open(os.path.join(d, "adapter_config.json"), "w") as f:
                f.write("{}")

    class Broken:
        def save_pretrained(self, d):
            with open(os.path.join(d, "adapter_config.json"), "w") as f:
                f.write("{half")
            raise OSError("disk full")

    target = tmp_path / "adapter"
    save_atomic(Good(), str(target))
    with pytest.raises(OSError):
        save_atomic(Broken(), str(target))
    assert json.loads((target / "adapter_config.json").read_text()) == {}
    assert sorted(os.listdir(tmp_path)) == ["adapter"]


def test_load_adapter_bad_dirs(s, tmp_path):
    with pytest.raises(NvkitError, match="No adapter directory"):
        s.load_adapter(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(NvkitError, match="adapter_config.json"):
        s.load_adapter(str(tmp_path / "empty"))
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "adapter_config.json").write_text("{}")
    with pytest.raises(NvkitError, match="no adapter weights"):
        s.load_adapter(str(tmp_path / "noweights"))
    with pytest.raises(NvkitError):
        s.load_adapter(123)
    assert s.generate("The H200", max_new_tokens=3)


def test_magic_finetune(s, tmp_path, capsys):
    from nvkit.magics import run_line
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": "Q", "response": "A fact."}) for _ in range(8)))
    run_line(f"finetune {f} --steps 3 --r 4 --lr 1e-3 --batch-size 4 --seq-len 64 --output-dir {tmp_path / 'm'}")
    out = capsys.readouterr().out
    assert "Done: 3 steps" in out and str(tmp_path / "m") in out
    with pytest.raises(NvkitError, match="needs data"):
        run_line("finetune --steps 3")


def test_bench_lora_cpu(path):
    from nvkit.benchmarks.lora import run
    df = run(model=path, batch_size=2, seq_len=32, steps=2, warmup=1, variants=["nvkit"], device="cpu")
    assert list(df.index) == ["plain", "nvkit"]
    assert (df["tokens_per_s"] > 0).all() and df.loc["plain", "speed_vs_plain"] == 1.0
    with pytest.raises(NvkitError, match="variant"):
        run(model=path, variants=["turbo"], device="cpu")
    with pytest.raises(NvkitError, match="steps"):
        run(model=path, steps=0, device="cpu")


def test_a_module_swap_is_undone_exactly(s):
    """``nvkit.finetune`` swaps RMSNorms and MLP forwards for Liger's (CUDA only) during a run and
    undoes the swap at its end; the swap machinery with torch's own RMSNorm on the CPU: every norm
    and MLP swapped, then the very same modules back, weights changed in between copied back, and
    the model's output as before."""
    from nvkit.train.lora import swap_norms_and_mlps
    model = s.model
    ids = s.tokenizer(FACT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = model(ids).logits
    modules = dict(model.named_modules())
    norms = {n for n, m in modules.items() if type(m).__name__.endswith("RMSNorm")}
    mlps = {n for n, m in modules.items() if type(m).__name__.endswith("MLP")}
    assert norms and mlps

    def norm(module):
        new = torch.nn.RMSNorm(module.weight.shape[0], eps=module.variance_epsilon, dtype=module.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(module.weight)
        return new

    def forward(self, x):  # the same arithmetic as the model's MLP, through another function
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    swap = swap_norms_and_mlps(model, norm, forward)
    assert swap.count == len(norms) + len(mlps)
    swapped = dict(model.named_modules())
    assert all(isinstance(swapped[n], torch.nn.RMSNorm) for n in norms)
    assert all("forward" in swapped[n].__dict__ for n in mlps)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, before, atol=1e-4)
        first = sorted(norms)[0]
        swapped[first].weight.mul_(2.0)  # a change made while swapped (trained norms) survives the undo
    swap.undo()
    back = dict(model.named_modules())
    assert all(back[n] is modules[n] for n in norms | mlps) and swap.count == 0
    assert not any("forward" in back[n].__dict__ for n in mlps)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, before)
        back[first].weight.div_(2.0)
        assert torch.equal(model(ids).logits, before)
    swap.undo()  # a second undo changes nothing
    assert dict(model.named_modules())[first] is modules[first]


# --- one estimate per run ----------------------------------------------------------------------

def test_run_estimate_is_the_runs_own_prediction(s, tmp_path):
    """``run_estimate`` with a run's data and settings gives the estimate the run starts with (the
    one its comparison sets beside the measured peak): the batches its rows make, not seq_len; the
    same from a file as from the list; bad settings are refused."""
    from nvkit import memory
    from nvkit.train.finetune import run_estimate
    data = [{"prompt": f"Question {i}?", "response": FACT} for i in range(6)]
    kw = dict(max_steps=1, batch_size=4, seq_len=256, lora={"r": 8, "dropout": 0.1})
    before = run_estimate(s, data, **kw)
    # the rows are a few dozen tokens: the estimate is of those batches, far below 4 × 256
    assert before.batch_size == 4 and before.seq_len < 64 and before.device == "cpu"
    f = tmp_path / "data.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in data))
    assert run_estimate(s, str(f), **kw).parts == before.parts
    run = nvkit.finetune(s, data, output_dir=str(tmp_path / "run"), **kw)
    run.result(timeout=300)
    assert run.estimate is not None and run.estimate.parts == before.parts
    c = [c for c in memory.comparisons(frame=False) if c.what == "train"][-1]
    assert c.estimate is run.estimate and c.predicted == before.total
    with pytest.raises(NvkitError, match="batch_size"):
        run_estimate(s, data, batch_size=0)
    with pytest.raises(NvkitError, match="data"):
        run_estimate(s, None)
