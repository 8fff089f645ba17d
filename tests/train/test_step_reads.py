"""A training step of ``nvkit.finetune`` reads no more tensor values into Python than a step of
plain PEFT + Trainer does. On CUDA each such read (``.item()``, ``bool()``, ``int()`` of a tensor)
makes the CPU wait for the GPU before it queues the rest of the step; a LoRA step in eager mode is
bound by those launches, so every extra read costs wall time that no kernel shows. On the CPU the
reads are counted the same way, at the Python boundary, for the same steps of both paths.
"""

from __future__ import annotations

import collections

import torch

from nvkit.benchmarks.lora import _plain_wall
from nvkit.train import data as train_data
from nvkit.train.finetune import finetune
from nvkit.train.trainer import trainer_class

READS = ("item", "__bool__", "__int__", "__float__", "tolist")
FIRST, LAST = 2, 6  # the steps counted: after the first ones, which build things once
TEXT = "NVIDIA GPUs train LoRA adapters on short runs and long runs alike. " * 4
LORA = dict(r=8, alpha=16, dropout=0.0, target_modules="all-linear")


def _count_step_reads(monkeypatch, train) -> collections.Counter:
    """Run ``train()`` and count, by method, the tensor reads made during steps FIRST..LAST."""
    from transformers import TrainerCallback
    counting = [False]
    reads: collections.Counter = collections.Counter()

    class Window(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            counting[0] = FIRST <= state.global_step < LAST

        def on_step_end(self, args, state, control, **kw):
            counting[0] = False

    cls = trainer_class()
    init = cls.__init__

    def with_window(self, *a, **kw):
        init(self, *a, **kw)
        self.add_callback(Window())

    monkeypatch.setattr(cls, "__init__", with_window)
    for name in READS:
        real = getattr(torch.Tensor, name)

        def read(self, *a, _real=real, _name=name):
            if counting[0]:
                reads[_name] += 1
            return _real(self, *a)
        monkeypatch.setattr(torch.Tensor, name, read)
    try:
        train()
    finally:
        monkeypatch.undo()
    return reads


def test_a_fine_tune_step_reads_no_more_tensor_values_than_plain_peft(s, tmp_path, monkeypatch):
    data = [TEXT] * 32
    rows, _ = train_data.prepare(data, s.tokenizer, 128, True)

    def nvkit_run():
        finetune(s, data, lora=LORA, max_steps=LAST + 1, batch_size=4, seq_len=128, packing=True,
                 output_dir=str(tmp_path / "run"), compile=False).result(timeout=600)

    def plain_run():
        _plain_wall(s, rows, LAST + 1, 4, LORA, "cpu")

    ours = _count_step_reads(monkeypatch, nvkit_run)
    if s.info["adapters"]:
        s.unload_adapter()
    plain = _count_step_reads(monkeypatch, plain_run)
    assert sum(plain.values()) > 0, "the window counted nothing: the callback did not run"
    assert sum(ours.values()) <= sum(plain.values()), (dict(ours), dict(plain))
