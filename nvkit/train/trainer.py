"""The transformers ``Trainer`` as nvkit runs it, in the kernel (``nvkit.finetune``) and on every
rank of a launch (``nvkit.train.worker``): the fused loss, a token count for tokens/s, no printed
logs or progress bars, and the ``TrainingArguments`` both use."""

from __future__ import annotations

import contextlib

from .loss import fused_loss_forward

_CLASS = None


def trainer_class():
    """``NvkitTrainer``, built on first use (transformers' imports are heavy).

    ``fused_loss=True``: the causal LM computes its loss with ``nvkit.train.loss`` during
    ``train()``; ``counter``: a dict whose ``"tokens"`` grows by the real tokens of each batch."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from transformers import Trainer

    class NvkitTrainer(Trainer):
        def __init__(self, *a, fused_loss: bool = False, counter: dict | None = None, **kw):
            super().__init__(*a, **kw)
            self.fused_loss = fused_loss
            self.counter = counter
            # the loss is a per-batch mean; Trainer divides it by grad_accum itself
            self.model_accepts_loss_kwargs = False

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            n = inputs.pop("num_tokens", None)
            if self.counter is not None and n is not None:
                self.counter["tokens"] += int(n)
            return super().compute_loss(model, inputs, return_outputs=return_outputs)

        def train(self, *args, **kwargs):
            with fused_loss_forward(self.model) if self.fused_loss else contextlib.nullcontext():
                return super().train(*args, **kwargs)

    _CLASS = NvkitTrainer
    return _CLASS


def quiet_trainer(trainer) -> None:
    """Trainer prints its log dicts (PrinterCallback) or draws a progress bar: from a worker thread
    both land in whichever cell runs at that moment. The run's history and the panel replace them."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def training_arguments(output_dir: str, prec: str, device_type: str, *, max_steps, epochs, learning_rate,
                       batch_size, grad_accum, log_every, seed, gradient_checkpointing, fused_adamw: bool,
                       **extra):
    """``TrainingArguments`` for an nvkit run; ``extra`` adds or overrides arguments (a launch adds
    its DDP/FSDP settings)."""
    from transformers import TrainingArguments
    kw = dict(output_dir=output_dir, per_device_train_batch_size=batch_size, gradient_accumulation_steps=grad_accum,
              learning_rate=learning_rate, logging_steps=log_every, logging_strategy="steps",
              save_strategy="no", report_to="none", disable_tqdm=True, seed=seed, data_seed=seed,
              remove_unused_columns=False, dataloader_num_workers=0, lr_scheduler_type="linear",
              warmup_steps=0, bf16=prec == "bf16", fp16=prec == "fp16", use_cpu=device_type != "cuda",
              optim="adamw_torch_fused" if fused_adamw else "adamw_torch",
              dataloader_pin_memory=device_type == "cuda", include_num_input_tokens_seen="no",
              gradient_checkpointing=False)  # enabled on the model already (PEFT-aware)
    if max_steps is not None:
        kw["max_steps"] = max_steps
    else:
        kw["num_train_epochs"] = float(epochs or 1)
    kw.update(extra)
    args = TrainingArguments(**kw)
    if args.n_gpu > 1:
        # Trainer wraps the model in nn.DataParallel when one process sees several GPUs: the model
        # sits on the session's device, and several GPUs train through nvkit.launch (DDP) instead.
        args._n_gpu = 1
    return args
