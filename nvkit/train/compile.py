"""Compiling the decoder layers of a fine-tune: regional ``torch.compile`` under an
activation-memory budget.

Each decoder layer's forward is compiled; the layers share code, so dynamo compiles it once per
shape and every layer reuses it. With an activation-memory budget (``ACTIVATION_BUDGET``) torch's
partitioner keeps only part of what the backward needs and recomputes the cheapest rest:
selective checkpointing chosen by the compiler, most of full checkpointing's memory saving at a
few per cent of its cost.
"""

from __future__ import annotations

import contextlib

from .loss import causal_lm

#: Share of the saved activations the compiled layers may keep (torch's AOT partitioner
#: recomputes the cheapest rest in the backward); ``nvkit bench --lora`` measures the trade.
ACTIVATION_BUDGET = 0.5


def activation_budget(enabled: bool):
    """Context in which compiled layers are partitioned under ``ACTIVATION_BUDGET`` (compilation
    happens at the first step, inside ``trainer.train()``, so the whole call is wrapped)."""
    if not enabled:
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config
    return functorch_config.patch(activation_memory_budget=ACTIVATION_BUDGET)


def decoder_layers(model) -> list:
    dec = causal_lm(model).get_decoder()
    layers = getattr(dec, "layers", None)
    return list(layers) if layers is not None else []


def compile_layers(model) -> int:
    """Regional compilation of every decoder layer; returns how many."""
    import torch
    layers = decoder_layers(model)
    # identical layers differ only in parameters; with one graph per layer the cache would overflow
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 2 * len(layers) + 8)
    for layer in layers:
        layer.compile(dynamic=False)
    return len(layers)


def uncompile_layers(model) -> None:
    for layer in decoder_layers(model):
        if getattr(layer, "_compiled_call_impl", None) is not None:
            layer._compiled_call_impl = None


def eager():
    """Context in which compiled code runs eagerly (evaluation passes mid-run: a no-grad forward
    would otherwise compile a second graph for a few batches)."""
    import torch
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()
