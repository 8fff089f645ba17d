"""nvkit's fast decode path: a static KV cache, nvkit's fused decode step for the Llama family and
K decode steps per CUDA-graph replay (``decoder``)."""

from ...lazy import lazy_names

_NAMES = {name: "decoding" for name in (
    "FastDecoder", "Sampling", "decoder", "forget", "swap", "resolve", "unsupported_reason", "worth_capturing",
    "DEFAULT_K", "DEFAULT_ATTENTION", "ATTENTION_KINDS", "AUTO_MIN_TOKENS")}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
