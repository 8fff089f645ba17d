"""What nvkit reports about a generation is what happened: min_new_tokens holds EOS back on the fast
path as on plain ``generate`` (benchmarks time exactly the tokens they ask for), the token count
follows the request's EOS, the stats line labels its two rates, and the fast path's refusals come
with a few words for that line."""

import pytest
import torch

import nvkit
from nvkit import fast
from nvkit.session import GenerationStats
from tests.gen_fixtures import model_dir


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(model_dir(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def _first_new(tokens, start):
    """Index of the first token from ``start`` on that did not come before it (as EOS it ends the text there)."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def _plain(s, ids, **kw):
    with torch.inference_mode():
        out = s.model.generate(ids, do_sample=False, pad_token_id=s.tokenizer.pad_token_id, **kw)
    return out[0, ids.shape[1]:].tolist()


def test_min_new_tokens_holds_eos_back_on_the_fast_path_as_generate_does(s):
    ids = s.tokenizer("NVIDIA GPUs are", return_tensors="pt")["input_ids"]
    free = _plain(s, ids, max_new_tokens=24, eos_token_id=10 ** 7)
    i = _first_new(free, 3)
    eos = free[i]  # a token greedy decoding picks early: as EOS it ends the text there
    assert _plain(s, ids, max_new_tokens=24, eos_token_id=eos) == free[:i + 1]
    want = _plain(s, ids, max_new_tokens=24, eos_token_id=eos, min_new_tokens=12)
    assert len(want) >= 12 and eos not in want[:12]  # transformers' own semantics, the reference
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    for k in (1, 4):  # the mask is counted in the prefill's pick and in each step of a replay
        d.k = k
        d._buckets.clear()
        sampling, why = fast._resolve(s.model, dict(max_new_tokens=24, do_sample=False, eos_token_id=eos,
                                                     min_new_tokens=12))
        assert why is None and sampling.key == ("greedy", "min_new") and sampling.min_new_tokens == 12
        with torch.inference_mode():
            assert d.generate(ids, sampling) == want
            # the same decoder without the option still stops at EOS (the mask is per request)
            plain_sampling, _ = fast._resolve(s.model, dict(max_new_tokens=24, do_sample=False, eos_token_id=eos))
            assert plain_sampling.key == ("greedy",) and d.generate(ids, plain_sampling) == free[:i + 1]
    # exactly max_new_tokens when min_new_tokens asks for all of them, whatever the EOS ids
    every, _ = fast._resolve(s.model, dict(max_new_tokens=10, do_sample=False, eos_token_id=[eos, 10 ** 7],
                                           min_new_tokens=10))
    with torch.inference_mode():
        assert len(d.generate(ids, every)) == 10


def test_min_new_tokens_goes_to_the_fast_path_but_not_to_continuous_batching(s):
    gen = dict(max_new_tokens=8, do_sample=False, min_new_tokens=8)
    sampling, why = fast._resolve(s.model, gen)
    assert why is None and sampling.min_new_tokens == 8
    # a session on a GPU would take the fast path; on this CPU the device is the reason, in a few words
    why = fast.unsupported_reason(s, ["x"], gen)
    assert "cpu" in why and why.short == "model on cpu"
    none, why = fast._resolve(s.model, dict(gen, repetition_penalty=1.3))
    assert none is None and "repetition_penalty" in why and why.short == "repetition_penalty not supported"
    none, why = fast._resolve(s.model, dict(gen, foo=1))
    assert why.short == "foo not supported"


def test_token_count_follows_the_request_eos(s):
    prompt = "NVIDIA GPUs are"
    ids = s.tokenizer(prompt, return_tensors="pt")["input_ids"]
    free = _plain(s, ids, max_new_tokens=12, eos_token_id=10 ** 7)
    i = _first_new(free, 2)
    s.generate(prompt, max_new_tokens=12, eos_token_id=free[i])
    assert s.last_stats.new_tokens == i + 1
    # EOS ids the model never produces: every asked token is produced, and counted
    s.generate(prompt, max_new_tokens=12, eos_token_id=10 ** 7)
    assert s.last_stats.new_tokens == 12
    s.generate(prompt, max_new_tokens=12, eos_token_id=free[i], min_new_tokens=12)
    assert s.last_stats.new_tokens == 12


def test_stats_line_labels_each_rate():
    # a first fast-path request: the capture happens before the first token
    st = GenerationStats(new_tokens=160, seconds=14.10, time_to_first_token=14.083, path="fast", detail="fused step")
    assert st.tokens_per_second == pytest.approx(160 / 14.10)
    assert st.decode_tokens_per_second == pytest.approx(159 / (14.10 - 14.083))
    line = str(st)
    assert line.startswith("160 tokens in 14.10 s · 11.3 tok/s overall · first token 14083 ms · then ")
    assert "tok/s decode · fast (fused step)" in line
    one = GenerationStats(new_tokens=1, seconds=0.2, time_to_first_token=0.2)
    assert one.decode_tokens_per_second is None and "decode" not in str(one) and one.tokens_per_second == 5.0
    assert GenerationStats().tokens_per_second == 0.0 and GenerationStats().decode_tokens_per_second is None
    off = GenerationStats(new_tokens=4, seconds=1.0, time_to_first_token=0.1,
                          detail="fast path off: min_new_tokens not supported")
    assert str(off).endswith("· generate (fast path off: min_new_tokens not supported)")
