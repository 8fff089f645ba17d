"""The offline models: the shipped demo checkpoint and random-weight copies of real model shapes.

``path()`` is a tiny Qwen3 model (about 4 M parameters) with its own byte-level BPE tokenizer and a
ChatML chat template, trained on ``CORPUS`` by ``python -m nvkit.demo.build``. It loads through the
same ``from_pretrained`` path as any local checkpoint, so everything nvkit does can be shown on a
machine that never reaches the Hub.

``shaped(name)`` builds, once, a checkpoint with the exact shape of a real model (Qwen3-0.6B, ...)
from its config alone, with random bf16 weights: the right size for memory and speed measurements,
meaningless as text. ``shaped_config(name)`` gives the config without building anything.

Importing this module is cheap: torch and transformers are imported only when something is built.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import NvkitError
from .shaped import SHAPES, shaped, shaped_config

_HERE = Path(__file__).resolve().parent
CORPUS = str(_HERE / "corpus.txt")
_MODEL = _HERE / "model"

__all__ = ["CORPUS", "SHAPES", "path", "shaped", "shaped_config"]


def path() -> str:
    """Directory of the shipped demo checkpoint (config, safetensors weights, tokenizer)."""
    if not (_MODEL / "config.json").is_file() or not (_MODEL / "model.safetensors").is_file():
        raise NvkitError(
            f"The demo checkpoint is missing from {_MODEL}. Reinstall nvkit, or rebuild it from the "
            "shipped corpus with: python -m nvkit.demo.build"
        )
    return str(_MODEL)
