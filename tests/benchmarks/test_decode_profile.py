"""The decode profile's arithmetic (nvkit.benchmarks.decode_profile) on plain kernel records, and
``nvkit bench --decode --profile``'s refusals; the profile itself needs CUDA (tests/gpu)."""

import contextlib
import io

import pytest
import torch

from nvkit.benchmarks import backends, decode_profile
from nvkit.errors import NvkitError


def test_busy_time_is_the_union_of_the_kernels():
    assert decode_profile.busy_us([(0, 10), (5, 12), (20, 25)]) == 17  # an overlap counts once
    assert decode_profile.busy_us([(3, 4), (0, 10)]) == 10  # one inside another
    assert decode_profile.busy_us([]) == 0


def test_a_summary_per_token():
    kernels = [("sm90_xmma_gemm_bf16", 0, 30), ("triton_red_fused_add_rms_norm_0", 30, 40),
               ("paged_rope_split_kernel", 50, 60), ("sm90_xmma_gemm_bf16", 60, 90)]
    s = decode_profile.summarize(kernels, tokens=2, wall_s=200e-6, bytes_per_token=400_000, bandwidth=8e9)
    assert s.wall_us == 100 and s.kernels == 2 and s.busy_us == 40
    assert s.gap_share == pytest.approx(0.6)
    assert s.achieved == pytest.approx(4e9) and s.roofline == pytest.approx(0.5)
    assert s.by_kind["GEMM"] == (30, 1) and s.by_kind["nvkit attention"] == (5, 0.5)
    assert s.by_kind["inductor/Triton fused"] == (5, 0.5)
    text = s.text()
    assert "50% of the HBM roofline" in text and "60% idle" in text and "GEMM" in text
    assert decode_profile.summarize(kernels, 2, 200e-6, 400_000, None).roofline is None


def test_a_long_prompts_summary_counts_the_kv_cache_it_reads_and_names_the_costliest_kernels():
    kernels = [("gemv_a", 0, 30), ("attn_split", 30, 70), ("gemv_a", 70, 100), ("tiny", 100, 101)]
    s = decode_profile.summarize(kernels, tokens=2, wall_s=200e-6, bytes_per_token=300_000, bandwidth=8e9,
                                 kv_bytes_per_token=100_000)
    assert s.achieved == pytest.approx(4e9) and s.roofline == pytest.approx(0.5)  # weights and KV over the time
    assert list(s.by_name) == ["gemv_a", "attn_split", "tiny"] and s.by_name["gemv_a"] == (30, 1)
    text = s.text()
    assert "MiB of KV cache" in text and text.index("gemv_a") < text.index("attn_split") < text.index("tiny")
    many = [(f"k{i}", i, 2 * i) for i in range(40)]
    top = decode_profile.summarize(many, 1, 1e-3, 1, None).by_name
    assert len(top) == decode_profile.TOP_KERNELS and "k39" in top and "k0" not in top
    assert "KV" not in decode_profile.summarize(kernels, 2, 200e-6, 1, None).text()  # none counted, none said


def test_the_kv_bytes_a_request_reads_grow_with_its_positions_and_stop_at_a_window():
    from transformers import Gemma3TextConfig, Qwen3Config
    from nvkit.benchmarks import families
    full = Qwen3Config(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, hidden_size=32)
    per_position = 4 * 2 * 8 * 2 * 2  # layers x KV heads x head_dim x (K, V) x bytes
    assert families.kv_bytes_read(full, 2, 0) == per_position
    assert families.kv_bytes_read(full, 2, 99) == 100 * per_position
    # the mean over a request's decode steps: positions 10..13 for a 10-token prompt and 5 new tokens
    assert decode_profile.mean_kv_bytes(full, 2, 10, 5) == (11 + 12 + 13 + 14) * per_position // 4
    gemma = Gemma3TextConfig(num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                             hidden_size=32, sliding_window=16, sliding_window_pattern=6)
    kinds = gemma.layer_types
    assert kinds.count("sliding_attention") == 5
    layer = 1 * 8 * 2 * 2
    assert families.kv_bytes_read(gemma, 2, 1000) == 5 * 16 * layer + 1001 * layer  # a sliding layer: its window
    assert families.kv_bytes_read(gemma, 2, 3) == 6 * 4 * layer  # inside the window, every layer alike


def test_an_untied_input_embedding_counts_one_row_and_a_tied_one_is_read_whole_once():
    from transformers import LlamaConfig, LlamaForCausalLM
    from nvkit.benchmarks import families
    small = dict(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2)
    tied = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, **small))
    untied = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **small))
    every = sum(p.numel() * p.element_size() for p in tied.parameters())  # the shared matrix once
    assert families.bytes_per_token(tied) == every
    embed = untied.get_input_embeddings().weight
    assert families.bytes_per_token(untied) == sum(p.numel() * p.element_size() for p in untied.parameters()) \
        - embed.numel() * embed.element_size() + 16 * embed.element_size()


def test_a_corpus_prompt_has_about_the_tokens_asked_even_past_the_corpus():
    from nvkit import demo
    from nvkit.benchmarks.decode import corpus_prompt
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(demo.path())
    for n in (8, 300):
        assert abs(len(tok(corpus_prompt(tok, n))["input_ids"]) - n) <= 2
    with open(demo.CORPUS, encoding="utf-8") as f:
        words = len(f.read().split())
    # longer than the corpus: it repeats (the chat markers it holds are left out of a prompt's text)
    assert len(tok(corpus_prompt(tok, words))["input_ids"]) >= 0.9 * words


@pytest.mark.parametrize("tokens, wall", [(0, 1.0), (3, 0.0), (3, -1.0)])
def test_a_summary_needs_tokens_and_time(tokens, wall):
    with pytest.raises(NvkitError, match="at least one token"):
        decode_profile.summarize([], tokens, wall, 1, None)


def _cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = backends.cli_main(list(argv))
    return code, err.getvalue()


@pytest.mark.parametrize("argv, match", [
    (("--profile",), "--profile belongs to --decode"),
    (("--lora", "--profile"), "--profile belongs to --decode"),
    (("--decode", "--profile", "--repeats", "3"), "--repeats does not apply to --decode --profile"),
    (("--decode", "--profile", "--new-tokens", "1"), "at least 2"),
    (("--decode", "--profile", "--json"), "--json does not apply"),
    (("--decode", "--profile", "--prompt-len", "0"), "--prompt-len must be at least 1"),
    (("--decode", "--profile", "--k-steps", "4"), "it takes --new-tokens, --prompt-len and --paths"),
    (("--decode", "--profile", "--paths", "generate"), "takes one fast path"),
    (("--decode", "--profile", "--paths", "fast,fast+eager"), "takes one fast path"),
    (("--decode", "--profile", "--paths", "fast+bogus"), "Unknown fast-path option"),
    (("--decode", "--profile", "--n-prompts", "1"), "--n-prompts must be at least 2"),
    (("--decode", "--profile", "--n-prompts", "8", "--batch-new-tokens", "1"), "--batch-new-tokens must be at least 2"),
    (("--decode", "--profile", "--n-prompts", "8", "--new-tokens", "64"),
     "--new-tokens does not apply to --decode --profile --n-prompts; it takes --n-prompts, --batch-new-tokens and"),
    (("--decode", "--profile", "--n-prompts", "8", "--prompt-len", "64"), "--prompt-len does not apply"),
    (("--decode", "--profile", "--batch-new-tokens", "8"), "--batch-new-tokens does not apply to --decode --profile;"),
    (("--decode", "--profile", "--n-prompts", "8", "--paths", "generate"), "takes one fast path"),
])
def test_the_command_refuses_what_does_not_apply(argv, match):
    code, err = _cli(*argv)
    assert code == 2 and match in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_without_cuda_the_profile_says_why():
    code, err = _cli("--decode", "--profile", "--new-tokens", "4")
    assert code == 2 and "needs a GPU" in err, err
    code, err = _cli("--decode", "--profile", "--paths", "fast+eager+gemv")
    assert code == 2 and "needs a GPU" in err, err
    code, err = _cli("--decode", "--profile", "--n-prompts", "4", "--batch-new-tokens", "8")
    assert code == 2 and "needs a GPU" in err, err
    with pytest.raises(NvkitError, match="runs a fast path"):
        decode_profile.profile("demo", path="generate")
    with pytest.raises(NvkitError, match="runs a fast path"):
        decode_profile.profile_list("demo", path="generate")


@pytest.mark.parametrize("prompts, tokens", [(1, 8), (4, 1), (2.0, 8), (4, "8")])
def test_a_list_profile_refuses_a_list_too_small_to_split(prompts, tokens):
    with pytest.raises(NvkitError, match="at least 2 prompts and 2 new tokens"):
        decode_profile.profile_list("demo", prompts=prompts, new_tokens=tokens)


def test_a_lists_decode_is_the_whole_list_less_its_prefill_per_step():
    # the prefill alone: a GEMM and a norm; the whole list: the same, then two steps of a GEMM and attention
    first = [("sm90_xmma_gemm_bf16", 0, 100), ("triton_red_fused_add_rms_norm_0", 100, 110)]
    whole = first + [("sm90_xmma_gemm_bf16", 200, 230), ("paged_rope_split_kernel", 230, 240),
                     ("sm90_xmma_gemm_bf16", 300, 330), ("paged_rope_split_kernel", 330, 340)]
    p = decode_profile.list_summaries(whole, 500e-6, first, 150e-6, rows=4, steps=2, bytes_per_step=700_000,
                                      kv_bytes_per_step=0, bandwidth=8e9)
    assert p.prefill.tokens == 1 and p.prefill.wall_us == pytest.approx(150) and p.prefill.kernels == 2
    assert p.prefill.busy_us == 110 and p.prefill.roofline is None  # no bytes counted for the prompts
    d = p.decode
    assert d.tokens == 2 and d.wall_us == pytest.approx(175) and d.kernels == 2 and d.busy_us == 40
    assert d.by_kind == {"GEMM": (30, 1), "nvkit attention": (10, 1)}  # the prefill's norm is not a step's
    assert d.achieved == pytest.approx(4e9) and d.roofline == pytest.approx(0.5)
    assert list(d.by_name) == ["sm90_xmma_gemm_bf16", "paged_rope_split_kernel"]
    text = p.text()
    assert "a list of 4 prompts" in text and "per step of 4 rows (2 steps)" in text
    assert "per prefill of every prompt: 150.0 µs wall" in text and "MiB of weights per step" in text
    assert text.index("prefill of every prompt") < text.index("step of 4 rows")


@pytest.mark.parametrize("first_s, whole_s, steps", [(0.0, 1.0, 4), (1.0, 1.0, 4), (2.0, 1.0, 4), (0.1, 1.0, 0)])
def test_a_list_profile_needs_a_prefill_inside_the_list_and_a_step(first_s, whole_s, steps):
    with pytest.raises(NvkitError, match="prefill takes part of its time"):
        decode_profile.list_summaries([], whole_s, [], first_s, rows=2, steps=steps, bytes_per_step=1,
                                      kv_bytes_per_step=0, bandwidth=None)
