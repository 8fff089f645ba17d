"""The generation keywords ``Session.generate`` takes, checked before any work starts.

Besides nvkit's own keywords, a generation setting is any field of transformers'
``GenerationConfig`` (``temperature``, ``min_new_tokens``, ``no_repeat_ngram_size``, ...). A name
that is neither is refused here with the accepted names, rather than by a transformers ``ValueError``
from the worker thread; so are the fields that would change what nvkit returns (scores, several
sequences) or that nvkit sets itself (the streamer, the stop criterion), each with what to use
instead. The common numeric settings are range-checked here, the rest by transformers'
``GenerationConfig.validate`` on a copy of the model's config.
"""

from __future__ import annotations

import copy
import difflib

from ..checks import number, whole_number
from ..errors import NvkitError

# Keywords of Session.generate itself (besides prompt, max_new_tokens, do_sample).
OWN = ("stream", "chat", "system", "history", "seed", "fast", "on_progress", "deterministic")

# Names a user may reach for that nvkit sets itself or that change what generate returns.
REFUSED = {
    "streamer": "nvkit streams itself: pass stream=a function that takes each text piece",
    "stopping_criteria": "nvkit stops a generation itself: call s.stop() (or interrupt the cell)",
    "logits_processor": "nvkit does not take custom logits processors: call s.model.generate(...) for that",
    "input_ids": "pass the prompt as text (a list of texts for a batch)",
    "inputs": "pass the prompt as text (a list of texts for a batch)",
    "attention_mask": "nvkit builds the attention mask from the prompt text",
    "generation_config": "pass its fields as keywords instead (e.g. temperature=0.7)",
    "max_length": "use max_new_tokens (tokens after the prompt)",
    "num_return_sequences": "nvkit returns one text per prompt: repeat the prompt in a list, with do_sample=True",
    "return_dict_in_generate": "nvkit returns text: call s.model.generate(...) for scores or hidden states",
    "output_scores": "nvkit returns text: call s.model.generate(...) for scores",
    "output_logits": "nvkit returns text: call s.model.generate(...) for logits",
    "output_attentions": "nvkit returns text: call s.model.generate(...) for attentions",
    "output_hidden_states": "nvkit returns text: call s.model.generate(...) for hidden states",
}

_INTERNAL = ("_from_model_config", "transformers_version")
_fields: tuple[str, ...] | None = None


def config_fields() -> tuple[str, ...]:
    """The GenerationConfig fields nvkit passes through to transformers, sorted."""
    global _fields
    if _fields is None:
        from transformers import GenerationConfig
        names = set(GenerationConfig().to_dict()) - set(_INTERNAL) - set(REFUSED)
        _fields = tuple(sorted(names | {"max_new_tokens", "do_sample"}))
    return _fields


def _unknown(name: str) -> NvkitError:
    accepted = sorted(set(OWN) | set(config_fields()))
    close = difflib.get_close_matches(name, accepted, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return NvkitError(f"generate() does not take {name!r}.{hint} It takes nvkit's own {', '.join(OWN)} and "
                      f"transformers' generation settings: {', '.join(n for n in config_fields())}.")


def _token_id(name: str, v, many: bool = False):
    # No upper bound: an id past the vocabulary is a known way to say "never stop" (eos_token_id).
    values = v if many and isinstance(v, (list, tuple)) else [v]
    if many and isinstance(v, (list, tuple)) and not v:
        raise NvkitError(f"{name} must be a token id or a non-empty list of token ids, not [].")
    for t in values:
        whole_number(name, t, 0)
    return list(v) if many and isinstance(v, (list, tuple)) else v


# setting -> check(value) returning the value to pass on
_CHECKS = {
    "temperature": lambda v: number("temperature", v, 0, lo_open=True),
    "top_p": lambda v: number("top_p", v, 0, 1, lo_open=True),
    "top_k": lambda v: whole_number("top_k", v, 0),
    "min_p": lambda v: number("min_p", v, 0, 1),
    "typical_p": lambda v: number("typical_p", v, 0, 1, lo_open=True),
    "repetition_penalty": lambda v: number("repetition_penalty", v, 0, lo_open=True),
    "min_new_tokens": lambda v: whole_number("min_new_tokens", v, 0),
    "no_repeat_ngram_size": lambda v: whole_number("no_repeat_ngram_size", v, 0),
    "max_time": lambda v: number("max_time", v, 0, lo_open=True),
    "pad_token_id": lambda v: _token_id("pad_token_id", v),
    "bos_token_id": lambda v: _token_id("bos_token_id", v),
    "eos_token_id": lambda v: _token_id("eos_token_id", v, many=True),
}


def _validate(config) -> None:
    # Only the hard errors: transformers logs the minor ones (a sampling flag without do_sample)
    # itself when generate runs, and they should not show twice.
    import inspect
    if "user_set_attributes" in inspect.signature(config.validate).parameters:
        config.validate(user_set_attributes=set())
    else:
        config.validate()


# Arguments of transformers' generate() that nvkit passes itself where they are needed: a user who
# copies transformers' documented form (``stop_strings=[...], tokenizer=tok``) passes the same object.
SUPPLIED = ("tokenizer",)


def _supplied(name: str, value, tokenizer) -> None:
    if value is tokenizer:
        return
    raise NvkitError(f"generate() takes {name}= only as the session's own tokenizer (s.tokenizer), which nvkit passes "
                     f"to transformers itself wherever it is needed (stop_strings); this is another "
                     f"{type(value).__name__}. Drop {name}=, or load the model with the tokenizer you want.")


def _greedy_when_it_is(out: dict, base: dict | None) -> dict:
    """Sampling from the single most likely token is greedy decoding: say so, so that every path
    (plain, fast, batched) picks that token the same way instead of each drawing from one token with
    its own arithmetic (and a seed that changes nothing)."""
    if (base or {}).get("do_sample") and out.get("top_k") == 1:
        out = {k: v for k, v in out.items() if k not in ("top_k", "top_p", "temperature", "min_p", "typical_p")}
        out["do_sample"] = False
    return out


def check(model, settings: dict, base: dict | None = None, tokenizer=None) -> dict:
    """``settings`` (keywords beyond nvkit's own) checked for ``model``: unknown or refused names,
    values out of range, and what transformers' ``GenerationConfig.validate`` rejects together with
    ``base`` (the settings nvkit passes anyway: max_new_tokens, do_sample). ``tokenizer`` is the
    session's own, the one value :data:`SUPPLIED` names may take. Settings that make sampling pick
    the most likely token come back as ``do_sample=False``."""
    out = {}
    for name, value in settings.items():
        if name in SUPPLIED:
            _supplied(name, value, tokenizer)
            continue
        if name in REFUSED:
            raise NvkitError(f"generate() does not take {name!r}: {REFUSED[name]}.")
        if name not in config_fields():
            raise _unknown(name)
        if name == "num_beams":
            whole_number("num_beams", value, 1)
            if value != 1:
                raise NvkitError(f"num_beams={value}: beam search cannot stream its text as it goes, and nvkit always "
                                 "streams. Use num_beams=1, or call s.model.generate(...) yourself for beam search.")
        check_value = _CHECKS.get(name)
        out[name] = check_value(value) if check_value else value
    gc = getattr(model, "generation_config", None)
    if gc is not None and out:
        trial = copy.deepcopy(gc)
        try:
            # set, not update(): update validates with warnings of its own, before do_sample is in
            for key, value in {**(base or {}), **out}.items():
                if key == "watermarking_config" and isinstance(value, dict):
                    from transformers.generation import WatermarkingConfig
                    value = WatermarkingConfig.from_dict(value)
                setattr(trial, key, value)
            _validate(trial)
        except (ValueError, TypeError, AttributeError) as e:  # AttributeError: a config field given a plain value
            raise NvkitError(f"transformers refuses these generation settings: {str(e).strip().splitlines()[0]}") from e
    return _greedy_when_it_is(out, base)
