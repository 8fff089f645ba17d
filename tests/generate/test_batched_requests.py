"""The batched fast path on the CPU (the same step and host code as on a GPU, run without CUDA
graphs or compile): each prompt of a mixed batch decodes exactly as it does alone with plain
greedy ``generate`` on the demo model in fp32 — with fewer rows than prompts (refill, rows packed
into a smaller class), EOS, the processors, stop strings and LoRA; sampling depends on a request's
seed and not on its neighbours; Stop returns what finished, in input order; and the session-facing
path fills the stats and progress and says why it does not run."""

import threading
from types import SimpleNamespace

import pytest
import torch

import nvkit
import nvkit.generate.fast as fast
from nvkit.errors import NvkitError
from nvkit.generate import paths
from nvkit.generate.fast import paged_cache as arena
from nvkit.generate.fast.rows import BatchedDecoder
from nvkit.generate.fast.schedule import Sequence
from nvkit.generate.fast.sampling import RowParams, choose_rows, counter_uniform, request_seeds
from tests import demo_model  # noqa: E402

NEVER = 10 ** 7
# very different lengths: one token, a few, a sentence, a paragraph (≈ 300 tokens)
PROMPTS = ["A", "NVIDIA GPUs are", "Hello there", "The memory of a GPU holds the weights, the KV cache and " * 20,
           "Training a model on many prompts at once", "CUDA graphs replay", "Tokens per second"]


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def _ids(s, prompts):
    return [s.tokenizer(p)["input_ids"] for p in prompts]


def _plain(s, prompt, **kw):
    ids = s.tokenizer(prompt, return_tensors="pt")["input_ids"]
    if "stop_strings" in kw:
        kw["tokenizer"] = s.tokenizer
    with torch.inference_mode():
        out = s.model.generate(ids, do_sample=False, pad_token_id=s.tokenizer.pad_token_id, **kw)
    return out[0, ids.shape[1]:].tolist()


def _cut_at_eos(tokens, eos):
    return tokens[:next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))]


def _decoder(model, max_rows=256, **kw):
    return BatchedDecoder(fast.FastDecoder(model, k_steps=4, graphs=False, **kw), max_rows=max_rows)


def _batched(s, bd, prompts, seeds=None, **gen):
    sampling, why = fast.resolve(s.model, dict(gen, do_sample=gen.get("do_sample", False)))
    assert why is None, why
    with torch.inference_mode():
        return bd.generate(_ids(s, prompts), sampling, seeds, tokenizer=s.tokenizer)


@pytest.mark.parametrize("max_rows", [2, 8])
def test_each_prompt_decodes_as_it_does_alone(s, max_rows):
    """All at once (8 rows) and through 2 rows (refills as prompts finish; the last one alone in a
    class of 2): plain greedy's tokens for every prompt, whatever its length and neighbours."""
    bd = _decoder(s.model, max_rows=max_rows)
    got = _batched(s, bd, PROMPTS, max_new_tokens=21, eos_token_id=NEVER)
    for prompt, tokens in zip(PROMPTS, got):
        assert tokens == _plain(s, prompt, max_new_tokens=21, eos_token_id=NEVER), prompt
    assert sorted(bd.last_batches) == ([2] if max_rows == 2 else [8])  # 7 rows end together: no packing
    assert bd.counts["compiles"] == 1 and bd.describe().startswith("fused step over rows, eager, no CUDA graphs")


def test_eos_ends_each_prompt_where_plain_generate_does(s):
    """Real EOS ids (two ids greedy picks early for some prompts): each prompt ends at its own
    step, its row goes to the next prompt, and the text is plain greedy's."""
    free = {p: _plain(s, p, max_new_tokens=16, eos_token_id=NEVER) for p in PROMPTS}
    eos = [free[PROMPTS[1]][3], free[PROMPTS[2]][5]]
    bd = _decoder(s.model, max_rows=2)
    got = _batched(s, bd, PROMPTS, max_new_tokens=16, eos_token_id=eos)
    lengths = set()
    for prompt, tokens in zip(PROMPTS, got):
        ref = _cut_at_eos(_plain(s, prompt, max_new_tokens=16, eos_token_id=eos), set(eos))
        assert tokens == ref, prompt
        lengths.add(len(tokens))
    assert len(lengths) > 1  # prompts did end at different steps


def test_rows_pack_into_a_smaller_class_as_prompts_end(s):
    """Most prompts end early (EOS); with nothing waiting, the rest are packed into a class of 2."""
    free = {p: _plain(s, p, max_new_tokens=16, eos_token_id=NEVER) for p in PROMPTS}
    eos = [free[p][1] for p in PROMPTS[:5]]
    bd = _decoder(s.model, max_rows=8)
    got = _batched(s, bd, PROMPTS, max_new_tokens=16, eos_token_id=eos)
    for prompt, tokens in zip(PROMPTS, got):
        assert tokens == _cut_at_eos(_plain(s, prompt, max_new_tokens=16, eos_token_id=eos), set(eos)), prompt
    assert max(bd.last_batches) == 8 and min(bd.last_batches) <= 4, bd.last_batches


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=1.3, eos_token_id=NEVER),
    dict(stop_strings=["GPU"], eos_token_id=NEVER),
])
def test_processors_and_stop_strings_match_plain_generate(s, kw):
    bd = _decoder(s.model, max_rows=4)
    got = _batched(s, bd, PROMPTS, max_new_tokens=18, **kw)
    for prompt, tokens in zip(PROMPTS, got):
        assert tokens == _plain(s, prompt, max_new_tokens=18, **kw), (prompt, kw)


def test_minimum_lengths_hold_eos_back_per_prompt(s):
    free = _plain(s, PROMPTS[1], max_new_tokens=16, eos_token_id=NEVER)
    early = [free[2]]
    bd = _decoder(s.model, max_rows=4)
    got = _batched(s, bd, PROMPTS[:4], max_new_tokens=16, eos_token_id=early, min_new_tokens=6)
    for prompt, tokens in zip(PROMPTS[:4], got):
        ref = _plain(s, prompt, max_new_tokens=16, eos_token_id=early, min_new_tokens=6)
        assert tokens == _cut_at_eos(ref, set(early)), prompt
    assert len(got[1]) > 3  # the minimum held this prompt's early EOS back


@pytest.mark.parametrize("fold, merged", [(False, True), (False, False), (True, False)],
                         ids=["merged", "apart", "spare rows"])
def test_trained_adapter_decodes_as_peft_does(s, fold, merged):
    """The rows read the batch-1 decoder's merged copy where it merges the adapters (the default:
    the base step over the copy), else add the adapters' products; also on weights with spare rows
    for folded adapters (``lora_fold``: the rows' products stay apart; only the batch-1 step
    folds). Once the adapters are gone, no rows step keeps their copy."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(demo_model.path(), dtype=torch.float32).eval()
    torch.manual_seed(0)
    pm = get_peft_model(base, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)).eval()
    bd = _decoder(base, max_rows=2, lora_fold=fold, lora_merged=merged)
    sampling, _ = fast.resolve(base, dict(max_new_tokens=12, do_sample=False, eos_token_id=NEVER))
    with torch.inference_mode():
        got = bd.generate(_ids(s, PROMPTS[:3]), sampling)
    for prompt, tokens in zip(PROMPTS[:3], got):
        ids = s.tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            ref = pm.generate(input_ids=ids, max_new_tokens=12, do_sample=False, eos_token_id=NEVER,
                              pad_token_id=s.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        assert tokens == ref, prompt
    assert ("LoRA merged into a copy of 16 projection groups" if merged else "LoRA unmerged") in bd.describe()
    copy = bd.single._adapters.merged
    assert (copy is not None) == merged and (bd._lora.weights is copy.weights if merged else bd._lora.slots)
    with pm.disable_adapter(), torch.inference_mode():
        off = bd.generate(_ids(s, PROMPTS[:1]), sampling)[0]
    assert off == _plain(s, PROMPTS[0], max_new_tokens=12, eos_token_id=NEVER) != got[0]
    assert True in bd._steps  # switched off, not gone: the adapters' steps stay for the next request
    pm.unload()  # the LoRA layers taken out of the model
    with torch.inference_mode():
        assert bd.generate(_ids(s, PROMPTS[:1]), sampling)[0] == off
    assert True not in bd._steps and bd._lora_built is None and bd.single._adapters.merged is None


def test_sampling_depends_on_the_seed_not_on_the_neighbours(s):
    """A request's sampled text is a function of its seed: the same in another batch, at another
    place, through another number of rows; another seed gives another text."""
    gen = dict(do_sample=True, temperature=1.0, top_k=0, max_new_tokens=20, eos_token_id=NEVER)
    a = _batched(s, _decoder(s.model), PROMPTS[:3], seeds=[11, 12, 13], **gen)
    b = _batched(s, _decoder(s.model, max_rows=2), [PROMPTS[4], PROMPTS[1], PROMPTS[0], PROMPTS[2]],
                 seeds=[99, 12, 11, 13], **gen)
    assert [b[2], b[1], b[3]] == a
    c = _batched(s, _decoder(s.model), PROMPTS[:3], seeds=[21, 22, 23], **gen)
    assert all(x != y for x, y in zip(a, c))
    topk = _batched(s, _decoder(s.model), PROMPTS[:3], seeds=[11, 12, 13], **dict(gen, top_k=5, top_p=0.8))
    assert topk != a and all(len(t) == 20 for t in topk)


def test_row_sampling_follows_the_distribution_and_its_filters():
    torch.manual_seed(0)
    vocab, rows = 12, 4000
    logits = torch.randn(1, vocab).expand(rows, vocab).contiguous()
    ones = torch.ones(rows)

    def draw(key, top_p=1.0):
        p = RowParams(temperature=ones, top_p=ones * top_p, penalty=ones, seed=torch.arange(rows),
                      counter=torch.full((rows,), 7), min_pos=torch.zeros(rows, dtype=torch.long),
                      eos_mask=torch.zeros(1, vocab, dtype=torch.bool))
        return choose_rows(logits, key, p)

    probs = logits[0].softmax(-1)
    freq = torch.bincount(draw(("sample", 0, False, False)), minlength=vocab).float() / rows
    assert (freq - probs).abs().max() < 0.03, (freq, probs)  # 4000 draws: a few standard errors
    top = int(probs.argmax())
    top3 = set(logits[0].topk(3).indices.tolist())
    drawn = set(draw(("sample", 3, False, False)).tolist())
    assert drawn <= top3 and top in drawn and len(drawn) > 1
    order = probs.argsort(descending=True)
    nucleus = set(order[:int((probs[order].cumsum(0) - probs[order] <= 0.5).sum())].tolist())
    drawn = set(draw(("sample", 0, True, False), top_p=0.5).tolist())
    assert drawn <= nucleus and top in drawn and len(nucleus) < vocab
    assert torch.equal(draw(("greedy", 0, False, False)), logits.argmax(-1))


def test_counter_noise_is_uniform_and_a_pure_function_of_seed_and_counter():
    n = 200_000
    u = counter_uniform(torch.full((n,), 12345), torch.arange(n))
    assert u.dtype == torch.float32 and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    again = counter_uniform(torch.tensor([12345, 7, 12345]), torch.tensor([5, 5, 5]))
    assert again[0] == u[5] == again[2] != again[1]
    seeds = request_seeds(42, 5)
    assert seeds == request_seeds(42, 5) and len(set(seeds)) == 5 and all(0 <= x < 2 ** 63 for x in seeds)
    assert request_seeds(43, 2) != seeds[:2] and request_seeds(42, 2) == seeds[:2]


def test_stop_returns_what_finished_in_input_order(s):
    """Stop set once the first prompt is done: the replays in flight end, the finished prompts come
    back as plain greedy decodes them, the others as None; nothing more is queued."""
    bd = _decoder(s.model, max_rows=2)
    stop = threading.Event()
    seen = []

    def on_tokens(done, produced):
        seen.append((done, produced))
        if done:
            stop.set()

    eos = [_plain(s, PROMPTS[2], max_new_tokens=6, eos_token_id=NEVER)[2]]  # ends prompt 2 early
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=40, do_sample=False, eos_token_id=eos))
    with torch.inference_mode():
        got = bd.generate(_ids(s, PROMPTS[1:]), sampling, stop_event=stop, on_tokens=on_tokens)
    finished = [i for i, t in enumerate(got) if t is not None]
    assert finished and len(finished) < len(got) and seen[-1][0] == len(finished)
    for i in finished:
        assert got[i] == _cut_at_eos(_plain(s, PROMPTS[1 + i], max_new_tokens=40, eos_token_id=eos), set(eos))
    assert sum(bd.last_batches.values()) <= len(seen)  # every replay queued was read; none after the stop's


def test_a_first_pool_has_room_for_the_lists_to_come(s):
    """Issue 39: a session's first list, however short, gets a pool of ``FIRST_POSITIONS`` and, where
    the paged kernel attends (it reads a row only up to its position), page tables of
    ``FIRST_WIDTH`` positions, so the lists after it do not replace it (and its graphs); matmul
    attention, which reads the whole table width, gets tables as wide as the request needs."""
    bd = _decoder(s.model, max_rows=16)
    _batched(s, bd, PROMPTS[:2], max_new_tokens=5, eos_token_id=NEVER)
    first = bd._arena
    assert first.pages >= arena.FIRST_POSITIONS // arena.PAGE
    assert bd.attention == "matmul" and first.width * arena.PAGE < 64  # the CPU: a few tokens each
    _batched(s, bd, PROMPTS[:3] * 5, max_new_tokens=5, eos_token_id=NEVER)  # more prompts, as short
    assert bd._arena is first
    paged = _decoder(s.model, max_rows=16)
    paged.attention = "paged"  # what a GPU gets; only the pool's planning is read here
    paged._adopt()
    seqs = [Sequence(0, [1, 2, 3], 5, 0)]
    assert paged._arena_for(seqs, 5, False).width * arena.PAGE >= min(arena.FIRST_WIDTH, paged.max_positions)


def test_a_pool_never_shrinks_and_grows_once_with_room_to_spare(s, monkeypatch):
    """Issue 39: a smaller list after a bigger one runs in the pool (and on the graphs) the bigger
    one left; a list the pool cannot hold gets one new pool, with rows for ``max_rows`` prompts,
    twice the pages and everything the old one held, and the lists after it fit."""
    monkeypatch.setattr(arena, "FIRST_POSITIONS", 0)  # a first pool of the first list's size
    bd = _decoder(s.model, max_rows=16)
    _batched(s, bd, PROMPTS[:2], max_new_tokens=5, eos_token_id=NEVER)
    first = bd._arena
    assert first.rows == 16  # rows for max_rows prompts from the first list on
    got = _batched(s, bd, PROMPTS * 2, max_new_tokens=40, eos_token_id=NEVER)  # more pages than it has
    grown = bd._arena
    assert grown is not first and grown.pages >= 2 * first.pages and grown.width >= first.width
    assert got[0] == _plain(s, PROMPTS[0], max_new_tokens=40, eos_token_id=NEVER)
    graphs = dict(grown.graphs)
    for prompts, n in ((PROMPTS[:1], 5), (PROMPTS[:3], 30), (PROMPTS * 2, 40), (PROMPTS[1:2], 12)):
        got = _batched(s, bd, prompts, max_new_tokens=n, eos_token_id=NEVER)
        assert bd._arena is grown, (len(prompts), n)
        assert got[-1] == _plain(s, prompts[-1], max_new_tokens=n, eos_token_id=NEVER)
    assert all(grown.graphs[k] is g for k, g in graphs.items())  # nothing captured again


def test_pool_for_keeps_grows_and_keeps_within_free_memory():
    """The pool choice on its own (``paged_cache.pool_for``), with the free memory a GPU reports:
    the session's pool serves whatever it holds; the first pool and a growing one take room for the
    lists to come only within their share of free memory, never less than the request needs; a new
    pool holds the old one's rows, width and penalty mask."""
    page = 1 << 20
    P = arena.PAGE
    first = arena.pool_for(None, 3, 10, 4, False, page, None, 16, 4096)
    assert first == (arena.FIRST_POSITIONS // P, 16, 4096 // P, False)  # room for the lists to come
    tight = arena.pool_for(None, 3, 10, 4, False, page, free_bytes=100 * page, max_rows=16, first_width=0)
    assert tight == (max(10, int(arena.FIRST_SHARE * 100)), 16, 4, False)
    assert arena.pool_for(None, 3, 40, 4, False, page, free_bytes=100 * page, max_rows=16, first_width=0)[0] == 40
    old = SimpleNamespace(pages=64, rows=16, width=8, seen=None)
    for rows, pages, width in ((1, 1, 1), (16, 64, 8), (9, 30, 2)):
        assert arena.pool_for(old, rows, pages, width, False, page, None, 16, 0) is None  # never shrunk
    assert arena.pool_for(old, 2, 2, 2, True, page, None, 16, 0) == (128, 16, 8, True)  # the penalty's mask
    assert arena.pool_for(old, 32, 70, 2, False, page, None, 16, 0) == (128, 32, 8, False)  # more rows
    assert arena.pool_for(old, 2, 300, 20, False, page, None, 16, 0) == (300, 16, 20, False)  # the need wins
    # growing within MEMORY_SHARE of what is free (the old pool's bytes counted as free by the caller)
    assert arena.pool_for(old, 2, 70, 2, False, page, 100 * page, 16, 0)[0] == max(70, int(arena.MEMORY_SHARE * 100))
    masked = SimpleNamespace(pages=64, rows=16, width=8, seen=object())
    assert arena.pool_for(masked, 2, 2, 2, True, page, None, 16, 0) is None
    assert arena.pool_for(masked, 2, 200, 2, False, page, None, 16, 0)[3] is True  # a mask once taken stays


def test_pool_plan_fits_rows_to_memory(s):
    bd = _decoder(s.model, max_rows=8)
    bd._adopt()
    page = bd._page_bytes()
    rows, pages = bd.plan([10, 100, 40], max_new=20)
    assert rows == 3 and pages == 1 + sum(-(-(n + 20) // arena.PAGE) for n in (10, 100, 40))
    rows, pages = bd.plan([10] * 20, max_new=20)
    assert rows == 8 and pages == 1 + 8  # more prompts than rows: the pool holds the rows at once
    small = int(6 * page / arena.MEMORY_SHARE)
    rows, pages = bd.plan([10] * 20, max_new=20, free_bytes=small)
    assert rows < 8 and pages * page <= arena.MEMORY_SHARE * small
    with pytest.raises(NvkitError, match="does not fit"):
        bd.plan([900], max_new=100, free_bytes=page)


def test_prefill_budget_grows_with_the_pool_within_its_bounds(s):
    from nvkit.generate.fast import paged_cache as arena
    per = arena.prefill_bytes_per_token(1024, 16, 8, 128, 3072, 2)  # the Qwen3-0.6B shape in bf16
    assert per == 2 * (3 * 1024 + 32 * 128 + 64 * 128 + 3 * 3072) + 4 * 1024
    assert arena.prefill_budget(0, per) == arena.PREFILL_TOKENS  # a small pool keeps the floor
    assert arena.prefill_budget(2**50, per) == arena.PREFILL_MAX_TOKENS
    mid = arena.prefill_budget(int(2.6 * 2**30), per)  # 64 prompts' pool: between the bounds, in steps of 16
    assert arena.PREFILL_TOKENS < mid < arena.PREFILL_MAX_TOKENS and mid % 16 == 0
    assert mid * per <= arena.PREFILL_SHARE * 2.6 * 2**30
    # every budget prefills the same tokens: one prompt per forward here, all at once by default
    one_each = BatchedDecoder(fast.FastDecoder(s.model, k_steps=4, graphs=False), max_rows=8, prefill_tokens=16)
    default = _decoder(s.model, max_rows=8)
    want = _batched(s, default, PROMPTS, max_new_tokens=9, eos_token_id=NEVER)
    assert _batched(s, one_each, PROMPTS, max_new_tokens=9, eos_token_id=NEVER) == want
    assert default.prefill_tokens_for(default._arena) == arena.PREFILL_TOKENS
    for bad in (0, 15, 16.0, True, "4096"):
        with pytest.raises(NvkitError, match="prefill_tokens must be"):
            BatchedDecoder(fast.FastDecoder(s.model, k_steps=4, graphs=False), prefill_tokens=bad)


class _Job:
    def __init__(self):
        self.stop_event = threading.Event()


def _on_gpu(s, **changes):
    """The session as paths sees it on a GPU (the work itself runs on the CPU without graphs)."""
    return SimpleNamespace(**{**dict(model=s.model, tokenizer=s.tokenizer, device=SimpleNamespace(type="cuda"),
                                     quantization=None, decoders=s.decoders), **changes})


def test_a_list_on_a_gpu_runs_batched_with_progress_and_input_order(s):
    fast.swap(s, fast.FastDecoder(s.model, k_steps=4, graphs=False))
    try:
        progress = []
        gen = dict(max_new_tokens=40, do_sample=False, eos_token_id=NEVER, pad_token_id=s.tokenizer.pad_token_id)
        req = paths.Request(_Job(), list(PROMPTS[:4]), gen,
                            on_progress=lambda st: progress.append((st.prompts_done, st.new_tokens,
                                                                    st.tokens_per_second)))
        with torch.inference_mode():
            outs = paths.run(_on_gpu(s), req)
        st = req.stats
        assert st.path == "fast batch" and st.detail.startswith("fused step over rows"), st.how
        assert outs == [s.tokenizer.decode(_plain(s, p, max_new_tokens=40, eos_token_id=NEVER), skip_special_tokens=True)
                        for p in PROMPTS[:4]]
        assert st.new_tokens == 160 and st.prompts_done == 4 and progress[-1][:2] == (4, 160)
        assert progress[-1][2] > 0  # a live rate while it runs
        assert st.time_to_first_token is not None and st.prompt_tokens == sum(len(i) for i in _ids(s, PROMPTS[:4]))
        # Stop before it starts: nothing finishes, every output is "" and the session goes on
        req = paths.Request(_Job(), list(PROMPTS[:3]), gen)
        req.job.stop_event.set()
        with torch.inference_mode():
            assert paths.run(_on_gpu(s), req) == ["", "", ""]
        # short and nothing compiled: continuous batching would answer sooner (fast=None only)
        fresh = SimpleNamespace(**vars(_on_gpu(s)))
        assert "not captured yet" in fast.worth_batching(_on_gpu(s, decoders=fast.Decoders()), 2,
                                                         dict(max_new_tokens=8))
        assert fast.worth_batching(fresh, 2, dict(max_new_tokens=8)) is None  # this session's decoder ran
    finally:
        fast.forget(s)


def test_releasing_the_lists_keeps_the_batch1_decoder_and_the_next_list_runs_again(s):
    """``Decoders.release_lists`` (what a fine-tune calls first): the rows decoder and its pool go,
    the batch-1 decoder stays, and the next list builds a new rows decoder with the same texts."""
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    fast.swap(s, d)
    try:
        gen = dict(max_new_tokens=12, do_sample=False, eos_token_id=NEVER, pad_token_id=s.tokenizer.pad_token_id)

        def run():
            with torch.inference_mode():
                return paths.run(_on_gpu(s), paths.Request(_Job(), list(PROMPTS[:3]), gen, fast=True))
        first = run()
        rows = s.decoders.rows
        assert rows is not None and rows.single is d
        assert s.decoders.release_lists() == 0  # the CPU: no CUDA allocator to ask
        assert s.decoders.rows is None and s.decoders.single is d
        assert s.decoders.release_lists() == 0  # nothing held: nothing to do
        assert run() == first and s.decoders.rows is not None and s.decoders.rows is not rows
    finally:
        fast.forget(s)


def test_what_the_batched_path_refuses_says_why_and_the_list_still_runs(s, monkeypatch):
    ok = dict(max_new_tokens=8, do_sample=False)
    gpu = _on_gpu(s)
    assert fast.rows_why(gpu, ok) is None
    assert fast.rows_why(gpu, dict(ok, repetition_penalty=1.2, stop_strings=["x"], top_p=0.9)) is None
    assert "quantized (nf4)" in fast.rows_why(_on_gpu(s, quantization="nf4"), ok)
    assert "num_beams=2" in fast.rows_why(gpu, dict(ok, num_beams=2))
    assert "cpu" in fast.rows_why(s, ok)
    assert fast.rows_why(_on_gpu(s, model=_Spread(s.model)), ok).startswith("the model is spread")
    # quantized on a "GPU": neither the batched path nor continuous batching; padded generate runs it
    ran = []
    monkeypatch.setattr(paths, "run_plain", lambda session, req: ran.append(len(req.texts)) or ["x"] * len(req.texts))
    req = paths.Request(_Job(), list(PROMPTS[:2]), dict(ok))
    assert paths.run(_on_gpu(s, quantization="nf4"), req) == ["x", "x"] and ran == [2]
    assert req.stats.path == "generate" and req.stats.prompts_done == 2
    assert req.stats.detail.startswith("batched fast path off: the model is quantized (nf4)")
    assert "; continuous batching off: the model is quantized" in req.stats.detail
    with pytest.raises(NvkitError, match="batched fast path cannot run these prompts: the model is quantized"):
        paths.run(_on_gpu(s, quantization="nf4"), paths.Request(_Job(), list(PROMPTS[:2]), dict(ok), fast=True))
    req = paths.Request(_Job(), list(PROMPTS[:2]), dict(ok), fast=False)  # off on purpose: no reason given
    assert paths.run(_on_gpu(s), req) == ["x", "x"] and req.stats.detail == ""


class _Spread:
    """A model whose device map spans two GPUs (only what the check reads)."""

    def __init__(self, model):
        self.hf_device_map = {"model.layers.0": 0, "model.layers.1": 1}
        self.config = model.config


def test_graph_pools_go_with_the_last_graph_that_shares_them():
    """The allocator frees a graph pool once its graphs are gone, and a capture into that handle
    again fails inside torch: an arena (the batched path's graphs) and a cache (the batch-1 prefill
    graphs) forget the handle with their last graph and keep it while one is left."""
    from nvkit.generate.fast.paged_cache import Arena
    from nvkit.generate.fast.static_cache import Cache
    none = dict.fromkeys(["keys", "values", "cos", "sin", "tok", "pos", "table", "seed", "min_pos", "temperature",
                          "top_p", "penalty", "eos_mask", "out"])
    a = Arena(pages=2, rows=1, width=1, **none)
    a.pool = pool = object()
    a.graphs = {(1, "greedy", False): print, (8, "greedy", False): print, (1, "greedy", True): print}
    a.drop_graphs(lambda g: g[2])  # the adapter's graphs: the base ones still share the pool
    assert a.pool is pool and set(a.graphs) == {(1, "greedy", False), (8, "greedy", False)}
    a.drop_graphs(lambda g: g[0] == 8)
    assert a.pool is pool and list(a.graphs) == [(1, "greedy", False)]
    a.drop_graphs()
    assert a.pool is None and not a.graphs
    c = Cache(length=64, k=8)
    c.pool = pool
    c.prefills = {(64, False): print, (64, True): print}
    c.forget_lora()
    assert c.pool is pool and list(c.prefills) == [(64, False)]
    c.prefills = {(64, True): print}
    c.forget_lora()  # the adapter's prefill graphs were the only ones
    assert c.pool is None and not c.prefills


def test_lists_of_any_size_run_on_the_ladders_graphs(s):
    """Issue 39: a step runs in the smallest rung of the pool's ladder that holds its rows, and the
    first list captures the rungs up to 64 at once: lists that shrink and grow after it (1 to 64
    prompts) capture nothing, and each prompt still decodes as it does alone; rung 256 waits for a
    list of more than 64. Another sampling mode captures its own rungs, again at once; once the
    compiled step is due, a rung is captured when needed."""
    assert arena.ladder(256) == (1, 4, 16, 64, 256) and arena.ladder(8) == (1, 4, 8) and arena.ladder(2) == (1, 2)
    bd = _decoder(s.model)
    # short prompts only: on the CPU (matmul attention) a longer one widens the page tables, and a
    # new pool means new captures (test_a_pool_never_shrinks_and_grows_once_with_room_to_spare)
    many = [f"{p} {i}" for i in range(16) for p in PROMPTS if len(p) < 100][:70]
    captures = []
    for n in (3, 40, 2, 9, 1, 17, 64, 70, 5, 33):
        got = _batched(s, bd, many[:n], max_new_tokens=3, eos_token_id=NEVER)
        assert max(bd.last_batches) == next(c for c in (1, 4, 16, 64, 256) if c >= n)
        captures.append(bd.counts["compiles"] + bd.counts["graphs"])
        for prompt in (many[0], many[n - 1]):
            assert got[many.index(prompt)] == _plain(s, prompt, max_new_tokens=3, eos_token_id=NEVER)
    assert captures == [4] * 7 + [5] * 3
    assert {(k.batch, k.sampling[0]) for k in bd._arena.graphs} == {(c, "greedy") for c in (1, 4, 16, 64, 256)}
    _batched(s, bd, many[:2], max_new_tokens=3, do_sample=True, top_k=5)
    assert bd.counts["compiles"] + bd.counts["graphs"] == 9  # the sampling mode's rungs up to 64, at once
    bd.compile_due = lambda lora_on=False: True  # the compiled step due: a new mode's rung waits for its first use
    _batched(s, bd, many[:2], max_new_tokens=3, do_sample=True, top_p=0.5)
    assert bd.counts["compiles"] + bd.counts["graphs"] == 10
