"""nvkit's fast decode path: a static KV cache, nvkit's fused decode step for the Llama family and
K decode steps per CUDA-graph replay (``decoder``).

Modules: ``options`` (``FastOptions`` from the ``NVKIT_FAST_*`` variables), ``sampling`` (what a
request may ask for, the token pick), ``fused`` (the Llama-family step), ``capture``
(``FastDecoder``), ``attached`` (the decoder a session uses), ``debug`` (side-by-side decoders)."""

from ...lazy import lazy_names

_NAMES = {
    "FastOptions": "options", "default_options": "options", "ATTENTION_KINDS": "options",
    "DEFAULT_ATTENTION": "options", "ENVIRONMENT_VARIABLES": "options",
    "Sampling": "sampling", "resolve": "sampling", "unsupported_reason": "sampling",
    "FastDecoder": "capture",
    "decoder": "attached", "forget": "attached", "worth_capturing": "attached",
    "swap": "debug",
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
