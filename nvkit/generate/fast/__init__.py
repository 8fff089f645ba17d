"""nvkit's fast decode path: a static KV cache, nvkit's fused decode step for the Llama family and
K decode steps per CUDA-graph replay (docs/fast-path.md).

Modules: ``support`` (which path runs a request, and why not the faster one), ``decoders`` (the
runners a session owns, ``prepare``), ``runner`` (``GraphRunner``: what both runners share),
``compile_policy`` (when to compile, and keeping the faster step, measured), ``single``
(``FastDecoder``, batch 1 on a static cache: ``static_cache``, ``replay``), ``rows``
(``BatchedDecoder``, many prompts on a paged cache: ``paged_cache``, ``schedule``, ``rows_replay``,
``prefill_rows``; ``model_rows``: the same over the model's own forward), ``llama_step``/``llama_rows_step`` (the Llama-family steps), ``lora`` (adapters in those
steps), ``sampling`` (the token pick), ``options`` (``FastOptions``), ``cuda_graphs`` (capturing a step),
``artifacts`` (compile artifacts on disk). The Triton kernels are in ``nvkit.generate.kernels``."""

from ...lazy import lazy_names

_NAMES = {
    "FastOptions": "options", "default_options": "options", "ATTENTION_KINDS": "options",
    "DEFAULT_ATTENTION": "options", "ENVIRONMENT_VARIABLES": "options",
    "Sampling": "sampling", "resolve": "sampling",
    "FastDecoder": "single", "BatchedDecoder": "rows", "ModelRowsDecoder": "model_rows", "GraphRunner": "runner",
    "Decoders": "decoders", "decoder": "decoders", "batched_decoder": "decoders", "prepare": "decoders",
    "forget": "decoders", "swap": "decoders", "current": "decoders",
    "route": "support", "single_why": "support", "rows_why": "support", "batch_why": "support", "worth_capturing": "support",
    "worth_batching": "support",
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
