"""Where the shipped demo checkpoint and its training corpus live."""

from __future__ import annotations

from pathlib import Path

from ..errors import NvkitError

_HERE = Path(__file__).resolve().parent
CORPUS = str(_HERE / "corpus.txt")
MODEL_DIR = _HERE / "model"


def path() -> str:
    """Directory of the shipped demo checkpoint (config, safetensors weights, tokenizer)."""
    if not (MODEL_DIR / "config.json").is_file() or not (MODEL_DIR / "model.safetensors").is_file():
        raise NvkitError(
            f"The demo checkpoint is missing from {MODEL_DIR}. Reinstall nvkit, or rebuild it from the "
            "shipped corpus with: python -m nvkit.demo.build"
        )
    return str(MODEL_DIR)
