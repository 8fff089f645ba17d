"""On a CUDA GPU, through captured graphs: ``min_new_tokens`` on the fast path gives plain
``generate``'s tokens (the benchmarks time exactly the tokens they ask for on both), and the stats
line says in a few words why the fast path or continuous batching was off.

Run: HF_HUB_OFFLINE=1 python -m pytest tests/gpu/test_exact_tokens_gpu.py -q -s -p no:cacheprovider
"""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

import nvkit  # noqa: E402
from tests import demo_model  # noqa: E402

PROMPT = "NVIDIA GPUs are"


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cuda")
    yield sess
    sess.unload()


def test_min_new_tokens_on_the_fast_path_matches_plain_generate(s):
    ids = s.tokenizer(PROMPT, return_tensors="pt").to("cuda")["input_ids"]
    with torch.inference_mode():
        free = s.model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=10 ** 7,
                                pad_token_id=s.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    i = next(i for i in range(3, len(free)) if free[i] not in free[:i])
    eos = free[i]  # as EOS, greedy decoding would end at i + 1 tokens
    for fast in (False, True):
        s.generate(PROMPT, max_new_tokens=40, eos_token_id=eos, fast=fast)
        assert s.last_stats.new_tokens == i + 1
    kw = dict(max_new_tokens=40, eos_token_id=eos, min_new_tokens=24)
    plain = s.generate(PROMPT, fast=False, **kw)
    n_plain = s.last_stats.new_tokens
    quick = s.generate(PROMPT, fast=True, **kw)  # captures the graph that holds EOS back
    assert s.last_stats.path == "fast" and quick == plain and s.last_stats.new_tokens == n_plain >= 24
    s.generate(PROMPT, max_new_tokens=40, min_new_tokens=40, fast=True)
    assert s.last_stats.new_tokens == 40
    print(f"\n{s.last_stats}")


def test_the_stats_line_says_why_the_fast_path_was_off(s):
    s.generate(PROMPT, max_new_tokens=8, no_repeat_ngram_size=2)  # a processor the fast path does not run
    how = s.last_stats.how
    assert how.startswith("generate (fast path off: ") and "no_repeat_ngram_size" in how, how
    assert str(s.last_stats).endswith(f"· {how}")
    # min_new_tokens runs on the fast paths; a list asking for a processor neither the batched fast
    # path nor continuous batching runs goes to padded generate, and says why
    outs = s.generate([PROMPT, "Hello there"], max_new_tokens=6, min_new_tokens=6, no_repeat_ngram_size=2)
    assert len(outs) == 2 and s.last_stats.new_tokens == 12
    how = s.last_stats.how
    assert how.startswith("generate (") and "continuous batching off" in how and "no_repeat_ngram_size" in how, how