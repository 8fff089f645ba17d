"""Generation on the CPU: streaming order, Stop, chat template, batch order, seeds, bad values, and
the fast path's decode logic (run without graph capture) against plain ``generate``."""

import dataclasses
import threading
import time

import pytest
import torch

from transformers import AutoModelForCausalLM

from tests import demo_model  # noqa: E402

import nvkit
from nvkit.benchmarks import decode as bench_decode
from nvkit.generate import batch as generation, paths
from nvkit.generate.fast import cuda_graphs as fast_graphs, single as fast_decoder
from nvkit.generate.fast.static_cache import GraphKey
import nvkit.generate.fast as fast
from nvkit.errors import NvkitError, error_summary
from nvkit.generate.stats import GenerationStats

NEVER = 10 ** 7  # an eos id no model produces: generation runs to max_new_tokens or Stop


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def test_stream_pieces_arrive_in_order_and_make_the_output(s):
    pieces, progress = [], []
    out = s.generate("NVIDIA GPUs are", max_new_tokens=12, stream=pieces.append, eos_token_id=NEVER,
                     on_progress=lambda st: progress.append(st.new_tokens))
    assert "".join(pieces) == out
    assert len(pieces) >= 2
    assert progress == sorted(progress) and progress[-1] >= 11
    st = s.last_stats
    assert st.path == "generate" and st.new_tokens == 12 and not st.stopped
    assert st.time_to_first_token is not None and 0 < st.time_to_first_token <= st.seconds


def test_stop_ends_within_a_few_tokens(s):
    seen = []

    def cb(piece):
        seen.append(piece)
        if len(seen) == 3:
            s.stop()

    s.generate("Hello there", max_new_tokens=300, stream=cb, eos_token_id=NEVER)
    st = s.last_stats
    assert st.stopped
    assert st.new_tokens <= 3 + 3, st  # pieces can lag tokens by one or two (held-back UTF-8)


def test_stop_from_another_thread_while_awaiting(s):
    import asyncio

    async def main():
        task = asyncio.ensure_future(s.agenerate("Hello there", max_new_tokens=5000, eos_token_id=NEVER))
        await asyncio.sleep(0.3)
        s.stop()
        t = time.perf_counter()
        await task
        return time.perf_counter() - t

    waited = asyncio.run(main())
    assert s.last_stats.stopped and s.last_stats.new_tokens < 5000
    assert waited < 2.0


def test_chat_uses_the_tokenizer_template(s):
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    s.generate("What is a GPU?", max_new_tokens=3, chat=True, system="Answer briefly.", history=history)
    expected = s.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Answer briefly."}, *history, {"role": "user", "content": "What is a GPU?"}],
        add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>system" in expected
    assert s.last_stats.prompt_tokens == len(s.tokenizer(expected)["input_ids"])
    s.generate("What is a GPU?", max_new_tokens=3)
    assert s.last_stats.prompt_tokens == len(s.tokenizer("What is a GPU?")["input_ids"])


def test_batch_comes_back_in_input_order(s):
    prompts = ["NVIDIA GPUs are", "Hello there", "The quick brown fox jumps", "A"]
    singles = [s.generate(p, max_new_tokens=6, eos_token_id=NEVER) for p in prompts]
    outs = s.generate(prompts, max_new_tokens=6, eos_token_id=NEVER)
    assert s.last_stats.path == "generate" and s.last_stats.prompts_done == len(prompts)
    assert outs == singles
    assert s.generate(tuple(prompts[:2]), max_new_tokens=2) == s.generate(prompts[:2], max_new_tokens=2)


def test_batch_cache_holds_every_request_and_no_more():
    # 64 prompts of 63 tokens + 128 new: one page of 256 each, plus the page being written
    assert generation.cache_blocks([63] * 64, 128) == 128
    assert generation.cache_blocks([300, 10], 200) == (2 + 1) + (1 + 1)  # 500 tokens: 2 pages; 210: 1
    assert generation.cache_blocks([1], 1) == 2
    assert generation.cache_blocks([256], 0, page_size=256) == 2
    # a batch that would not fit: transformers sizes the cache from memory and runs it in waves
    assert generation.cache_blocks([63] * 64, 128, bytes_per_block=29 << 20, free_bytes=130 << 30) == 128
    assert generation.cache_blocks([1000] * 10_000, 1000, bytes_per_block=29 << 20, free_bytes=130 << 30) is None


def test_a_forward_of_the_batch_takes_no_more_tokens_than_its_cache_holds():
    # transformers warms its CUDA graphs with one request of max_batch_tokens; a cache sized for the
    # batch holds blocks × 256 tokens in one request, so the warm-up must ask for less
    assert generation.batch_tokens(2) == 256
    assert generation.batch_tokens(5) == 4 * 256
    assert generation.batch_tokens(128) == 8192  # a large cache keeps transformers' default
    assert generation.batch_tokens(None) is None  # transformers sizes cache and batch from memory
    for blocks in (generation.cache_blocks([63] * 12, 12), generation.cache_blocks([300, 10], 200)):
        assert generation.batch_tokens(blocks) < blocks * 256


def test_block_bytes_follow_the_config(s):
    cfg = s.model.config.get_text_config()
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert generation._block_bytes(s.model) == (cfg.num_hidden_layers * 256 * 2 * cfg.num_key_value_heads * hd
                                                * s.model.dtype.itemsize)


def test_seed_makes_sampling_repeatable(s):
    kw = dict(max_new_tokens=16, do_sample=True, temperature=1.0, top_k=0, eos_token_id=NEVER)
    a = s.generate("Hello there", seed=11, **kw)
    b = s.generate("Hello there", seed=11, **kw)
    c = s.generate("Hello there", seed=12, **kw)
    assert a == b
    assert a != c


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens="5"), "max_new_tokens"),
    (dict(do_sample="yes"), "do_sample"),
    (dict(temperature=-1.0, do_sample=True), "temperature"),
    (dict(top_p=1.5, do_sample=True), "top_p"),
    (dict(top_k=-3, do_sample=True), "top_k"),
    (dict(seed="x"), "seed"),
    (dict(fast=True), "CUDA"),
    (dict(stream="print"), "stream"),
    (dict(chat=True, history=None, system=None, max_new_tokens=1, prompt=""), "empty"),
])
def test_bad_values_raise_and_the_session_stays_usable(s, kwargs, match):
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", "Hello there")
    with pytest.raises(NvkitError, match=match):
        s.generate(prompt, **kwargs)
    assert isinstance(s.generate("Hello there", max_new_tokens=2), str)


def test_bad_prompts(s):
    for bad in ([], [""], 5, ["ok", 3]):
        with pytest.raises(NvkitError):
            s.generate(bad, max_new_tokens=2)
    with pytest.raises(NvkitError, match="one prompt"):
        s.generate(["a", "b"], stream=print)
    assert s.generate("Hello there", max_new_tokens=1)


def test_cpu_path_choice_is_recorded(s):
    s.generate("Hello there", max_new_tokens=2, fast=None)
    assert s.last_stats.path == "generate"
    s.generate("Hello there", max_new_tokens=2, fast=False)
    assert s.last_stats.path == "generate"
    why = fast.single_why(s, dict(max_new_tokens=2, do_sample=False))
    assert why and "CUDA" in why


# --- the fast path's logic, without CUDA graphs ----------------------------------------------------

def test_resolve_knows_what_the_fast_path_implements(s):
    ok, why = fast.resolve(s.model, dict(max_new_tokens=5, do_sample=False))
    assert why is None and ok.key == ("greedy", 0, False, False) and ok.max_new_tokens == 5
    smp, why = fast.resolve(s.model, dict(max_new_tokens=5, do_sample=True, temperature=0.5, top_p=0.9))
    assert why is None and smp.key == ("sample", 50, True, False) and smp.temperature == 0.5  # top_k 50: transformers' default
    pen, why = fast.resolve(s.model, dict(max_new_tokens=5, do_sample=False, repetition_penalty=1.2, min_new_tokens=3,
                                          stop_strings="GPU"))
    assert why is None and pen.key == ("greedy", 0, False, True) and pen.stop_strings == ("GPU",)
    assert pen.eos_allowed_from(10) == 13
    for extra, name in ((dict(num_beams=2), "num_beams"), (dict(no_repeat_ngram_size=2), "no_repeat_ngram_size"),
                        (dict(foo=1), "foo")):
        none, why = fast.resolve(s.model, dict(max_new_tokens=5, do_sample=False, **extra))
        assert none is None and name in why, extra
    from nvkit.generate.fast.static_cache import prefill_class, size_class
    assert size_class(10, 4096, 40960) == 4096 and size_class(5000, 4096, 40960) == 8192
    assert size_class(10, 4096, 1024) == 1024  # never past the model's whole context
    assert prefill_class(1, 4096) == 16 and prefill_class(17, 4096) == 32 and prefill_class(3000, 4096) is None


def test_k_step_decoding_matches_plain_greedy_and_honours_stop(s):
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    ids = s.tokenizer("NVIDIA GPUs are", return_tensors="pt")["input_ids"]
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=30, do_sample=False, eos_token_id=NEVER))
    with torch.inference_mode():
        ref = s.model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=NEVER,
                               pad_token_id=s.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        chunks = []
        got = d.generate(ids, sampling, on_tokens=chunks.append)
        assert got == ref
        assert [len(c) for c in chunks] == [1] + [4] * 7 + [1]  # first token, then K per replay, cut at max
        # an eos inside a chunk ends the text right after it
        eos = ref[9]
        sampling_eos, _ = fast.resolve(s.model, dict(max_new_tokens=30, do_sample=False, eos_token_id=eos))
        got_eos = d.generate(ids, sampling_eos)
        assert got_eos == ref[:ref.index(eos) + 1]
        stop = threading.Event()
        stop.set()
        assert len(d.generate(ids, sampling, stop_event=stop)) == 1  # checked before each replay
        # Stop pressed while the first token streams: the replay queued ahead of it still lands, no more
        stop_late = threading.Event()
        assert d.generate(ids, sampling, on_tokens=lambda c: stop_late.set(), stop_event=stop_late) == ref[:5]
    with pytest.raises(NvkitError, match="k_steps"):
        fast.FastDecoder(s.model, k_steps=0, graphs=False)


def test_fused_step_keeps_the_model_and_follows_weight_changes(s):
    """The fused step re-points q/k/v and gate/up at one tensor each: the model's own forward must
    give the same logits as before, the fused and the model-forward steps the same tokens, and a
    weight replaced afterwards (as merging an adapter does) must be decoded, with nothing captured
    again: the new values are copied into the tensors the graphs read."""
    ids = s.tokenizer("The memory of a GPU", return_tensors="pt")["input_ids"]
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=16, do_sample=False, eos_token_id=NEVER))
    with torch.inference_mode():
        before = s.model(ids).logits
        fused = fast.FastDecoder(s.model, k_steps=4, graphs=False)
        assert fused.fused and fused.fused_why is None
        assert torch.equal(s.model(ids).logits, before)
        attn = s.model.model.layers[0].self_attn
        assert attn.q_proj.weight.data_ptr() == fused._fw.layers[0].qkv.data_ptr()
        plain = fast.FastDecoder(s.model, k_steps=4, graphs=False, fused=False)
        assert not plain.fused
        a, fused_logits = fused.trace(ids, sampling)
        assert a == plain.generate(ids, sampling) == fused.generate(ids, sampling)
        assert len(fused_logits) == len(a)
        with pytest.raises(NvkitError, match="attention"):
            fast.FastDecoder(s.model, graphs=False, attention="flash")
        with pytest.raises(NvkitError, match="Unknown fast-path option"):
            fast.FastDecoder(s.model, graphs=False, head="cublas")  # a bench experiment that lost, gone
        # replace a weight the way a merge does (new tensor): decoded, and the module reads ours again
        captured = dict(fused.counts)
        old = attn.v_proj.weight.data.clone()
        attn.v_proj.weight.data = old * 0
        try:
            changed = fused.generate(ids, sampling)
            assert attn.v_proj.weight.data_ptr() == fused._fw.layers[0].qkv[2 * attn.v_proj.weight.shape[0]:].data_ptr() \
                or attn.v_proj.weight.data_ptr() != old.data_ptr()
            assert changed == plain.generate(ids, sampling) and changed != a  # both decode the changed model
            assert dict(fused.counts) == captured  # nothing captured again
        finally:
            attn.v_proj.weight.data.copy_(old)
        assert torch.equal(s.model(ids).logits, before) and fused.generate(ids, sampling) == a
    with pytest.raises(NvkitError, match="fused"):
        class _Cfg:
            def get_text_config(self):
                return self
            model_type = "gpt2"
            vocab_size = 8
        fast.FastDecoder(type("M", (), {"config": _Cfg(), "get_input_embeddings": lambda self: s.model.get_input_embeddings()})(),
                         graphs=False, fused=True)


def test_fusing_under_inference_mode_leaves_the_model_trainable(tmp_path):
    """Generation runs under inference_mode, and that is where the fast path fuses the weights
    (and copies replaced ones in). A training step after a fast generate failed with "Inference
    tensors cannot be saved for backward" before: the fused weights must stay ordinary tensors."""
    m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        d = fast.FastDecoder(m, k_steps=2, graphs=False)
        attn = m.model.layers[0].self_attn
        attn.k_proj.weight.data = attn.k_proj.weight.data.clone()  # as a merge does: copied in on the next call
        sampling, _ = fast.resolve(m, dict(max_new_tokens=3, do_sample=False, eos_token_id=NEVER))
        d.generate(ids, sampling)
    assert d._fw.sync() == 0 and not attn.q_proj.weight.is_inference() and not attn.k_proj.weight.is_inference()
    m.train()
    loss = m(input_ids=ids, labels=ids).loss
    loss.backward()
    assert attn.q_proj.weight.grad is not None and torch.isfinite(loss)


def _worth(s, text, gen):
    """fast.worth_capturing as the route asks it: the prompt's tokens and its resolved sampling."""
    return fast.worth_capturing(s, len(s.tokenizer(text)["input_ids"]), gen, fast.resolve(s.model, gen)[0])


def test_fast_default_waits_for_nothing_on_short_requests(s):
    """fast=None: a short request when nothing is compiled yet is answered by plain generate (the
    compile would cost far more than it saves); once the session's fast path is compiled, every
    request that fits its cache takes it, whatever its length or sampling mode."""
    greedy = dict(max_new_tokens=24, do_sample=False)
    why = _worth(s, "Hello there", greedy)
    assert why and "not captured yet" in why and "prepare" in why  # the reasons: tests/generate/test_first_request.py
    assert _worth(s, "Hello there", dict(greedy, max_new_tokens=fast.default_options().min_tokens)) is None
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    fast.swap(s, d)  # as fast.decoder(session) keeps it
    try:
        sampling, _ = fast.resolve(s.model, dict(greedy, eos_token_id=NEVER))
        ids = s.tokenizer("Hello there", return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            d.generate(ids, sampling)  # compiles the session's step for its cache
        assert _worth(s, "Hello there", dict(greedy, eos_token_id=NEVER)) is None
        assert _worth(s, "word " * 300, greedy) is None  # another length: the same cache
        assert _worth(s, "Hello there", dict(greedy, do_sample=True, temperature=0.7)) is None
        assert _worth(s, "Hello there", dict(greedy, max_new_tokens=1, repetition_penalty=1.2)) is None
        # longer than the cache holds (the demo's whole context is 1024 positions): not prepared
        assert _worth(s, "word " * 1200, greedy)
    finally:
        fast.forget(s)


def test_triton_attention_is_refused_where_it_cannot_run(s, monkeypatch):
    with pytest.raises(NvkitError, match="fused decode step"):
        fast.FastDecoder(s.model, graphs=False, fused=False, attention="triton-split")
    odd = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
    odd.config.head_dim = 48  # read by the check only; the weights stay as they are
    with pytest.raises(NvkitError, match="power-of-two head_dim"):
        fast.FastDecoder(odd, graphs=False, attention="triton-split")
    # triton-fused applies the q/k norms itself: only plain per-head RMS norms with one epsilon
    other = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
    attn0 = other.model.layers[0].self_attn
    assert fast.FastDecoder(other, graphs=False, attention="triton-fused").attention == "triton-fused"
    attn0.k_norm.variance_epsilon = 1e-3
    with pytest.raises(NvkitError, match="different epsilons.*attention='triton-split' does"):
        fast.FastDecoder(other, graphs=False, attention="triton-fused")
    attn0.q_norm = torch.nn.LayerNorm(attn0.head_dim)
    with pytest.raises(NvkitError, match="not an RMS norm per head or over all heads"):
        fast.FastDecoder(other, graphs=False, attention="triton-fused")
    assert fast.FastDecoder(other, graphs=False, attention="triton-split").attention == "triton-split"  # norms stay the model's
    # "auto" takes triton-fused where it fits and says why not where it does not: on a CPU, never
    on_cpu = fast.FastDecoder(s.model, graphs=False, attention="auto")
    assert on_cpu.attention == "matmul" and "run on CUDA GPUs" in on_cpu.attention_why
    monkeypatch.setattr(fast_decoder, "triton_cannot_run_on", lambda device: None)  # as on a GPU, for the rest
    assert fast.FastDecoder(s.model, graphs=False, attention="auto").attention == "triton-fused"
    auto = fast.FastDecoder(other, graphs=False, attention="auto")
    assert auto.attention == "matmul" and "not an RMS norm per head or over all heads" in auto.attention_why
    assert fast.FastDecoder(s.model, graphs=False, fused=False, attention="auto").attention == "matmul"
    assert auto.options.attention == "auto"  # decoder(session, attention="auto") keeps it, not rebuilds
    import sys
    import nvkit.generate.kernels as kernels
    for name in ("decode_attention", "paged_attention", "common"):  # the kernel modules, imported or not
        monkeypatch.delitem(sys.modules, f"nvkit.generate.kernels.{name}", raising=False)
        monkeypatch.delattr(kernels, name, raising=False)  # else `from ..kernels import` finds it there
    monkeypatch.setitem(sys.modules, "triton", None)  # as if not installed
    with pytest.raises(NvkitError, match="needs the triton package"):
        fast.FastDecoder(s.model, graphs=False, attention="triton-split")


def test_auto_attention_gives_way_to_matmul_when_the_triton_step_fails(s, monkeypatch):
    """attention="auto" (triton-fused where it fits) must not leave a user on a GPU where nvkit's
    Triton kernels fail with a broken or slow decoder: the capture retries with "matmul" and says why.
    The failure is injected at the capture (what ptxas or inductor raise there on such a GPU)."""
    from nvkit import events
    monkeypatch.setattr(fast_decoder, "triton_cannot_run_on", lambda device: None)  # "auto" decides as on a GPU
    ids = s.tokenizer("NVIDIA GPUs are", return_tensors="pt")["input_ids"]
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=12, do_sample=False, eos_token_id=NEVER))
    tried = []

    def capture_with(d):
        def fake(device, body, rewind, *, compiling, warmups=3, inductor=None, pool=None, timings=None, parts=None):
            tried.append(d.attention)
            if d.attention != "matmul":
                raise RuntimeError("InductorError: ptxas fatal   : Value 'sm_61' is not defined\nthe cause")
            return "graph"
        return fake

    with torch.inference_mode():
        ref = s.model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=NEVER,
                               pad_token_id=s.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        d = fast.FastDecoder(s.model, k_steps=4, graphs=False, attention="auto")
        assert d.attention == "triton-fused"
        assert d.describe() == "fused step, eager, no CUDA graphs, triton-fused attention (auto), 4 steps per replay"
        key = GraphKey(("greedy", 0, False, False), False)
        c = d._cache_for(40)
        old_step = d._step(c, False)
        monkeypatch.setattr(fast_graphs, "capture", capture_with(d))
        assert d._capture(c, key, True) == ("graph", True)  # the compiled step's capture
        assert tried == ["triton-fused", "matmul"]
        assert d.attention == "matmul" and d.options.attention == "auto"
        assert "attention='triton-fused' failed on this GPU" in d.attention_why and "the cause" in d.attention_why
        assert d.compile_error is None  # the matmul step compiles: nothing fell back to eager
        assert d._step(c, False) is not old_step and d._cache is c
        assert "failed on this GPU" in events.events()[-1].text
        assert "matmul attention (auto)" in d.describe()
        monkeypatch.undo()
        monkeypatch.setattr(fast_decoder, "triton_cannot_run_on", lambda device: None)
        assert d.generate(ids, sampling) == ref  # the rebuilt cache decodes with matmul attention
        # asked for by name, a failing Triton step is not swapped for another attention
        named = fast.FastDecoder(s.model, k_steps=4, graphs=False, attention="triton-fused", compile=False)
        nc = named._cache_for(40)
        monkeypatch.setattr(fast_graphs, "capture", capture_with(named))
        with pytest.raises(RuntimeError, match="ptxas"):
            named._capture(nc, key, False)
        assert named.attention == "triton-fused" and named.attention_why is None
    # the stats line says how the fast path ran (the panel shows the same words)
    st = GenerationStats(new_tokens=9, seconds=0.5, time_to_first_token=0.1, path="fast", detail=d.describe())
    assert str(st).endswith("· fast (fused step, eager, no CUDA graphs, matmul attention (auto), 4 steps per replay)")
    assert str(GenerationStats(new_tokens=2, seconds=1.0)).endswith("· generate")
    plain = fast.FastDecoder(s.model, k_steps=8, graphs=False, fused=False)
    assert plain.describe() == "model forward, eager, no CUDA graphs, 8 steps per replay"


def test_fast_sampling_is_seeded(s):
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    ids = s.tokenizer("Hello there", return_tensors="pt")["input_ids"]
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=12, do_sample=True, temperature=0.9, top_k=20,
                                              top_p=0.95, eos_token_id=NEVER))
    with torch.inference_mode():
        torch.manual_seed(5)
        a = d.generate(ids, sampling)
        torch.manual_seed(5)
        b = d.generate(ids, sampling)
    assert a == b and len(a) == 12


def test_run_refuses_fast_on_cpu(s):
    class _Job:
        stop_event = threading.Event()
    with pytest.raises(NvkitError, match="CUDA"):
        paths.run(s, paths.Request(_Job, ["x"], dict(max_new_tokens=1, do_sample=False), fast=True))


def test_bench_decode_rejects_bad_values_and_runs_on_cpu(s):
    with pytest.raises(NvkitError, match="new_tokens"):
        bench_decode.run(model=s, new_tokens=0, show=False)
    with pytest.raises(NvkitError, match="path"):
        bench_decode.run(model=s, paths=["warp drive"], show=False)
    with pytest.raises(NvkitError):
        bench_decode.run(model=42, show=False)
    df = bench_decode.run(model=s, new_tokens=4, prompt_len=8, n_prompts=3, batch_new_tokens=3, decode=True, show=False)
    assert list(df["path"]) == list(bench_decode.SINGLE_PATHS + bench_decode.BATCH_PATHS)
    plain = df[df["path"] == "generate"].iloc[0]
    assert plain["tokens"] == 4 and plain["vs_plain"] == 1.0
    assert df[df["path"] == "fast"]["note"].iloc[0].startswith("skipped")
    assert df[df["path"] == "nvkit batch"]["tokens"].iloc[0] == 9


def test_bench_decode_fast_variants_parse_and_refuse_typos(s):
    opts = bench_decode.fast_options
    assert opts("generate") is None and opts("nvkit batch") is None
    assert opts("fast") == dict(compile=True, attention=None, pdl=None, inductor={}, k_steps=None, regional=None,
                                lora_fold=None, tune=None, gemv=None, experts=None, lora_merged=None)
    assert opts("fast+matmul")["attention"] == "matmul"
    assert opts("fast eager")["compile"] is False
    assert opts("fast without pdl")["pdl"] is False
    assert opts("fast+split")["attention"] == "triton-split"
    assert opts("fast+pdl+tfused+combo+k16") == dict(compile=True, attention="triton-fused", pdl=True,
                                                  inductor={"combo_kernels": True}, k_steps=16, regional=None,
                                                  lora_fold=None, tune=None, gemv=None, experts=None,
                                                  lora_merged=None)
    assert opts("fast+notune")["tune"] is False
    assert opts("fast+eager+gemv")["gemv"] is True and opts("fast+eager+gemv")["compile"] is False
    assert opts("fast+eager+nogemv")["gemv"] is False and opts("fast+eager")["gemv"] is None  # None: the default
    assert opts("fast+eager+experts")["experts"] is True and opts("fast+eager")["experts"] is None
    assert opts("fast+eager+apart")["lora_merged"] is False and opts("fast+eager")["lora_merged"] is None
    assert opts("fast+regional")["regional"] is True
    assert opts("fast+whole")["regional"] is False
    # the adapter rows take the same options after "fast lora"
    assert bench_decode.adapter_options("fast lora") == opts("fast")
    assert bench_decode.adapter_options("fast lora+fold")["lora_fold"] is True and opts("fast lora+fold") is None
    assert bench_decode.adapter_options("fast") is None and bench_decode.adapter_options("fast loraX") is None
    with pytest.raises(NvkitError, match="fast-path option"):
        bench_decode.adapter_options("fast lora+flod")
    for typo in ("fast+pld", "fast+k", "fast+kx2", "fast+"):
        with pytest.raises(NvkitError, match="fast-path option"):
            opts(typo)
    with pytest.raises(NvkitError, match="fast-path option"):
        bench_decode.run(model=s, paths=["fast+turbo"], show=False)
    # variants are accepted by name and, on a CPU, skipped with the reason (not measured as the default)
    df = bench_decode.run(model=s, new_tokens=3, prompt_len=4, paths=["generate", "fast+pdl+k4"], show=False)
    assert list(df["path"]) == ["generate", "fast+pdl+k4"]
    assert df["note"].iloc[1] == "skipped: the fast path needs CUDA"
    df = bench_decode.run(model=s, new_tokens=3, prompt_len=4, paths=["generate", "fast lora+fold"], show=False)
    assert list(df["path"]) == ["generate", "fast lora+fold"]
    assert df["note"].iloc[1] == "skipped: the fast path needs CUDA"


def test_fast_pdl_and_inductor_options(s, monkeypatch):
    import torch._inductor.config as inductor_config
    d = fast.FastDecoder(s.model, k_steps=2, graphs=False, inductor={"combo_kernels": True})
    assert d.pdl  # default on where torch can emit it (this one can)
    with d.inductor_options(compiling=True):
        assert inductor_config.triton.enable_pdl is True and inductor_config.coordinate_descent_tuning is True
        assert inductor_config.combo_kernels is True
    assert inductor_config.triton.enable_pdl is False and not inductor_config.combo_kernels  # only around the capture
    with pytest.raises(NvkitError, match="inductor option"):
        fast.FastDecoder(s.model, graphs=False, inductor={"warp_speed": 9})
    assert not fast.FastDecoder(s.model, graphs=False, pdl=False).pdl
    with pytest.raises(NvkitError, match="pdl must be True, False or None"):
        fast.FastDecoder(s.model, graphs=False, pdl="yes")
    # a torch whose inductor cannot emit PDL: off by default, a clear error when asked for
    monkeypatch.delattr(inductor_config.triton, "enable_pdl")
    assert not fast.FastDecoder(s.model, graphs=False).pdl
    with pytest.raises(NvkitError, match="Programmatic Dependent Launch"):
        fast.FastDecoder(s.model, graphs=False, pdl=True)


@pytest.mark.parametrize("arch", ["llama", "llama-bias", "qwen2", "mistral", "qwen3", "smollm3", "granite", "olmo2"])
def test_fused_step_matches_the_model_for_each_family(arch):
    """Each architecture in fast.fused_fit.FUSABLE (random tiny fp32 weights, so ties are not an issue at
    fp32): the fused step's logits equal the model's own forward step by step, biases included."""
    import transformers as T
    torch.manual_seed(0)
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=320, max_position_embeddings=512)
    cfg = {"llama": lambda: T.LlamaConfig(**common), "llama-bias": lambda: T.LlamaConfig(attention_bias=True, **common),
           "qwen2": lambda: T.Qwen2Config(**common), "mistral": lambda: T.MistralConfig(sliding_window=None, **common),
           "qwen3": lambda: T.Qwen3Config(head_dim=16, **common),
           # layers 1 and 3 without RoPE; multipliers far from 1, so a missed one changes every logit
           "smollm3": lambda: T.SmolLM3Config(no_rope_layer_interval=2, pad_token_id=0, **common),
           "granite": lambda: T.GraniteConfig(embedding_multiplier=3.0, residual_multiplier=0.3, logits_scaling=5.0,
                                              attention_multiplier=0.2, **common),
           "olmo2": lambda: T.Olmo2Config(pad_token_id=0, **common)}[arch]()
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    if arch == "llama-bias":
        with torch.no_grad():
            for layer in model.model.layers:
                for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    lin.bias.normal_()
    ids = torch.randint(0, 320, (1, 7))
    sampling, why = fast.resolve(model, dict(max_new_tokens=12, do_sample=False, eos_token_id=NEVER))
    assert why is None
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=NEVER, pad_token_id=0)[0, 7:].tolist()
        plain = fast.FastDecoder(model, k_steps=4, graphs=False, fused=False)
        d = fast.FastDecoder(model, k_steps=4, graphs=False)
        assert d.fused, d.fused_why
        got, fused_logits = d.trace(ids, sampling)
        fused_logits = torch.stack(fused_logits)
        plain_logits = torch.stack(plain.trace(ids, sampling)[1])
    assert got == ref
    assert torch.allclose(fused_logits, plain_logits, atol=1e-4, rtol=1e-4), (fused_logits - plain_logits).abs().max()


def test_the_fused_steps_norms_round_as_each_familys_own():
    """In bf16 the fused steps' RMS norm equals each family's module bit for bit: Llama's rounds
    before the weight multiplies, OLMo 2's after (``weight_first``); the two differ, so the choice
    matters beyond the float32 identity tests above."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from nvkit.generate.fast.llama_step import rms_norm
    torch.manual_seed(0)
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    for cls, weight_first in ((LlamaRMSNorm, False), (Olmo2RMSNorm, True)):
        norm = cls(64, eps=1e-6).to(torch.bfloat16)
        with torch.no_grad():
            norm.weight.normal_()
            assert torch.equal(rms_norm(x, norm.weight, 1e-6, weight_first), norm(x))
            assert not torch.equal(rms_norm(x, norm.weight, 1e-6, not weight_first), norm(x))


def test_compile_error_summary_keeps_the_cause():
    """A failed compile is reported in one line that ends with the cause (inductor's messages
    start with a header and end with what went wrong)."""
    e = RuntimeError("SubprocException: An exception occurred in a subprocess:\n\nTraceback (most recent call last):\n"
                     "  File \"x.py\", line 3, in f\n\nCompilationError: at 12:4: unsupported loop bound\n")
    got = error_summary(e)
    assert got.startswith("RuntimeError: SubprocException: An exception occurred in a subprocess:")
    assert got.endswith("CompilationError: at 12:4: unsupported loop bound")
    assert error_summary(ValueError("one line")) == "ValueError: one line"
    assert error_summary(KeyError()) == "KeyError"
    long = error_summary(RuntimeError("a\n" + "b" * 1000))
    assert len(long) == 300 and long.endswith("…")
    # dynamo's shape (torch 2.13, an exception raised inside a fullgraph compile): the cause sits
    # before the advice and the user-code stack at the end
    import torch

    def broken(x):
        raise RuntimeError("the kernel cannot run here")

    with pytest.raises(Exception) as info:
        torch.compile(lambda x: broken(x * 2) + 1, fullgraph=True, dynamic=False)(torch.ones(3))
    got = error_summary(info.value)
    assert "the kernel cannot run here" in got and "TORCHDYNAMO_VERBOSE" not in got, got


def test_bench_decode_rounds_alternate_and_report_the_median(s):
    with pytest.raises(NvkitError, match="repeats"):
        bench_decode.run(model=s, paths=["generate"], repeats=0, show=False)
    df = bench_decode.run(model=s, new_tokens=4, prompt_len=8, paths=["generate"], repeats=3, show=False)
    r = df.iloc[0]
    assert r["rounds"] == 3 and r["spread_pct"] >= 0 and r["tokens_per_s"] > 0
    one = bench_decode.run(model=s, new_tokens=4, prompt_len=8, paths=["generate"], show=False)
    assert "rounds" not in one.columns  # a single pass keeps the old table

    class St:
        def __init__(self, rate, seconds, ttft):
            self.decode_tokens_per_second, self.seconds, self.time_to_first_token = rate, seconds, ttft
    row = {}
    bench_decode._summarise_rounds(row, [St(10, 3.0, 0.1), St(30, 1.0, 0.3), St(20, 2.0, 0.2)], [1.0, None, 1.5])
    assert row == dict(rounds=3, seconds=2.0, tokens_per_s=20.0, ttft_ms=200.0, peak_mem_gib=1.5, spread_pct=100.0)


def test_bench_decode_model_generate_runs_transformers_beside_the_plain_path(s):
    df = bench_decode.run(model=s, new_tokens=5, prompt_len=8, paths=["generate", "model.generate"], repeats=2,
                          show=False)
    ours, theirs = (df[df["path"] == p].iloc[0] for p in ("generate", "model.generate"))
    # both rows time the same prompt and the same exact number of tokens, with a first-token time
    assert ours["tokens"] == theirs["tokens"] == 5
    assert theirs["rounds"] == 2 and theirs["ttft_ms"] > 0 and theirs["tokens_per_s"] > 0
    assert "transformers generate" in theirs["note"]
    assert theirs["note"].split("prompt ")[1] == ours["note"].split("prompt ")[1]
    # the session is left as it was: nvkit's own generate still answers
    assert s.generate("Hello", max_new_tokens=2) is not None


def test_swap_keeps_decoders_side_by_side(s):
    model = s.model
    before = fast.swap(s, None)
    try:
        a = fast.FastDecoder(model, k_steps=2, graphs=False)
        b = fast.FastDecoder(model, k_steps=3, graphs=False)
        assert fast.swap(s, a) is None and fast.decoder(s) is a
        assert fast.swap(s, b) is a and fast.decoder(s) is b   # a was handed back, not released
        assert fast.decoder(s, k_steps=3) is b                   # same settings: kept
        assert fast.swap(s, None) is b and fast.current(s) is None

        class Other:
            model = object()
        with pytest.raises(NvkitError, match="another model"):
            fast.swap(s, Other())
        assert fast.current(s) is None  # refused: nothing changed
    finally:
        fast.swap(s, before)


def test_fast_options_come_from_the_environment_once_and_name_a_bad_variable():
    opts = fast.FastOptions.from_env({"NVKIT_FAST_K": "4", "NVKIT_FAST_ATTENTION": "matmul", "NVKIT_FAST_FUSED": "0",
                                      "NVKIT_FAST_COMPILE": "off", "NVKIT_FAST_MIN_TOKENS": "0"})
    assert (opts.k_steps, opts.attention, opts.fused, opts.compile, opts.min_tokens) == (4, "matmul", False, False, 0)
    assert fast.FastOptions.from_env({}) == fast.FastOptions()
    for env, var in [({"NVKIT_FAST_K": "eight"}, "NVKIT_FAST_K"), ({"NVKIT_FAST_K": "0"}, "NVKIT_FAST_K"),
                     ({"NVKIT_FAST_FUSED": "maybe"}, "NVKIT_FAST_FUSED"),
                     ({"NVKIT_FAST_ATTENTION": "reduce"}, "NVKIT_FAST_ATTENTION"),
                     ({"NVKIT_FAST_CACHE_TOKENS": "3000"}, "NVKIT_FAST_CACHE_TOKENS")]:
        with pytest.raises(NvkitError, match=var):
            fast.FastOptions.from_env(env)
    assert fast.default_options() is fast.default_options()  # read once per process
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.k_steps = 2
    assert opts.replace(k_steps=None) == opts and opts.replace(k_steps=2).k_steps == 2
    with pytest.raises(NvkitError, match="Unknown fast-path option"):
        opts.replace(warp=9)


def test_bench_decode_adapter_row_is_skipped_on_cpu_and_leaves_the_model_plain(s):
    df = bench_decode.run(model=s, new_tokens=3, prompt_len=4, paths=["generate", "fast lora"], show=False)
    assert list(df["path"]) == ["generate", "fast lora"] and df["note"].iloc[1] == "skipped: the fast path needs CUDA"
    seen = []
    bench_decode._with_adapter(s, lambda: seen.append(type(s.model).__name__))
    assert seen == ["PeftModel"] and type(s.model).__name__ == "Qwen3ForCausalLM"
    assert not any("lora" in n for n, _ in s.model.named_parameters())


def test_a_sessions_generations_share_one_worker_thread_that_unload_ends():
    """Per-thread CUDA caches (cuDNN's attention plans, cuBLAS handles) are set up once per
    session: every request of a session runs on the same worker thread, never the caller's, and
    unloading the model ends it."""
    s2 = nvkit.load("demo", device_map="cpu", dtype="float32")
    threads = []
    for prompt in ("NVIDIA GPUs are", ["A", "Hello there"]):
        s2.generate(prompt, max_new_tokens=2, on_progress=lambda st: threads.append(threading.current_thread()))
    threads.append(s2._job._thread)
    assert len(threads) >= 3 and len({id(t) for t in threads}) == 1 and threads[0] is not threading.main_thread(), threads
    worker = threads[0]
    s2.unload()
    worker.join(10)
    assert not worker.is_alive()
