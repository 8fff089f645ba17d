"""Held-out loss and perplexity during a fine-tune (``finetune(eval_data=... | eval_split=...)``).

The loss is the mean next-token cross-entropy over every target token of the held-out rows (a
token-weighted mean, so long and short rows count by what they hold), computed with the fused
loss: the LM head runs chunk by chunk and the full logits never exist. The model is put in eval
mode (no dropout) for the pass and back in training mode after it; compiled layers run eagerly
for it (a no-grad pass would otherwise compile a second graph for a few batches). Nothing here
draws random numbers, so evaluating does not change the training that follows.
"""

from __future__ import annotations

import math
import time

from .compile import eager
from .data import Collator, Example
from .loss import fused_loss_supported, loss_sum


class Evaluator:
    """Evaluates ``rows`` (tokenized held-out examples) on a model: ``evaluator(model)`` → dict."""

    def __init__(self, rows: list[Example], batch_size: int, pad_id: int, device, pad_to: int = 8):
        self.rows = rows
        self.batch_size = batch_size
        self.collate = Collator(pad_id, pad_to=pad_to)
        self.device = device

    def __len__(self) -> int:
        return len(self.rows)

    def __call__(self, model) -> dict:
        import torch
        fused = fused_loss_supported(model)[0]
        was_training = model.training
        model.eval()
        t0 = time.perf_counter()
        total, count = 0.0, 0
        try:
            with torch.no_grad(), eager():
                for i in range(0, len(self.rows), self.batch_size):
                    batch = self.collate(self.rows[i:i + self.batch_size])
                    ids = batch["input_ids"].to(self.device)
                    labels = batch["labels"].to(self.device)
                    s, n = loss_sum(model, ids, labels, fused)
                    total += s
                    count += n
        finally:
            if was_training:
                model.train()
        loss = total / count if count else float("nan")
        return {"eval_loss": loss, "eval_perplexity": perplexity(loss), "eval_tokens": count,
                "eval_seconds": time.perf_counter() - t0}


def perplexity(loss: float) -> float:
    """exp(loss), inf where it would overflow (a diverged run), nan for nan."""
    if loss != loss:
        return float("nan")
    return math.exp(loss) if loss < 700 else float("inf")
