"""The compile policy (nvkit.generate.fast.compile_policy): when a runner compiles, and that it keeps
the faster of the compiled and the uncompiled step, measured; and the one route a request takes
(nvkit.generate.fast.support)."""

from types import SimpleNamespace

import pytest

from nvkit.errors import NvkitError
from nvkit.generate import fast
from nvkit.generate.fast.compile_policy import CompilePolicy, Verdict, compile_fullgraph, time_replays
from nvkit.generate.fast.options import FastOptions


def test_a_compiled_step_measured_slower_is_not_kept_and_not_compiled_again():
    p = CompilePolicy(FastOptions(compile_after=1.0))
    assert p.waiting(graphs=True) and not p.due(graphs=True, lora_on=False)
    p.uncompiled_seconds = 1.0
    assert p.due(True, False) and not p.due(False, False)  # no graphs: never compiles
    slower = Verdict(uncompiled=0.010, compiled=0.012)
    assert not slower.keep_compiled and p.decide(False, slower) is False
    assert not p.compiled and p.declined(False) and not p.due(True, False)  # stays uncompiled
    assert p.due(True, True)  # the adapters' step is measured on its own
    assert not p.waiting(True)
    words = p.words("uncompiled with nvkit kernels", regional=True, tokens_per_replay=8)
    assert words == "uncompiled with nvkit kernels (measured 800 tok/s against 667 compiled)", words


def test_a_compiled_step_measured_faster_is_kept_and_later_captures_compile_at_once():
    p = CompilePolicy(FastOptions(compile_after=30.0))
    p.compile_next()
    assert p.due(True, False)
    assert p.decide(False, Verdict(uncompiled=0.012, compiled=0.010)) is True
    assert p.compiled and p.due(True, False)  # another cache or batch class compiles without waiting
    assert p.words("uncompiled", regional=True, tokens_per_replay=8) == \
        "compiled by layer (measured 800 tok/s against 667 uncompiled)"
    unmeasured = CompilePolicy(FastOptions())
    assert unmeasured.decide(False, None) is True and unmeasured.words("x", False, 8) == "compiled"


def test_a_failed_compile_or_compile_off_never_compiles():
    p = CompilePolicy(FastOptions(compile_after=0))
    p.failed("InductorError: boom", "the whole traceback")
    assert not p.due(True, False) and p.words("eager", False, 8) == "eager: torch.compile failed (InductorError: boom)"
    off = CompilePolicy(FastOptions(compile=False))
    off.compile_next()
    assert not off.due(True, False) and off.words("eager", False, 8) == "eager"


def test_each_compile_of_a_factorys_step_keeps_its_own_variants():
    """A session that loads model after model compiles the same factory's closure once per model:
    with one shared code object the ninth compile (recompile_limit) was a hard error under
    fullgraph. Here the limit is 1, so the second model's compile shows it."""
    import torch
    import torch._dynamo

    def factory(weight):
        def step(x):
            return torch.relu(x @ weight)
        return step

    with torch._dynamo.config.patch(recompile_limit=1):
        for n in (3, 4, 5):  # three "models", each weight of its own shape
            weight = torch.randn(n, 2)
            step = factory(weight)
            compiled = compile_fullgraph(step, backend="eager", dynamic=False)
            x = torch.randn(2, n)
            torch.testing.assert_close(compiled(x), step(x))
        with pytest.raises(Exception, match="fullgraph"):  # what the copy avoids: one code object, more variants
            for n in (3, 4, 5):
                torch.compile(factory(torch.randn(n, 2)), fullgraph=True, backend="eager", dynamic=False)(torch.randn(2, n))
    assert compile_fullgraph(len) is not None  # a builtin has no code to copy: compiled as it is


def test_time_replays_alternates_the_variants_and_keeps_each_ones_best_round():
    clock = [0.0]
    cost = {"a": 2.0, "b": 1.0}
    order = []

    def replay(name):
        def run():
            order.append(name)
            clock[0] += cost[name]
        return run
    resets = []
    t = time_replays({"a": replay("a"), "b": replay("b")}, lambda: resets.append(1), lambda: None,
                     replays=3, rounds=2, clock=lambda: clock[0])
    assert t == {"a": 2.0, "b": 1.0}
    assert order == ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4  # one untimed replay, then three, per turn
    assert len(resets) == 5  # before each turn, and once at the end


@pytest.fixture(scope="module")
def s():
    import nvkit
    from tests import demo_model
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def _on_gpu(s, **changes):
    return SimpleNamespace(**{**dict(model=s.model, tokenizer=s.tokenizer, device=SimpleNamespace(type="cuda"),
                                     quantization=None, decoders=fast.Decoders()), **changes})


def test_the_route_of_a_request_is_decided_once_with_its_tokens(s):
    greedy = dict(max_new_tokens=200, do_sample=False)
    r = fast.route(_on_gpu(s), ["Hello there"], greedy, None)
    assert r.path == "fast" and r.ids == [s.tokenizer("Hello there")["input_ids"]] and r.sampling.max_new_tokens == 200
    short = fast.route(_on_gpu(s), ["Hello there"], dict(greedy, max_new_tokens=8), None)
    assert short.path == "generate" and short.off[0].startswith("fast path off: not captured yet")
    assert fast.route(_on_gpu(s), ["Hello there"], dict(greedy, max_new_tokens=8), True).path == "fast"
    assert fast.route(_on_gpu(s), ["Hello"], greedy, False).path == "generate"
    assert fast.route(s, ["Hello"], greedy, None).path == "generate"  # on the CPU: nothing to say
    lst = fast.route(_on_gpu(s), ["a", "b"], greedy, None)
    assert lst.path == "fast batch" and len(lst.ids) == 2
    small = fast.route(_on_gpu(s), ["a", "b"], dict(greedy, max_new_tokens=8), None)
    assert small.path == "generate_batch" and "not captured yet" in small.why
    cb_off = fast.route(_on_gpu(s), ["a", "b"], dict(greedy, max_new_tokens=8, min_new_tokens=4), None)
    assert cb_off.path == "generate" and cb_off.off[1] == "continuous batching off: min_new_tokens not supported"
    forced = fast.route(_on_gpu(s, quantization="nf4"), ["a", "b"], greedy, True)
    assert forced.path == "generate" and "quantized" in forced.why and len(forced.off) == 1  # fast=True: no CB


def test_a_short_prompt_after_lists_runs_on_their_graphs_until_the_batch1_path_is_captured(s, monkeypatch):
    """A list has captured the rows and the batch-1 path is not captured: a short prompt runs on
    the rows (a batch of one, no capture to wait for) instead of plain generate; a streamed one,
    one the rows cannot run, or one the batch-1 path holds does not."""
    short = dict(max_new_tokens=8, do_sample=False)
    warm = fast.Decoders()
    warm.batched_ready = lambda: True  # the state a first list leaves (tests/gpu: afternoon's "1 prompt" line)
    greedy_mode = ("greedy", 0, False, False)
    warm.rows = SimpleNamespace(captured=lambda mode: mode == greedy_mode)  # the lists ran greedy
    r = fast.route(_on_gpu(s, decoders=warm), ["Hello there"], short, None)
    assert r.path == "fast batch" and not r.invariant and r.ids == [s.tokenizer("Hello there")["input_ids"]]
    assert r.off == ["the batch-1 fast path is not captured yet: the batched fast path, captured already, ran the prompt"]
    assert r.why.startswith("not captured yet")
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello there"], short, None, stream=True).path == "generate"
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], dict(short, max_new_tokens=200), None).path == "fast"
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], short, True).path == "fast"
    nf4 = fast.route(_on_gpu(s, decoders=warm, quantization="nf4"), ["Hello"], short, None)
    assert nf4.path == "generate" and "quantized" in nf4.why
    assert fast.route(_on_gpu(s), ["Hello there"], short, None).path == "generate"  # no list has run
    # where plain generate would not be the quicker answer (the capture on record is short), the
    # rows still answer a short prompt sooner than a batch-1 capture; a long one pays that capture
    from nvkit.generate.fast import support
    monkeypatch.setattr(support, "worth_capturing", lambda *a, **k: None)  # the estimate says: capture
    r = fast.route(_on_gpu(s, decoders=warm), ["Hello there"], short, None)
    assert r.path == "fast batch" and "answers a request of under 128 new tokens" in r.why, r
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], dict(short, max_new_tokens=200), None).path == "fast"
    assert fast.route(_on_gpu(s, decoders=fast.Decoders()), ["Hello"], short, None).path == "fast"  # no list yet
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], short, None, stream=True).path == "fast"
    # a sampling mode the rows hold no graph of pays the batch-1 capture, which later requests keep
    sampled = dict(short, do_sample=True, top_k=5)
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], sampled, None).path == "fast"
    # the batch-1 path holds greedy graphs, none with a minimum length: the rows, which do, run it
    warm.single = SimpleNamespace(ready=lambda n, sampling, exact=False: not exact or sampling.key == greedy_mode)
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], short, None).path == "fast"
    warm.rows = SimpleNamespace(captured=lambda mode: True)
    assert fast.route(_on_gpu(s, decoders=warm), ["Hello"], dict(short, min_new_tokens=8), None).path == "fast batch"


def test_each_decoder_says_which_sampling_modes_it_holds_a_graph_of(s):
    """What the route asks before it sends a short prompt to the rows. The batch-1 decoder's
    ``ready`` counts a mode not captured yet as ready, ``ready(exact=True)`` does not (a minimum
    length is a mode of its own); the rows hold a mode (``captured``) once a list has run in it."""
    import torch
    from nvkit.generate.fast.rows import BatchedDecoder
    ids = s.tokenizer("Hello there", return_tensors="pt")["input_ids"]
    greedy = fast.resolve(s.model, dict(max_new_tokens=4, do_sample=False))[0]
    at_least = fast.resolve(s.model, dict(max_new_tokens=4, do_sample=False, min_new_tokens=4))[0]
    assert greedy.key != at_least.key
    single = fast.FastDecoder(s.model, k_steps=2, graphs=False)
    rows = BatchedDecoder(single, max_rows=4)
    assert not single.ready(ids.shape[1], greedy, exact=True) and not rows.captured(greedy.key)
    with torch.inference_mode():
        single.generate(ids, greedy)
        assert single.ready(ids.shape[1], greedy, exact=True) and single.ready(ids.shape[1], at_least)
        assert not single.ready(ids.shape[1], at_least, exact=True)
        assert not rows.captured(at_least.key)
        rows.generate([ids[0].tolist(), ids[0, :2].tolist()], at_least)
    assert rows.captured(at_least.key) and not rows.captured(greedy.key)
    rows.release()
    single.release()
    assert not rows.captured(at_least.key)


def test_a_path_asked_for_directly_refuses_settings_it_cannot_run(s):
    from nvkit.generate.fast import support
    with pytest.raises(NvkitError, match="The batched fast path cannot run this request: num_beams=2"):
        support.forced(s, ["a", "b"], dict(max_new_tokens=4, num_beams=2), "fast batch")
    assert s.generate("Hello", max_new_tokens=2) is not None  # the session goes on


def test_prepare_says_why_the_fast_path_cannot_run_here(s):
    with pytest.raises(NvkitError, match="The fast path cannot run here: the model is on cpu"):
        fast.prepare(s)
    with pytest.raises(NvkitError, match="max_new_tokens must be a whole number"):
        fast.prepare(s, max_new_tokens=0)
    with pytest.raises(NvkitError, match="compile must be True or False, not 'no'"):
        fast.prepare(s, compile="no")
    assert s.generate("Hello", max_new_tokens=2) is not None


@pytest.mark.parametrize("asked, match", [("triton", "named two kernels; say which: 'triton-fused'"),
                                          ("flash", "attention must be one of 'matmul', 'triton-split'")])
def test_one_word_per_attention_kernel(asked, match):
    """'triton' once meant the split kernel at batch 1 and the paged one in lists: it is refused
    with the two names, so a setting never picks another kernel than the one its user meant."""
    with pytest.raises(NvkitError, match=match):
        FastOptions(attention=asked)
    assert FastOptions(attention="triton-split").attention == "triton-split"


def test_prepare_compiles_only_when_asked(s):
    """``prepare`` (a tutorial's warm-up) compiles the step at its capture; ``compile=False`` (what
    ``compare`` asks for) captures the step a request would run now and leaves the compile to the
    session's own policy."""
    import torch
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=8, do_sample=False))
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    with torch.inference_mode():
        d.prepare(8, sampling, prefill_up_to=0, compile=False)
        assert not d.policy.due(True, False)
        d.prepare(8, sampling, prefill_up_to=0)
        assert d.policy.due(True, False)
    d.release()


@pytest.mark.parametrize("compiled_s, kept", [(0.012, False), (0.008, True)])
def test_both_runners_keep_the_faster_graph_measured_against_the_uncompiled_one(s, monkeypatch, compiled_s, kept):
    """``GraphRunner.keep_faster``, which the batch-1 and the rows decoder both call after a
    compiled capture: the uncompiled graph of the same shape is captured only when there is none,
    the two are measured against each other, the policy keeps the faster, and a loss says so."""
    from nvkit import events
    from nvkit.generate.fast.single import FastDecoder
    runner = FastDecoder(s.model, graphs=False, compile_after=0.0)
    measured = []
    monkeypatch.setattr(runner, "measure", lambda c, u, reset, replays=None: measured.append((c, u, replays))
                        or Verdict(uncompiled=0.010, compiled=compiled_s))
    graph = SimpleNamespace(replay=lambda: None)
    captured = []
    uncompiled = lambda: None  # noqa: E731

    since = events.now()
    verdict, got, compiled = runner.keep_faster(graph, None, lambda: captured.append(1) or uncompiled,
                                                lambda: None, False, 8, "on a 64-token cache", replays=3)
    assert captured == [1] and measured == [(graph.replay, uncompiled, 3)]
    assert compiled is kept and verdict.compiled == compiled_s
    assert (got is graph) if kept else (got.replay is uncompiled)
    said = [e.text for e in events.events(since) if "slower" in e.text]
    assert said == ([] if kept else ["fast decode: the compiled step is slower on a 64-token cache (measured 800 "
                                     "tok/s against 667 compiled); the uncompiled step runs there"])
    again = runner.keep_faster(graph, uncompiled, lambda: captured.append(2), lambda: None, (False, 4), 32, "at 4 rows")
    assert captured == [1] and again[2] is kept  # an uncompiled graph at hand is not captured again
