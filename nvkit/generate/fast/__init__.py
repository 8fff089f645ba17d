"""nvkit's fast decode path: a static KV cache, nvkit's fused decode step for the Llama family and
K decode steps per CUDA-graph replay (``decoder``).

Modules: ``options`` (``FastOptions`` from the ``NVKIT_FAST_*`` variables), ``sampling`` (what a
request may ask for, the token pick), ``fused`` (the Llama-family steps), ``lora`` (adapters in
the fused steps), ``cache`` (the KV cache of a size class and its buffers), ``capture``
(``FastDecoder``), ``artifacts`` (compile artifacts on disk), ``attached`` (the decoder a session
uses, ``prepare``), ``debug`` (side-by-side decoders); for many prompts at once ``batched``
(``BatchedDecoder``), ``fused_rows`` (its steps over rows), ``schedule`` (rows, pages, refill);
``step_kernels`` (the Triton kernels of the uncompiled steps)."""

from ...lazy import lazy_names

_NAMES = {
    "FastOptions": "options", "default_options": "options", "ATTENTION_KINDS": "options",
    "DEFAULT_ATTENTION": "options", "ENVIRONMENT_VARIABLES": "options",
    "Sampling": "sampling", "resolve": "sampling", "unsupported_reason": "sampling",
    "FastDecoder": "capture",
    "decoder": "attached", "forget": "attached", "worth_capturing": "attached", "prepare": "attached",
    "batched_decoder": "attached", "worth_batching": "attached", "BatchedDecoder": "batched",
    "swap": "debug",
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
