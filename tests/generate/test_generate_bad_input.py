"""``Session.generate`` / ``agenerate`` with wrong arguments: NvkitError before any work starts,
naming the argument and what it takes (unknown keywords with the accepted ones), and the session
generates as before."""

import asyncio

import pytest

from tests.refusals import PROMPT, refused


def _never_called(_piece):
    raise AssertionError("a refused request must not stream")


CASES = [
    # the prompt
    ((5,), {}, ["prompt must be a string or a list of strings"]),
    (("",), {}, ["The prompt is empty"]),
    (([],), {}, ["The prompt list is empty"]),
    ((["ok", 5],), {}, ["Each prompt must be a string"]),
    (({"text": "hi"},), {}, ["prompt must be a string or a list of strings"]),
    # nvkit's own keywords
    ((PROMPT,), dict(max_new_tokens=0), ["max_new_tokens must be a whole number"]),
    ((PROMPT,), dict(max_new_tokens="5"), ["max_new_tokens must be a whole number"]),
    ((PROMPT,), dict(do_sample="yes"), ["do_sample must be True or False"]),
    ((PROMPT,), dict(stream=5), ["stream must be a function"]),
    (([PROMPT, PROMPT],), dict(stream=_never_called), ["one prompt at a time"]),
    ((PROMPT,), dict(chat="yes"), ["chat must be True or False"]),
    ((PROMPT,), dict(chat=True, history=5), ["history must be a list of messages", "'role'"]),
    ((PROMPT,), dict(chat=True, history=[1]), ["history[0] must be a message"]),
    ((PROMPT,), dict(chat=True, history=[{"role": "robot", "content": "x"}]), ["history[0]", "user, assistant"]),
    ((PROMPT,), dict(chat=True, history=[{"role": "user", "content": 3}]), ["history[0]", "'content': a string"]),
    ((PROMPT,), dict(chat=True, system=5), ["system must be a string"]),
    ((PROMPT,), dict(history=[{"role": "user", "content": "Hi"}]), ["only apply to chat", "chat=True"]),
    ((PROMPT,), dict(system="Be brief."), ["only apply to chat"]),
    ((PROMPT,), dict(seed="x"), ["seed must be a whole number"]),
    ((PROMPT,), dict(seed=-1), ["seed must be a whole number from 0"]),
    ((PROMPT,), dict(fast="yes"), ["fast must be True or False or None"]),
    ((PROMPT,), dict(deterministic="yes"), ["deterministic must be True or False"]),
    ((PROMPT,), dict(deterministic=None), ["deterministic must be True or False"]),
    ((PROMPT,), dict(determinstic=True), ["does not take 'determinstic'", "'deterministic'"]),
    ((PROMPT,), dict(on_progress=5), ["on_progress must be a function"]),
    # keywords that are not generation settings
    ((PROMPT,), dict(bogus_kw=1), ["does not take 'bogus_kw'", "temperature", "top_p", "chat"]),
    ((PROMPT,), dict(tempreature=0.5), ["Did you mean 'temperature'"]),
    ((PROMPT,), dict(streamer=None), ["pass stream="]),
    ((PROMPT,), dict(stopping_criteria=None), ["s.stop()"]),
    ((PROMPT,), dict(input_ids=[1, 2]), ["pass the prompt as text"]),
    ((PROMPT,), dict(generation_config=None), ["pass its fields as keywords"]),
    ((PROMPT,), dict(stop_strings=["."], tokenizer=object()), ["tokenizer= only as the session's own", "object"]),
    ((PROMPT,), dict(max_length=20), ["use max_new_tokens"]),
    ((PROMPT,), dict(num_return_sequences=2), ["one text per prompt"]),
    ((PROMPT,), dict(return_dict_in_generate=True), ["s.model.generate"]),
    ((PROMPT,), dict(output_scores=True), ["s.model.generate"]),
    # generation settings out of range
    ((PROMPT,), dict(num_beams=0), ["num_beams must be a whole number ≥ 1"]),
    ((PROMPT,), dict(num_beams=2), ["beam search", "num_beams=1"]),
    ((PROMPT,), dict(do_sample=True, temperature=0), ["temperature must be a finite number > 0"]),
    ((PROMPT,), dict(do_sample=True, temperature=float("inf")), ["temperature must be a finite number"]),
    ((PROMPT,), dict(do_sample=True, temperature="hot"), ["temperature must be a finite number"]),
    ((PROMPT,), dict(do_sample=True, top_p=0), ["top_p must be a finite number in (0, 1]"]),
    ((PROMPT,), dict(do_sample=True, top_p=1.5), ["top_p"]),
    ((PROMPT,), dict(do_sample=True, top_k=-1), ["top_k must be a whole number ≥ 0"]),
    ((PROMPT,), dict(do_sample=True, top_k=True), ["top_k must be a whole number"]),
    ((PROMPT,), dict(do_sample=True, min_p=2), ["min_p"]),
    ((PROMPT,), dict(repetition_penalty=0), ["repetition_penalty must be a finite number > 0"]),
    ((PROMPT,), dict(min_new_tokens=-1), ["min_new_tokens must be a whole number ≥ 0"]),
    ((PROMPT,), dict(no_repeat_ngram_size=-1), ["no_repeat_ngram_size"]),
    ((PROMPT,), dict(max_time=0), ["max_time must be a finite number > 0"]),
    ((PROMPT,), dict(pad_token_id="a"), ["pad_token_id must be a whole number"]),
    ((PROMPT,), dict(eos_token_id=[]), ["eos_token_id must be a token id or a non-empty list"]),
    ((PROMPT,), dict(eos_token_id=-3), ["eos_token_id must be a whole number"]),
    ((PROMPT,), dict(early_stopping="maybe"), ["transformers refuses", "early_stopping"]),
    ((PROMPT,), dict(cache_implementation="bogus"), ["transformers refuses", "cache_implementation"]),
    ((PROMPT,), dict(watermarking_config=5), ["transformers refuses"]),
    # values transformers only checks once generate runs (the worker's error, as NvkitError)
    ((PROMPT,), dict(sequence_bias={"a": 1}), ["transformers refused the generation settings", "sequence_bias"]),
    ((PROMPT,), dict(bad_words_ids=[[-1]]), ["transformers refused the generation settings", "bad_words_ids"]),
]


def _id(case):
    args, kw, _ = case
    return ", ".join([repr(a)[:20] for a in args] + [f"{k}={v!r}"[:30] for k, v in kw.items()])


@pytest.mark.parametrize("how", ["generate", "agenerate"])
@pytest.mark.parametrize("args, kwargs, words", CASES, ids=[_id(c) for c in CASES])
def test_generate_refuses(survivor, how, args, kwargs, words):
    s = survivor.session
    if how == "generate":
        call = lambda: s.generate(*args, **kwargs)  # noqa: E731
    else:
        call = lambda: asyncio.run(s.agenerate(*args, **kwargs))  # noqa: E731
    msg = refused(call, *words, survivor=survivor)
    assert "streamer" not in msg or "streamer" in kwargs   # never about an argument the user did not pass


def test_good_chat_history_and_settings_still_work(survivor):
    s = survivor.session
    out = s.generate(PROMPT, max_new_tokens=3, chat=True, system="Be brief.",
                     history=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}])
    assert isinstance(out, str)
    assert isinstance(s.generate(PROMPT, max_new_tokens=3, do_sample=True, temperature=0.7, top_p=0.9, top_k=5,
                                 seed=1, min_new_tokens=1, no_repeat_ngram_size=2, eos_token_id=10**7), str)
    survivor.check()


def test_transformers_documented_stop_strings_form_takes_the_sessions_tokenizer(survivor):
    # transformers documents stop_strings with tokenizer=: the session's own tokenizer is the one
    # nvkit passes anyway, so the same request with or without it gives the same text.
    s = survivor.session
    plain = s.generate(PROMPT, max_new_tokens=12, stop_strings=["."])
    assert s.generate(PROMPT, max_new_tokens=12, stop_strings=["."], tokenizer=s.tokenizer) == plain
    survivor.check()


@pytest.mark.parametrize("extra", [{}, {"temperature": 0.3}, {"top_p": 0.5, "temperature": 5.0}])
def test_sampling_from_the_top_token_is_greedy(survivor, extra):
    # top_k=1 keeps one token, so the draw is the argmax whatever the seed, temperature or top_p:
    # the text equals greedy token for token, and the request runs as greedy (no seed, no sampling).
    s = survivor.session
    greedy = s.generate(PROMPT, max_new_tokens=24)
    for seed in (7, 8):
        assert s.generate(PROMPT, max_new_tokens=24, do_sample=True, top_k=1, seed=seed, **extra) == greedy
    gen = s._generation_kwargs(24, True, dict(top_k=1, **extra))
    assert gen["do_sample"] is False and "top_k" not in gen and "temperature" not in gen
    survivor.check()
