"""Model directories for the generation tests: nvkit's shipped demo checkpoint (trained, so greedy
choices are clear of near-ties) and the random-weight shapes for the GPU checks."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def demo_ready() -> bool:
    try:
        import nvkit.demo as demo
        demo.path()
        return True
    except Exception:  # noqa: BLE001 - a broken install: the tests that need it say so
        return False


def model_dir() -> str:
    import nvkit.demo as demo
    return demo.path()


def shaped_dir(name: str) -> str:
    import nvkit.demo as demo
    return demo.shaped(name)
