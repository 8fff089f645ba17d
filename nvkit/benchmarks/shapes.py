"""A shape's random-weight folder as the benchmarks build it."""

from __future__ import annotations


def shape_folder(name: str) -> str:
    """``nvkit.demo.shaped(name)``, its weights drawn on the GPU where there is one: a benchmark runs
    there anyway, and the GPU draws a 4B shape in seconds where the CPU takes minutes."""
    import torch

    from ..demo import shaped
    return shaped(name, device="cuda" if torch.cuda.is_available() else "cpu")
