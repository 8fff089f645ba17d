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

from .checkpoint import CORPUS, path
from .shaped import SHAPES, shaped, shaped_config

__all__ = ["CORPUS", "SHAPES", "path", "shaped", "shaped_config"]
