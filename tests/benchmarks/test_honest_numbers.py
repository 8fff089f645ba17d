"""What nvkit reports about a generation is what happened: min_new_tokens reaches a path that honours
it (benchmarks time exactly the tokens they ask for; tests/generate/test_fast_requests.py checks the
fast path's tokens against generate), the token count follows the request's EOS, the stats line
labels its two rates and says in a few words why the fast path was off."""

import pytest
import torch

import nvkit
import nvkit.generate.fast as fast
from nvkit.generate.stats import GenerationStats
from tests import demo_model  # noqa: E402


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def _first_new(tokens, start):
    """Index of the first token from ``start`` on that did not come before it (as EOS it ends the text there)."""
    return next(i for i in range(start, len(tokens)) if tokens[i] not in tokens[:i])


def _plain(s, ids, **kw):
    with torch.inference_mode():
        out = s.model.generate(ids, do_sample=False, pad_token_id=s.tokenizer.pad_token_id, **kw)
    return out[0, ids.shape[1]:].tolist()


def test_min_new_tokens_goes_to_the_fast_path_but_not_to_continuous_batching(s):
    gen = dict(max_new_tokens=8, do_sample=False, min_new_tokens=8)
    sampling, why = fast.resolve(s.model, gen)
    assert why is None and sampling.min_new_tokens == 8
    # a session on a GPU would take the fast path; on this CPU the device is the reason
    assert "cpu" in fast.single_why(s, gen)
    # transformers' continuous batching would drop the processor silently: a list runs padded generate
    from types import SimpleNamespace
    on_gpu = SimpleNamespace(model=s.model, tokenizer=s.tokenizer, device=SimpleNamespace(type="cuda"), quantization=None)
    assert fast.batch_why(on_gpu, gen) == "min_new_tokens not supported"
    assert fast.batch_why(on_gpu, dict(max_new_tokens=8, do_sample=True, top_p=0.9)) is None
    none, why = fast.resolve(s.model, dict(gen, foo=1))
    assert none is None and "foo" in why


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
