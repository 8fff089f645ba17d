"""A tiny kernel in the Hub kernel layout (build/<variant>/<package>/), for nvkit's tests.

It exposes ``layers.RMSNorm``, a drop-in forward for the RMSNorm layers transformers marks with
``@use_kernel_forward_from_hub("RMSNorm")``. Pure PyTorch, so it runs on any device; every call
counts itself so a test can prove the replaced forward really ran.
"""

from . import layers

__all__ = ["layers"]
