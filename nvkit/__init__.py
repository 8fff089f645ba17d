"""nvkit: Hugging Face Transformers on NVIDIA GPUs, from a notebook.

``import nvkit`` is cheap and never touches CUDA: names resolve lazily to the module that holds
them, so the server extension and ``%load_ext nvkit`` don't pay for importing torch, and a saved GPU
selection can still be applied before any CUDA work (see ``nvkit.selection``).
"""

from __future__ import annotations

import importlib

from .errors import NvkitError
from .events import mark

__version__ = "0.1.0"

# public name -> module that holds it (relative to nvkit); None: the name is a module of nvkit
_LAZY = {
    # GPUs
    "GPU": "hardware.inventory", "gpus": "hardware.inventory",
    "select_gpus": "hardware.selection", "selection": "hardware.selection", "launch_command": "hardware.selection",
    # model choices
    "attention_backends": "model.backends", "quantization_methods": "model.quant",
    # the session
    "Session": "model.session", "load": "model.session", "session": "model.session",
    # memory
    "estimate": "memory.estimate", "Estimate": "memory.estimate",
    "memory_report": "memory.report", "Sampler": "memory.sampling",
    "monitor": "ui.memory_chart", "MemoryChart": "ui.memory_chart",
    # fine-tune
    "finetune": "train.finetune", "FinetuneRun": "train.finetune", "launch": "train.launch",
    "launch_generate": "train.launch", "LaunchRun": "train.launch",
    # bench
    "bench": "benchmarks.backends",
    # panels
    "panel": "ui.app", "GPUSelector": "ui.gpu_selector", "LoadPanel": "ui.load_panel",
    "GeneratePanel": "ui.generate_panel", "FinetunePanel": "ui.finetune_panel", "LaunchPanel": "ui.launch_panel",
    # modules users reach into (nvkit.data.preview, nvkit.memory.comparisons, nvkit.demo.shaped)
    "demo": None, "memory": None, "data": None,
}
# modules published under a name of their own
_MODULE_AT = {"demo": "demo", "memory": "memory", "data": "train.data"}

__all__ = ["NvkitError", "mark", "__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'nvkit' has no attribute {name!r}")
    where = _LAZY[name]
    if where is None:
        value = importlib.import_module(f".{_MODULE_AT[name]}", __name__)
    else:
        value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """``%load_ext nvkit``: register ``%nvkit`` / ``%%nvkit``."""
    from .magics import load_ipython_extension as _load
    _load(ipython)


def _jupyter_server_extension_points():
    return [{"module": "nvkit.server"}]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "nvkit"}]


# A GPU choice saved before this kernel restarted is applied here, before any CUDA work (cheap: one
# file lookup, and only inside a Jupyter kernel; no torch).
from .hardware.selection import apply_saved as _apply_saved  # noqa: E402

_apply_saved()

# Inside a Jupyter kernel, tell the server what this kernel holds on the GPUs (a small report file
# and the "nvkit.unload" comm target, for the lab's GPU sidebar). Cheap: a thread takes the first
# look; no torch import, no CUDA.
from .kernel_report import start as _start_kernel_report  # noqa: E402

_start_kernel_report()
