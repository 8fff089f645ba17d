"""The one way the tests find a model: nvkit's shipped demo checkpoint through ``nvkit.demo.path()``
(what users get; trained, so greedy choices are clear of near-ties), and the random-weight shapes
of real models for the GPU checks through ``nvkit.demo.shaped``."""

from __future__ import annotations


def path() -> str:
    """The shipped demo checkpoint's folder."""
    import nvkit.demo
    return nvkit.demo.path()


def shaped(name: str) -> str:
    """A random-weight model of a real model's shape (e.g. "qwen3-0.6b"), built once and cached:
    drawn on the GPU where there is one, as the benchmarks draw it (the same folder either way)."""
    from nvkit.benchmarks.shapes import shape_folder
    return shape_folder(name)


def ready() -> bool:
    """Whether the demo checkpoint is there (a broken install: the tests that need it say so)."""
    try:
        path()
        return True
    except Exception:  # noqa: BLE001
        return False
