"""What a worker thread is about to import, imported first by the thread that starts it.

Python gives every module under import a lock of its own. When two threads import, for the
first time, modules that import each other (transformers' parts do, through its lazy top-level
module that imports a part the first time one of its names is asked for), the deadlock between
those locks is broken by handing one thread a module that is still half-way through its import,
and ``from transformers import PreTrainedModel`` fails with "cannot import name". A Load clicked
in a fresh kernel met exactly that: the worker imported transformers while the main thread (the
Model tab's estimate, a cell) imported it too, and a second click worked.

So whoever starts a worker that loads, generates or trains calls the matching ``for_*`` first, in
its own thread: the worker then finds those modules whole, and the main thread's own imports of
them find them done. Warming what is already imported costs a dictionary lookup per module. The
lock keeps two warm-ups (a cell, and a worker that itself starts another worker) from being the
race they prevent.
"""

from __future__ import annotations

import importlib
import json
import os
import threading

from ..quiet import routed

_lock = threading.Lock()

# What nvkit.load reaches, each part of transformers by the module that holds it (its top level is
# the lazy module: importing it imports none of the parts); nvkit's own load path last.
LOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.configuration_utils",
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_base",
    "transformers.tokenization_utils_tokenizers",
    "transformers.convert_slow_tokenizer",
    "transformers.generation",
    "transformers.utils.logging",
    "nvkit.model.session",
)
# The fine-tune loop: Trainer (which brings accelerate, and datasets where installed), PEFT's LoRA,
# and nvkit's pieces of the loop.
FINETUNE = LOAD + (
    "transformers.trainer",
    "transformers.trainer_callback",
    "transformers.training_args",
    "peft",
    "peft.utils.transformers_weight_conversion",
    "peft.tuners.lora.bnb",
    "nvkit.train.trainer",
    "nvkit.train.lora",
    "nvkit.train.run",
    "nvkit.train.evaluate",
    "deepspeed",   # Trainer imports it whenever it is installed (nvkit's deepspeed extra)
    "torch.profiler._cupti_monitor",  # the first record_function region (Trainer wraps steps in them)
)
QUANTIZATION = ("bitsandbytes",)   # a 4-bit or 8-bit load imports it while the weights load
KERNELS = ("kernels",)             # Hub kernels, asked for with use_kernels / kernel_config


def warm(modules) -> None:
    """Import ``modules`` now, in this thread. One that cannot be imported (an optional package
    that is not installed) is left to the worker, which reports it in its own words."""
    # routed: a first import of bitsandbytes or DeepSpeed logs what nvkit.quiet routes away
    with _lock, routed():
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a warm-up never fails a request; the worker says why
                pass


def model_class(model) -> tuple[str, str] | None:
    """(package, class name) of the causal-LM class a local checkpoint (the demo model included)
    loads into, read from its config.json, the way transformers' auto classes find it; None for a
    Hub id (its config comes from the network, in the worker) or a model type transformers does
    not know (``trust_remote_code`` models bring their own module, imported by the load)."""
    try:
        if str(model).strip() == "demo":
            from ..demo import path as demo_path
            folder = demo_path()
        else:
            folder = os.path.expanduser(os.fspath(model).strip())
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
    except (OSError, TypeError, ValueError, AttributeError):
        return None
    try:
        from transformers.models.auto.configuration_auto import model_type_to_module_name
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # no transformers: the load says so
        return None
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    if not isinstance(name, str):
        return None
    return f"transformers.models.{model_type_to_module_name(model_type)}", name


def for_load(model="demo", quantization=None, use_kernels=False, kernel_config=None) -> None:
    """Before a worker calls ``nvkit.load(model, ...)``."""
    names = list(LOAD)
    if quantization not in (None, "none"):
        names += QUANTIZATION
    if use_kernels or kernel_config is not None:
        names += KERNELS
    warm(names)
    found = model_class(model)
    if found is None:
        return
    package, name = found
    with _lock:
        try:
            # the model's package is a lazy module too: asking it for the class imports the
            # modeling module, as the auto class will in the worker
            getattr(importlib.import_module(package), name)
        except Exception:  # noqa: BLE001 - the load itself reports what is wrong with the checkpoint
            pass


def for_finetune() -> None:
    """Before a worker fine-tunes a loaded session."""
    warm(FINETUNE)
