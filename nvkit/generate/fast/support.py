"""Which path runs a generation request, and why not the faster one: the one place that answers it.

The paths, fastest first: for one prompt the batch-1 fast path ("fast"), else the rows fast path
where a list has captured it and the batch-1 path is not captured yet, else plain ``generate``;
for a list the rows fast path ("fast batch"), else transformers' continuous batching
("generate_batch"), else one padded ``generate``. ``route`` asks, once per request, what rules a
path out — the device, a model spread over GPUs, quantization, the model family, attached adapters,
the generation settings, and with ``fast=None`` whether a first capture would pay for itself — and
hands on the resolved ``Sampling`` and the tokenized prompts, so nothing is asked twice.

``deterministic=True`` (a prompt's text the same alone and in any list) has paths of its own: the
batch-invariant rows decoder (``rows_invariant``) for one prompt and for lists, else each prompt
alone on plain ``generate``, one after another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import NvkitError
from . import experts, first_request
from .fused_fit import fusable_why, layer_kinds, long_rope_from
from .lora import forward_lora_why, lora_why
from .options import default_options
from .sampling import Sampling, resolve

#: what transformers' continuous batching honours; it drops any other logits processor silently
#: (min_new_tokens, a repetition penalty, stop strings), so a list asking for one runs padded generate
BATCH_OPTIONS = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "pad_token_id", "eos_token_id"}

__all__ = ["Route", "route", "single_why", "rows_why", "deterministic_why", "batch_why", "worth_capturing",
           "worth_batching", "long_rope_why", "resolve"]


@dataclass
class Route:
    """The path a request takes (``path``), why each faster one is off (``off``: "fast path off:
    …" lines, for the stats; ``why``: the fast path's reason alone), and for a fast path its
    ``sampling`` and tokenized prompts (``ids``)."""
    path: str
    off: list[str] = field(default_factory=list)
    why: str | None = None
    sampling: Sampling | None = None
    ids: list[list[int]] | None = None
    #: "fast batch" on the batch-invariant rows decoder (``deterministic=True``)
    invariant: bool = False
    #: "generate" with each prompt of a list alone, one after another (``deterministic=True``)
    alone: bool = False


def base_model(model):
    """The causal LM under a PEFT wrapper (``model`` itself when it has none): the fast path's
    runners run it, so attaching, merging or removing adapters keeps them and their captures."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _placement_why(session, what: str) -> str | None:
    """What in the session rules out a fast path (``what``: its name in the message)."""
    model = session.model
    if session.device.type != "cuda":
        return f"the model is on {session.device}, and {what} replays CUDA graphs"
    dev_map = getattr(model, "hf_device_map", None)
    if dev_map and len({str(v) for v in dev_map.values()}) > 1:
        return f"the model is spread over several GPUs (device_map); {what} needs it on one"
    if getattr(session, "quantization", None):
        return f"the model is quantized ({session.quantization}); {what} covers bf16/fp16/fp32 weights"
    return None


def _layers_why(base) -> str | None:
    """Why the model's attention layers rule the fast paths out: full and sliding-window attention
    run (sliding windows in the model's own forward, ``static_cache.model_masks``), other kinds
    (chunked, linear, bidirectional) do not."""
    cfg = base.config.get_text_config()
    other = sorted(set(layer_kinds(cfg)) - {"full_attention", "sliding_attention"})
    if other:
        return f"the model has {', '.join(other)} layers"
    if getattr(cfg, "use_bidirectional_attention", False):
        return "the model attends in both directions"
    return None


def _forward_why(base) -> str | None:
    """Why the model's own forward cannot be the step (families the fused step does not cover)."""
    if not getattr(base, "_can_compile_fullgraph", False):
        return f"{type(base).__name__} does not support a static KV cache"
    attn = getattr(base.config, "_attn_implementation", None)
    if attn not in ("sdpa", "eager"):
        return f"attention backend {attn!r}: the fast path passes its own mask, which needs 'sdpa' or 'eager'"
    return None


def _experts_why(base) -> str | None:
    """Why a mixture of experts runs no list over its own forward: the experts' default,
    ``grouped_mm``, reads its offsets through the host, which a capture refuses, and transformers'
    ``batched_mm`` copies each row's experts' weights (gigabytes per step at a list's row counts);
    the rows step runs every expert on every row instead (``experts``), which needs a
    transformers that lets it register its experts implementation."""
    cfg = base.config.get_text_config()
    if experts.is_mixture(cfg) and not experts.register():
        return ("it is a mixture of experts, whose experts a captured step would copy for every row "
                "(transformers' batched_mm)")
    return None


def single_why(session, gen: dict) -> str | None:
    """Why one prompt cannot take the batch-1 fast path here (None when it can)."""
    model = session.model
    base = base_model(model)
    fused_why = fusable_why(base)
    adapters = bool(getattr(model, "peft_config", None))
    # adapters run in nvkit's fused step (LoRA on the projections it fuses), or in PEFT's own
    # layers on the model's own forward
    return (_placement_why(session, "the fast path")
            or (adapters and (forward_lora_why(model) if fused_why else lora_why(model)))
            or _layers_why(base)
            or (fused_why and _forward_why(base))
            or resolve(base, gen)[1])


def rows_why(session, gen: dict) -> str | None:
    """Why a list cannot take the rows fast path here (None when it can): on nvkit's fused step,
    or on the model's own forward where the fused step does not fit (``model_rows``), adapters in
    PEFT's own layers there as at batch 1."""
    model = session.model
    base = base_model(model)
    own = _fused_why(base)
    adapters = bool(getattr(model, "peft_config", None))
    return (_placement_why(session, "the batched fast path")
            or _layers_why(base)
            or (own and (_forward_why(base) or _experts_why(base)))
            or (adapters and (forward_lora_why(model) if own else lora_why(model)))
            or resolve(base, gen)[1])



def long_rope_why(base, ids: list[list[int]], gen: dict) -> str | None:
    """Why these prompts cannot run on a fast path (None when they can): a LongRoPE model (Phi-3
    128k, Phi-3.5, Phi-4-mini) whose text would grow past its original context during the answer.
    transformers' ``generate`` then encodes the whole text again with the long factors (Phi-3's
    ``prepare_inputs_for_generation`` drops its cache there), which a captured step, whose cache
    keeps the keys it wrote, does not do. A prompt already past that length runs on the long
    factors from its first token, and one whose answer ends before it on the short ones: both run,
    but not in one list (its rows share one rotary table)."""
    start = long_rope_from(base.config.get_text_config())
    if start is None:
        return None
    new = int(gen.get("max_new_tokens") or 0)
    if any(len(p) <= start < len(p) + new for p in ids):
        return (f"the text would grow past {start} tokens, where LongRoPE switches to its long factors and "
                "transformers encodes the whole text again")
    if len({len(p) > start for p in ids}) > 1:
        return (f"the list mixes prompts over and under {start} tokens, which LongRoPE rotates with its long and "
                "its short factors, and a list's rows share one rotary table")
    return None


def _fused_why(base) -> str | None:
    """Why nvkit's fused step does not run ``base``: it does not fit, or it is turned off."""
    return fusable_why(base) or (default_options().fused is False and "the fused step is turned off (NVKIT_FAST_FUSED=0)")


def deterministic_why(session, gen: dict) -> str | None:
    """Why a ``deterministic=True`` request cannot take the batch-invariant rows path here (None
    when it can): a model the fused step does not fit (the invariant step is the fused step with
    per-row kernels), or what rules out the rows path on the fused step."""
    return _fused_why(base_model(session.model)) or rows_why(session, gen)


def batch_why(session, gen: dict) -> str | None:
    """Why transformers' continuous batching cannot run a list here (None when it can): what
    rules out the batch-1 fast path (one GPU, no quantization, full attention, settings the
    graphs honour), no adapters, and only the settings it honours itself."""
    why = single_why(session, gen)
    if why:
        return why
    if getattr(session.model, "peft_config", None):
        return "a LoRA adapter is attached"
    if "sliding_attention" in layer_kinds(base_model(session.model).config.get_text_config()):
        # transformers' paged cache with sliding windows is not one nvkit has checked: padded generate runs the list
        return "the model has sliding-window layers"
    extra = sorted(k for k in gen if k not in BATCH_OPTIONS)
    return f"{', '.join(extra)} not supported" if extra else None


def worth_capturing(session, prompt_tokens: int, gen: dict, sampling: Sampling) -> str | None:
    """For ``fast=None``: None when the batch-1 fast path should run this request now, else why
    plain ``generate`` is the quicker answer. Once the session's fast path is captured, every
    request that fits its cache runs on it; before that, a request of ``min_tokens`` or more pays
    the capture, and a shorter one runs where it is expected to answer sooner (``first_request``)."""
    min_tokens = default_options().min_tokens
    d = session.decoders.single
    if d is not None and d.ready(prompt_tokens, sampling):
        return None
    n = int(gen["max_new_tokens"])
    if n >= min_tokens:
        return None
    again = [v for k, v in (d.capture_seconds.items() if d is not None else ()) if k[0] != "prefill"]
    expected = first_request.estimate(base_model(session.model), session.device, session.decoders.plain_per_token, n,
                                      session_captures=again)
    if expected.capture_pays:
        return None
    return (f"not captured yet, and {expected.words(n)}; nvkit.generate.fast.prepare(s), fast=True or a request "
            f"of ≥ {min_tokens} tokens captures it once")


def _short_before_capture(session, prompt_tokens: int, gen: dict, sampling: Sampling) -> bool:
    """A request under ``min_tokens`` new tokens whose sampling mode the batch-1 path has no graph
    for, where the rows hold one: they answer it without a capture to wait for (the batch-1
    capture is left to a longer request, which every request after it uses)."""
    d, rows = session.decoders.single, session.decoders.rows
    return (int(gen["max_new_tokens"]) < default_options().min_tokens
            and not (d is not None and d.ready(prompt_tokens, sampling, exact=True))
            and rows is not None and rows.captured(sampling.key))


def worth_batching(session, n_prompts: int, gen: dict) -> str | None:
    """For ``fast=None`` on a list: None when the rows fast path should run it now, else why
    plain generation is the quicker answer. Once the rows are captured every list runs there, and
    a list of ``min_tokens`` new tokens or more in all pays the capture; a shorter one runs where
    it is expected to answer sooner (``first_request``: padded generate's steps at the plain cost
    per token against the rows path's first capture and its steps)."""
    min_tokens = default_options().min_tokens
    if session.decoders.batched_ready():
        return None
    steps = int(gen["max_new_tokens"])
    if n_prompts * steps >= min_tokens:
        return None
    e = first_request.estimate(base_model(session.model), session.device, session.decoders.plain_per_token, steps,
                               what="rows")
    if e.capture_pays:
        return None
    return (f"not captured yet, and plain generation of {n_prompts} prompts × {steps} new tokens takes about "
            f"{e.plain:.2f} s ({e.plain_from}), the batched fast path about {e.fast:.2f} s with its capture first "
            f"({e.capture:.1f} s, {e.capture_from}); fast=True or a request of ≥ {min_tokens} tokens in all captures it once")


FAST = ("fast", "fast batch")



def route(session, texts: list[str], gen: dict, fast: bool | None, stream: bool = False,
          deterministic: bool = False) -> Route:
    """The path for this request (see the module docstring). ``fast=False`` rules the fast paths
    out, ``fast=None`` lets a short request skip a first capture; with ``fast=True`` a request
    the fast path cannot run gets a route without it (the caller refuses it, saying ``why``).
    A list that streams runs padded ``generate``."""
    if deterministic:
        return _deterministic_route(session, texts, gen, fast)
    if session.device.type != "cuda" or fast is False:
        return Route("generate")
    if len(texts) == 1:
        why = single_why(session, gen)
        if why is None:
            sampling = resolve(base_model(session.model), gen)[0]
            ids = [session.tokenizer(texts[0])["input_ids"]]
            why = long_rope_why(base_model(session.model), ids, gen)
            # the lists' graphs run a batch of one about as fast as the batch-1 path, with no
            # capture of its own to wait for (or one rung's: tenths of a second)
            on_rows = (why is None and not stream and session.decoders.batched_ready()
                       and rows_why(session, gen) is None)
            if why is None and fast is None:
                why = worth_capturing(session, len(ids[0]), gen, sampling)
                if why is None and on_rows and _short_before_capture(session, len(ids[0]), gen, sampling):
                    why = ("not captured yet, and the batched fast path, captured already, answers a request of "
                           f"under {default_options().min_tokens} new tokens without a capture to wait for")
            if why is None:
                return Route("fast", sampling=sampling, ids=ids)
            if on_rows:
                return Route("fast batch", ["the batch-1 fast path is not captured yet: the batched fast path, "
                                            "captured already, ran the prompt"], why, sampling=sampling, ids=ids)
        return fallback(session, texts, gen, fast, why)
    if stream:
        return Route("generate")
    why = rows_why(session, gen)
    ids = [session.tokenizer(t)["input_ids"] for t in texts] if why is None else None
    if why is None:
        why = long_rope_why(base_model(session.model), ids, gen)
    if why is None and fast is None:
        why = worth_batching(session, len(texts), gen)
    if why is None:
        return Route("fast batch", sampling=resolve(base_model(session.model), gen)[0], ids=ids)
    return fallback(session, texts, gen, fast, why)


def _deterministic_route(session, texts: list[str], gen: dict, fast: bool | None) -> Route:
    """``deterministic=True``: one prompt or many on the batch-invariant rows path (no first-capture
    shortcut: a plain first answer would not be the text the fast path gives); where it cannot
    run, each prompt alone on plain ``generate``, which gives every prompt its own text too."""
    if session.device.type != "cuda" or fast is False:
        why = "fast=False" if fast is False else f"the model is on {session.device}"
    else:
        why = deterministic_why(session, gen)
        ids = [session.tokenizer(t)["input_ids"] for t in texts] if why is None else None
        why = why or long_rope_why(base_model(session.model), ids, gen)
        if why is None:
            return Route("fast batch", sampling=resolve(base_model(session.model), gen)[0], ids=ids, invariant=True)
    return alone_fallback(why)


def alone_fallback(why: str) -> Route:
    """The route of a ``deterministic=True`` request off the invariant path for ``why``."""
    return Route("generate", [f"deterministic fast path off: {why}; each prompt runs alone on plain generate"], why,
                 alone=True)


def forced(session, texts: list[str], gen: dict, path: str) -> Route:
    """The route of a caller that picked the fast ``path`` itself (tests, benchmarks): the
    request's sampling and tokenized prompts; an NvkitError when the settings cannot run there."""
    sampling, why = resolve(base_model(session.model), gen)
    if sampling is None:
        raise NvkitError(f"The {'batched ' if path == 'fast batch' else ''}fast path cannot run this request: {why}.")
    return Route(path, sampling=sampling, ids=[session.tokenizer(t)["input_ids"] for t in texts])


def fallback(session, texts: list[str], gen: dict, fast: bool | None, why: str) -> Route:
    """The route when the fast path is off for ``why`` (or failed): plain ``generate`` for one
    prompt; for a list continuous batching where it can run, else padded ``generate``."""
    if len(texts) == 1:
        return Route("generate", [f"fast path off: {why}"], why)
    off = [f"batched fast path off: {why}"]
    if fast is not True:
        cb_why = batch_why(session, gen)
        if cb_why is None:
            return Route("generate_batch", off, why)
        off.append(f"continuous batching off: {cb_why}")
    return Route("generate", off, why)
