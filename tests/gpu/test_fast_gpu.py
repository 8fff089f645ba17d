"""nvkit's fast decode path and batch path on a real GPU, and the decode benchmark table.

- demo model (trained, so greedy choices are clear-cut): the fast path's text is identical to plain
  ``generate``'s, streaming and Stop work through it, the generation options it runs itself give
  plain's text, the others fall back and the stats line says why;
- Qwen3-0.6B shape (random bf16 weights: near-tied logits make paths drift apart after a few
  tokens): the logits of the first steps agree within bf16 tolerance while the tokens agree;
- a list of prompts goes through continuous batching where the batched fast path cannot run, and
  comes back in input order;
- ``nvkit.benchmarks.decode.run`` prints the table (run with ``-s`` to see it).
"""

import os
import time

import pytest
import torch

import nvkit
import nvkit.generate.fast as fast
from nvkit.errors import NvkitError
from tests import demo_model  # noqa: E402

PROMPTS = ["NVIDIA GPUs are", "The memory of a GPU", "Hello there", "A model is loaded when"]


def _same_as_plain_greedy(s, decoder, prompt: str, n: int) -> None:
    """The decoder's greedy ids for ``prompt`` equal transformers' generate (cut after EOS)."""
    ids = s.tokenizer(prompt, return_tensors="pt").to("cuda")["input_ids"]
    with torch.inference_mode():
        ref = s.model.generate(ids, max_new_tokens=n, do_sample=False,
                               pad_token_id=s.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        sampling, why = fast.resolve(s.model, dict(max_new_tokens=n, do_sample=False))
        assert why is None
        got = decoder.generate(ids, sampling)
    eos = set(sampling.eos)
    ref = ref[:next((i + 1 for i, t in enumerate(ref) if t in eos), len(ref))]
    assert got == ref, (prompt, got, ref)


def test_fast_is_token_identical_to_plain_greedy(demo_cuda):
    s = demo_cuda
    t = time.perf_counter()
    s.generate(PROMPTS[0], max_new_tokens=64, fast=True)  # pays the capture
    print(f"\nfirst fast call (capture included): {time.perf_counter() - t:.1f} s; {s.last_stats}")
    for p in PROMPTS:
        _same_as_plain_greedy(s, fast.decoder(s), p, 64)
        plain = s.generate(p, max_new_tokens=64, fast=False)
        assert s.last_stats.path == "generate"
        quick = s.generate(p, max_new_tokens=64)  # default: fast on CUDA
        # the default's first steps: uncompiled, with nvkit's kernels (FastOptions.compile_after)
        assert s.last_stats.path == "fast" and s.last_stats.detail.startswith("fused step, uncompiled with nvkit kernels")
        # nvkit's attention kernel and six-kernel layers ran: a kernel that fails on the GPU falls back to
        # torch's operations (still plain greedy's tokens, at a quarter of the rate) and would pass unseen
        assert "triton-fused attention (auto), six-kernel layers" in s.last_stats.detail, s.last_stats.detail
        assert quick == plain
        print(f"{p!r}: {s.last_stats}")


def test_fast_streams_and_stops(demo_cuda):
    s = demo_cuda
    pieces = []
    out = s.generate(PROMPTS[1], max_new_tokens=48, stream=pieces.append, fast=True)
    assert "".join(pieces) == out and len(pieces) >= 2
    st = s.last_stats
    assert st.path == "fast" and st.time_to_first_token is not None and st.time_to_first_token < st.seconds

    seen = []

    def stop_after_first(piece):
        seen.append(piece)
        s.stop()  # from the worker thread: ends at the next replay boundary

    s.generate(PROMPTS[0], max_new_tokens=400, stream=stop_after_first, fast=True, eos_token_id=10 ** 7)
    st = s.last_stats
    assert st.stopped and st.path == "fast"
    assert st.new_tokens <= 1 + 2 * fast.decoder(s).k, st


def test_top_k_1_sampling_is_greedy_alone_and_in_a_list(demo_cuda):
    """Issue 39: ``top_k=1`` keeps one token, so sampling with it is greedy token for token whatever
    the seed or temperature, on the batch-1 fast path and on the rows of a list."""
    s = demo_cuda
    greedy = s.generate(PROMPTS[0], max_new_tokens=48, fast=True)
    for seed, temperature in ((7, 1.0), (11, 0.6)):
        sampled = s.generate(PROMPTS[0], max_new_tokens=48, do_sample=True, top_k=1, temperature=temperature,
                             seed=seed, fast=True)
        assert s.last_stats.path == "fast" and sampled == greedy, (seed, temperature)
    greedy_list = s.generate(PROMPTS, max_new_tokens=48, fast=True)
    assert s.last_stats.path == "fast batch", s.last_stats.detail
    sampled = s.generate(PROMPTS, max_new_tokens=48, do_sample=True, top_k=1, seed=3, fast=True)
    assert s.last_stats.path == "fast batch" and sampled == greedy_list


def test_fast_sampling_is_seeded_and_options_fall_back(demo_cuda):
    s = demo_cuda
    kw = dict(max_new_tokens=32, do_sample=True, temperature=0.9, top_p=0.9, top_k=20, seed=7)
    a = s.generate(PROMPTS[2], fast=True, **kw)  # captures this sampling mode
    assert s.last_stats.path == "fast"
    b = s.generate(PROMPTS[2], **kw)  # short, but captured now: the default takes the fast path
    assert s.last_stats.path == "fast" and a == b
    s.generate(PROMPTS[2], max_new_tokens=8, no_repeat_ngram_size=2)
    st = s.last_stats  # not implemented by the fast path: plain generate, and the stats line says why
    assert st.path == "generate" and st.detail.startswith("fast path off: no_repeat_ngram_size=2"), st.detail
    with pytest.raises(NvkitError, match="no_repeat_ngram_size"):
        s.generate(PROMPTS[2], max_new_tokens=8, no_repeat_ngram_size=2, fast=True)
    for kw in (dict(repetition_penalty=1.3), dict(min_new_tokens=20), dict(stop_strings=["GPU"])):
        plain = s.generate(PROMPTS[2], max_new_tokens=32, fast=False, **kw)
        quick = s.generate(PROMPTS[2], max_new_tokens=32, **kw)  # runs on the fast path now
        assert s.last_stats.path == "fast" and quick == plain, (kw, quick, plain)
    assert s.generate(PROMPTS[2], max_new_tokens=4)  # still usable
    chat = s.generate("What is a GPU?", max_new_tokens=24, chat=True, system="Answer briefly.", fast=True)
    assert s.last_stats.path == "fast" and isinstance(chat, str)


@pytest.mark.parametrize("kind", ["triton-split", "triton-fused"])
def test_triton_attention_is_token_identical(demo_cuda, kind):
    """nvkit's split-cache decode-attention kernels (attention='triton-split'; 'triton-fused' also does
    the q/k norms, RoPE and cache writes), compiled and captured: the same greedy tokens as plain
    generate on the demo model."""
    s = demo_cuda
    d = fast.FastDecoder(s.model, attention=kind, compile_after=0)
    d.policy.measure = False  # the compiled step is what is checked, whichever measures faster
    for p in PROMPTS:
        _same_as_plain_greedy(s, d, p, 48)
    assert d.compiled, d.compile_detail
    d.release()


def _demo_decodes_as_plain(s, words: str, **variant) -> None:
    """An uncompiled ``FastDecoder`` with ``variant`` on the demo model: its description says
    ``words`` and its greedy tokens are plain generate's, captured and replayed."""
    d = fast.FastDecoder(s.model, compile=False, **variant)
    assert words in d.describe(), d.describe()
    for p in PROMPTS:
        _same_as_plain_greedy(s, d, p, 48)
    d.release()


def _qwen3_traces(tokens: int, variants: dict) -> dict:
    """name -> (greedy tokens, each step's logits) of PROMPTS[0] on the Qwen3-0.6B shape in bf16,
    one uncompiled ``FastDecoder`` per variant (its keywords)."""
    q = nvkit.load(demo_model.shaped("qwen3-0.6b"), device_map="cuda", dtype="bfloat16")
    try:
        ids = q.tokenizer(PROMPTS[0], return_tensors="pt").to("cuda")["input_ids"]
        sampling, _ = fast.resolve(q.model, dict(max_new_tokens=tokens, do_sample=False))
        runs = {}
        for name, kw in variants.items():
            dq = fast.FastDecoder(q.model, compile=False, **kw)
            with torch.inference_mode():
                runs[name] = dq.trace(ids, sampling)
            dq.release()
        return runs
    finally:
        q.unload()


def test_six_kernel_layers_are_token_identical_and_logits_close_on_the_qwen3_shape(demo_cuda):
    """``StepVariant.gemv`` (issue 38: each projection in ``kernels.gemv`` with its norm, residual
    sum or gated activation fused in), uncompiled and captured: the demo model's greedy tokens are
    plain generate's; on the Qwen3-0.6B shape in bf16 the first steps' logits stay within the
    tolerance the usual step keeps against plain (``test_logits_close_on_qwen3_shape``)."""
    _demo_decodes_as_plain(demo_cuda, "six-kernel layers: uncompiled", gemv=True)
    runs = _qwen3_traces(16, {"usual": dict(gemv=False), "six": dict(gemv=True)})
    (usual, usual_logits), (ours, our_logits) = runs["usual"], runs["six"]
    n = next((i for i, (a, b) in enumerate(zip(usual, ours)) if a != b), len(usual))
    assert n >= 4, (usual, ours)  # random weights: near-ties may part the paths after a few steps
    print(f"\nsix-kernel layers on the Qwen3 shape: {n} of 16 tokens alike")
    for i, (a, b) in enumerate(zip(usual_logits[:n], our_logits[:n])):
        diff, scale = (a.float() - b.float()).abs().max().item(), a.float().abs().max().item()
        print(f"step {i}: max |Δlogit| {diff:.4f} of max |logit| {scale:.2f}")
        assert diff <= 0.05 * max(scale, 1.0), (i, diff, scale)  # a few bf16 ulps of the largest logit


def test_one_compiled_layer_decodes_as_plain_greedy_and_compiles_sooner(demo_cuda):
    """``regional=True`` (one decoder layer compiled for every layer): the same greedy tokens as
    plain generate on the demo model, compiled and captured; the preparation's seconds of both are
    printed for the record (nvkit's artifacts are off here, but inductor's own caches may already
    hold the whole step's from the tests before)."""
    s = demo_cuda
    seconds = {}
    for regional in (True, False):
        d = fast.FastDecoder(s.model, regional=regional, disk_cache=False, compile_after=0)
        d.policy.measure = False  # both compiled steps are checked, whichever measures faster
        for p in PROMPTS:
            _same_as_plain_greedy(s, d, p, 48)
        assert d.compiled and d.regional == regional, d.compile_detail
        assert d.describe().startswith("fused step, compiled by layer" if regional else "fused step, compiled,")
        seconds[regional] = dict(d.timings)
        d.release()
    print(f"\nprepared by layer: {seconds[True]}\nprepared whole step: {seconds[False]}")


def test_auto_attention_survives_a_failing_triton_kernel(demo_cuda, monkeypatch):
    """attention="auto" picks triton-fused; where nvkit's kernel fails on a GPU (injected here: the op
    raises while inductor traces it), the decoder captures the compiled matmul step instead of the
    slower eager Triton one, says why, and decodes plain greedy's tokens."""
    from nvkit.generate.kernels import decode_attention

    def broken(*args, **kwargs):
        raise RuntimeError("injected: this GPU cannot run the kernel")

    s = demo_cuda
    monkeypatch.setattr(decode_attention, "decode_attention_rope", broken)
    d = fast.FastDecoder(s.model, attention="auto", compile_after=0)
    d.policy.measure = False
    assert d.attention == "triton-fused"
    _same_as_plain_greedy(s, d, PROMPTS[0], 48)
    assert d.attention == "matmul" and (d.attention_why or "").startswith("attention='triton-fused' failed"), \
        d.attention_why
    print(f"\nfell back: {d.attention_why}")
    assert d.compiled, d.compile_detail
    d.release()


def test_batch_path_keeps_input_order(demo_cuda, monkeypatch):
    """Continuous batching, where the batched fast path does not run (injected here; its own
    tests are tests/gpu/test_batched_gpu.py): input order, progress, the reason in the stats."""
    from nvkit.generate.fast import support
    s = demo_cuda
    monkeypatch.setattr(support, "rows_why", lambda session, gen: "injected for this test")
    singles = [s.generate(p, max_new_tokens=12, fast=False) for p in PROMPTS]
    t = time.perf_counter()
    done = []
    outs = s.generate(PROMPTS, max_new_tokens=12, on_progress=lambda st: done.append(st.prompts_done))
    print(f"\nbatch of {len(PROMPTS)}: {s.last_stats} ({time.perf_counter() - t:.1f} s)")
    assert s.last_stats.path == "generate_batch"
    assert s.last_stats.detail == "batched fast path off: injected for this test"
    assert len(outs) == len(PROMPTS) and done and done[-1] == len(PROMPTS)
    for single, batched in zip(singles, outs):
        # same greedy choices; a different attention kernel may flip a late near-tie, so the start must agree
        assert batched.split()[:2] == single.split()[:2], (single, batched)


def test_logits_close_on_qwen3_shape():
    s = nvkit.load(demo_model.shaped("qwen3-0.6b"), device_map="cuda", dtype="bfloat16")
    try:
        ids = s.tokenizer("NVIDIA GPUs are fast because memory bandwidth", return_tensors="pt").to("cuda")["input_ids"]
        n = 16
        with torch.inference_mode():
            ref = s.model.generate(ids, max_new_tokens=n, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True, eos_token_id=10 ** 7,
                                   pad_token_id=s.tokenizer.pad_token_id)
            ref_tokens = ref.sequences[0, ids.shape[1]:].tolist()
            sampling, why = fast.resolve(s.model, dict(max_new_tokens=n, do_sample=False, eos_token_id=10 ** 7))
            assert why is None
            d = fast.decoder(s)
            got, got_logits = d.trace(ids, sampling)
        compared = []
        for i in range(n):
            if got[:i] != ref_tokens[:i]:
                break  # after a divergence the two runs condition on different text
            a, b = got_logits[i].float(), ref.logits[i][0].float()
            diff = (a - b).abs().max().item()
            scale = b.abs().max().item()
            compared.append((i, diff, scale))
        print("\nstep, max |Δlogit|, max |logit|:", [(i, round(x, 4), round(y, 2)) for i, x, y in compared])
        print(f"tokens agree for {sum(1 for a, b in zip(got, ref_tokens) if a == b)} of {n} (first divergence "
              f"{next((i for i, (a, b) in enumerate(zip(got, ref_tokens)) if a != b), None)})")
        assert len(compared) >= 2
        for i, diff, scale in compared:
            assert diff <= 0.05 * max(scale, 1.0), (i, diff, scale)  # a few bf16 ulps of the largest logit
        t = time.perf_counter()
        s.generate("Hello there", max_new_tokens=256, eos_token_id=10 ** 7)
        print(f"Qwen3-0.6B shape, fast path: {s.last_stats} (call {time.perf_counter() - t:.1f} s, capture included)")
        s.generate("Hello there", max_new_tokens=256, eos_token_id=10 ** 7)
        print(f"Qwen3-0.6B shape, fast path again: {s.last_stats}")
        _profile_one_replay(fast.decoder(s))
    finally:
        freed = s.unload()
        print(f"unload freed {freed / 2**30:.2f} GiB; allocated now {torch.cuda.memory_allocated() / 2**30:.2f} GiB")


def _profile_one_replay(d):
    """Kernels in one K-step replay and where the GPU time goes (printed for the notes)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        replay = d._cache.graphs[(("greedy", 0, False, False), False, False)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            replay()
            torch.cuda.synchronize()
        ka = prof.key_averages()
        n = sum(e.count for e in ka if e.device_type.name == "CUDA")
        print(f"one replay = {d.k} steps: {n} GPU kernels ({n / d.k:.0f} per step)")
        print(ka.table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))
    except Exception as e:  # noqa: BLE001 - profiling is informative only
        print(f"(profile skipped: {type(e).__name__}: {e})")


@pytest.mark.skipif(os.environ.get("NVKIT_SKIP_BENCH") == "1", reason="NVKIT_SKIP_BENCH=1")
def test_decode_benchmark_table():
    from nvkit.benchmarks import decode as bench_decode
    df = bench_decode.run(model=demo_model.shaped("qwen3-0.6b"), new_tokens=int(os.environ.get("NVKIT_BENCH_TOKENS", "256")),
                          n_prompts=64, batch_new_tokens=int(os.environ.get("NVKIT_BENCH_BATCH_TOKENS", "128")),
                          repeats=3)  # the median of 3 alternating rounds, as `nvkit bench --decode` and the docs' rows
    out = os.environ.get("OUT")
    if out:
        df.to_csv(os.path.join(out, "decode_bench.csv"), index=False)
    fast_row = df[df["path"] == "fast"]
    assert len(fast_row) == 1 and fast_row["tokens_per_s"].notna().all(), df.to_string()
    rate = float(fast_row["tokens_per_s"].iloc[0])
    print(f"\nfast path batch 1: {rate:.0f} tok/s (target ≥ 1000)")
    assert rate >= 1000, df.to_string()


def test_the_decode_profile_sees_the_replayed_kernels():
    """``nvkit bench --decode --profile``'s numbers on the demo model: the kernels inside the CUDA
    graph replays are counted, and the GPU is never busier than the wall time."""
    from nvkit.benchmarks import decode_profile
    summary = decode_profile.profile(demo_model.path(), new_tokens=64)
    print("\n" + summary.text())
    assert summary.kernels > 10 and 0 < summary.busy_us <= summary.wall_us * 1.02, summary
    assert summary.by_kind and summary.roofline is not None and 0 < summary.roofline < 1


def test_a_lists_profile_splits_its_prefill_from_its_steps():
    """``nvkit bench --decode --profile --n-prompts N`` on the demo model: the list's replayed steps
    are counted per step apart from its prompts' prefill, and neither part's GPU is busier than its
    wall time."""
    from nvkit.benchmarks import decode_profile
    p = decode_profile.profile_list(demo_model.path(), prompts=8, new_tokens=32)
    print("\n" + p.text())
    assert p.rows == 8 and 0 < p.decode.tokens <= 32 and "batch" in p.decode.detail, p
    for part in (p.prefill, p.decode):
        assert part.kernels > 1 and 0 < part.busy_us <= part.wall_us * 1.05, part
    assert p.decode.roofline is not None and 0 < p.decode.roofline < 1, p.decode
