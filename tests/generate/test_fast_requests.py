"""The fast path's request handling on the CPU (the same step code as on a GPU, run without CUDA
graphs): one cache serves every length, prompts padded to prefill classes, and the generation
arguments it runs itself (repetition penalty, minimum lengths, several EOS ids, stop strings),
each against plain greedy ``generate`` on the demo model in fp32."""

import threading

import pytest
import torch

import nvkit
import nvkit.generate.fast as fast
from nvkit.errors import NvkitError
from nvkit.generate import paths
from nvkit.generate.fast import static_cache as fast_cache
from tests import demo_model  # noqa: E402

NEVER = 10 ** 7


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def _plain(s, prompt, **kw):
    ids = s.tokenizer(prompt, return_tensors="pt")["input_ids"]
    if "stop_strings" in kw:
        kw["tokenizer"] = s.tokenizer
    with torch.inference_mode():
        out = s.model.generate(ids, do_sample=False, pad_token_id=s.tokenizer.pad_token_id, **kw)
    return ids, out[0, ids.shape[1]:].tolist()


def _fast(s, d, ids, **kw):
    sampling, why = fast.resolve(s.model, dict(kw, do_sample=False))
    assert why is None, why
    with torch.inference_mode():
        return d.generate(ids, sampling, tokenizer=s.tokenizer)


def _cut_at_eos(tokens, eos):
    return tokens[:next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))]


PROMPTS = ["NVIDIA GPUs are", "A", "The memory of a GPU holds the weights, the KV cache and " * 6]


def test_one_cache_serves_every_length_and_prompt_class(s):
    """Requests of many lengths run on one cache and one compiled step; prompts of every length
    class (padded) and one longer than the largest class (eager) decode as plain greedy does."""
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    lengths = []
    for prompt, n in zip(PROMPTS, (3, 30, 9)):
        ids, ref = _plain(s, prompt, max_new_tokens=n, eos_token_id=NEVER)
        lengths.append(ids.shape[1])
        assert _fast(s, d, ids, max_new_tokens=n, eos_token_id=NEVER) == ref, (prompt, n)
    assert d.counts == {"compiles": 1} and d.cache_length == 1024  # the demo's whole context, one class
    classes = sorted({fast_cache.prefill_class(n, 1024) for n in lengths})
    # each class's first prompt ran eagerly; the second of a class runs (and here keeps) its graph
    twice = sorted(c for c in classes if sum(fast_cache.prefill_class(n, 1024) == c for n in lengths) > 1)
    assert sorted(length for length, _ in d._cache.prefills_seen) == classes
    assert sorted(length for length, _ in d._cache.prefills) == twice and len(twice) < len(classes)
    for prompt, n in zip(PROMPTS, (3, 30, 9)):
        ids, ref = _plain(s, prompt, max_new_tokens=n, eos_token_id=NEVER)
        assert _fast(s, d, ids, max_new_tokens=n, eos_token_id=NEVER) == ref, (prompt, n)
    assert sorted(length for length, _ in d._cache.prefills) == classes
    old = fast_cache.MAX_PREFILL
    fast_cache.MAX_PREFILL = 32  # the 60-token prompt is then longer than every class: eager prefill
    try:
        ids, ref = _plain(s, PROMPTS[2], max_new_tokens=6, eos_token_id=NEVER)
        assert _fast(s, d, ids, max_new_tokens=6, eos_token_id=NEVER) == ref
    finally:
        fast_cache.MAX_PREFILL = old


def test_a_longer_request_doubles_the_cache_once(s):
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False, cache_tokens=64)
    ids, ref = _plain(s, "Hello there", max_new_tokens=70, eos_token_id=NEVER)
    assert _fast(s, d, ids, max_new_tokens=20, eos_token_id=NEVER) == ref[:20] and d.cache_length == 64
    assert _fast(s, d, ids, max_new_tokens=70, eos_token_id=NEVER) == ref and d.cache_length == 128
    assert _fast(s, d, ids, max_new_tokens=10, eos_token_id=NEVER) == ref[:10] and d.cache_length == 128  # kept
    assert d.counts == {"compiles": 2}
    too_long = torch.zeros((1, 1000), dtype=torch.long)
    with pytest.raises(NvkitError, match="1024"):
        _fast(s, d, too_long, max_new_tokens=100)


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=1.3, eos_token_id=NEVER),
    dict(repetition_penalty=0.8, eos_token_id=NEVER),
    dict(stop_strings=["GPU"], eos_token_id=NEVER),
    dict(stop_strings=["the memory", "cache"], eos_token_id=NEVER),
])
def test_processors_and_stop_strings_match_plain_generate(s, kw):
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    for prompt in PROMPTS:
        ids, ref = _plain(s, prompt, max_new_tokens=24, **kw)
        assert _fast(s, d, ids, max_new_tokens=24, **kw) == ref, (prompt, kw)


def test_minimum_lengths_and_several_eos_ids_match_plain_generate(s):
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    ids, free = _plain(s, PROMPTS[0], max_new_tokens=20, eos_token_id=NEVER)
    early = [free[3], free[6]]  # two ids greedy picks early: as EOS ids they would end it there
    ids, ref = _plain(s, PROMPTS[0], max_new_tokens=20, eos_token_id=early)
    assert len(ref) == 4 and _fast(s, d, ids, max_new_tokens=20, eos_token_id=early) == ref
    for kw in (dict(min_new_tokens=5), dict(min_new_tokens=12), dict(min_length=ids.shape[1] + 9)):
        _, ref = _plain(s, PROMPTS[0], max_new_tokens=20, eos_token_id=early, **kw)
        assert len(ref) > 4, kw  # the minimum held the EOS back
        assert _fast(s, d, ids, max_new_tokens=20, eos_token_id=early, **kw) == _cut_at_eos(ref, set(early)), kw
    assert d.counts == {"compiles": 1, "graphs": 1}  # greedy, and greedy with the processors


def test_run_fast_streams_says_how_and_reports_preparing(s):
    """The session-facing function on a decoder without graphs: streamed pieces make the text,
    the stats say how it ran, a stop string ends it, and progress calls carry the detail."""
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    fast.swap(s, d)
    try:
        class Job:
            stop_event = threading.Event()
        pieces, seen = [], []
        gen = dict(max_new_tokens=24, do_sample=False, eos_token_id=NEVER, stop_strings=["matrix"],
                   pad_token_id=s.tokenizer.pad_token_id)
        req = paths.Request(Job, [PROMPTS[0]], gen, stream=pieces.append,
                            on_progress=lambda st: seen.append(st.new_tokens))
        with torch.inference_mode():
            out = paths.run_fast(s, req)[0]
        _, ref = _plain(s, PROMPTS[0], max_new_tokens=24, eos_token_id=NEVER, stop_strings=["matrix"])
        assert out == "".join(pieces) == s.tokenizer.decode(ref, skip_special_tokens=True) and out.endswith("matrix")
        assert req.stats.path == "fast" and req.stats.new_tokens == len(ref)
        assert req.stats.prepared == ""  # the decoder existed and captures nothing without graphs
        assert req.stats.detail.startswith("fused step, eager, no CUDA graphs") and seen[-1] == len(ref)
        # a ready decoder compiles nothing: no "preparing" progress calls
        ticks = []
        with torch.inference_mode():
            d.generate(s.tokenizer(PROMPTS[1], return_tensors="pt")["input_ids"],
                       fast.resolve(s.model, dict(max_new_tokens=3, do_sample=False))[0], on_progress=ticks.append)
        assert ticks == []
    finally:
        fast.forget(s)


def test_progress_ticks_while_a_capture_runs():
    from nvkit.generate.fast.replay import ticking as _ticking
    import time
    got = []
    with _ticking(got.append):
        time.sleep(1.3)
    assert len(got) >= 2 and got[0] < 0.5 <= got[-1]
    with _ticking(None):
        pass


def test_what_the_fast_path_refuses_says_why_in_a_few_words(s):
    from types import SimpleNamespace
    gpu = SimpleNamespace(type="cuda")
    on_gpu = SimpleNamespace(model=s.model, tokenizer=s.tokenizer, device=gpu, quantization=None)
    ok = dict(max_new_tokens=8, do_sample=False)
    assert fast.single_why(on_gpu, ok) is None
    assert fast.single_why(on_gpu, dict(ok, min_new_tokens=4, repetition_penalty=1.1,
                                                       stop_strings=["x"], eos_token_id=[1, 2])) is None
    assert "num_beams=2" in fast.single_why(on_gpu, dict(ok, num_beams=2))
    assert "no_repeat_ngram_size" in fast.single_why(on_gpu, dict(ok, no_repeat_ngram_size=3))
    assert "quantized" in fast.single_why(SimpleNamespace(**{**vars(on_gpu), "quantization": "nf4"}), ok)
    assert "cpu" in fast.single_why(s, ok)
