"""``nvkit bench --families`` (nvkit.benchmarks.families) on the CPU: the roofline's arithmetic,
the bytes a mixture of experts reads per token, one family's row as the default session runs it
(plain generate here: the fast paths need CUDA), and the command's refusals. The H200 run is in
docs/benchmarks.md."""

import contextlib
import io
import json

import pytest
import torch

from nvkit.benchmarks import backends, families
from nvkit.errors import NvkitError


def test_the_roofline_is_bytes_over_time_over_bandwidth():
    assert families.roofline_share(2_000, 1e-3, 4e6) == pytest.approx(0.5)
    assert families.roofline_share(2_000, 0.0, 4e6) is None and families.roofline_share(2_000, 1e-3, None) is None
    assert families.bandwidth(torch.device("cpu")) is None


def test_a_mixture_of_experts_reads_the_experts_a_token_runs():
    from transformers import OlmoeConfig, OlmoeForCausalLM
    cfg = OlmoeConfig(vocab_size=64, hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=1)
    model = OlmoeForCausalLM(cfg)
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in f".{n}.")
    embed = model.get_input_embeddings().weight  # not tied to the head: one row a token
    unread = embed.numel() * embed.element_size() - embed.shape[1] * embed.element_size()
    assert experts > 0 and families.bytes_per_token(model) == every - experts + experts // 4 - unread


def test_a_steps_rows_read_the_experts_they_run_and_their_own_embedding_rows():
    from transformers import OlmoeConfig, OlmoeForCausalLM
    torch.manual_seed(0)
    m = OlmoeForCausalLM(OlmoeConfig(vocab_size=100, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, num_experts=8,
                                     num_experts_per_tok=2, tie_word_embeddings=False))
    size = lambda ps: sum(p.numel() * p.element_size() for p in ps)  # noqa: E731
    experts = size(p for n, p in m.named_parameters() if ".experts." in f".{n}.")
    embed = m.get_input_embeddings().weight
    rest = size(m.parameters()) - experts - size([embed])
    row = 16 * embed.element_size()
    assert families.bytes_per_token(m) == rest + experts * 2 // 8 + row
    assert families.bytes_per_token(m, rows=1) == families.bytes_per_token(m)
    # 4 rows routed at random run 1 - (6/8)^4 of the experts, and read 4 embedding rows
    assert families.bytes_per_token(m, rows=4) == rest + round(experts * (1 - 0.75 ** 4)) + 4 * row
    assert families.bytes_per_token(m, rows=1000) == rest + experts + 100 * row  # every expert, every row once


def test_one_familys_row_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path))
    df = families.run(["qwen3-tiny"], new_tokens=4, n_prompts=2, list_tokens=3)
    row = df.iloc[0]
    assert row["ok"] and row["family"] == "qwen3-tiny" and row["model_type"] == "qwen3"
    assert row["batch1_path"] == "generate" and row["list_path"] == "generate"  # no CUDA: plain everywhere
    assert row["batch1_tok_s"] > 0 and row["list_tok_s"] > 0 and row["roofline"] is None
    assert row["gib_read_per_token"] > 0
    assert row["host_cpu"] == families.host_cpu() and isinstance(row["host_cpu"], str)  # plain's pace is the host's


@pytest.mark.parametrize("kw, match", [(dict(new_tokens=1), "new_tokens"), (dict(n_prompts=0), "n_prompts"),
                                       (dict(settle="yes"), "settle must be True or False"),
                                       (dict(shapes=[]), "at least one"), (dict(shapes=["gpt-9"]), "Unknown shape")])
def test_bad_values_are_refused_before_anything_loads(kw, match):
    shapes = kw.pop("shapes", ["qwen3-tiny"])
    with pytest.raises(NvkitError, match=match):
        families.run(shapes, **kw)


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = backends.cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv, match", [
    (("--shapes", "qwen3-tiny"), "--shapes belongs to --families"),
    (("--settle",), "--settle belongs to --families"),
    (("--decode", "--settle"), "--settle belongs to --families"),
    (("--families", "--prompt-len", "5"), "--prompt-len does not apply to --families"),
    (("--families", "--shapes", "gpt-9"), "Unknown shape 'gpt-9'"),
    (("shape:qwen3-tiny", "--families"), "not a MODEL"),
])
def test_the_command_refuses_what_does_not_apply(argv, match):
    code, _, err = _cli(*argv)
    assert code == 2 and match in err, err


def test_the_command_prints_rows_or_json(tmp_path, monkeypatch):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path))
    small = ("--families", "--shapes", "qwen3-tiny", "--new-tokens", "3", "--n-prompts", "2", "--batch-new-tokens", "2")
    code, out, err = _cli(*small)
    # "in", not startswith: a library imported earlier in this process may have logged to stdout
    assert code == 0 and "qwen3-tiny (qwen3): batch 1 generate" in out and "n/a of the HBM roofline" in out
    # each step announced as it starts, on stderr, in order
    steps = [line for line in err.splitlines() if line.startswith("[families] qwen3-tiny: ")]
    words = ["random checkpoint", "loading", "one prompt × 3 tokens, nvkit",
             "one prompt × 3 tokens, plain", "2 prompts × 2 tokens, nvkit", "2 prompts × 2 tokens, padded", "done"]
    assert len(steps) == len(words) and all(w in line for w, line in zip(words, steps)), steps
    code, out, err = _cli(*small, "--json")
    assert code == 0 and json.loads(out)[0]["family"] == "qwen3-tiny" and "[families] qwen3-tiny: done" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the row a CPU gives")
def test_settling_on_the_cpu_says_nothing_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path))
    code, out, err = _cli("--families", "--shapes", "qwen3-tiny", "--new-tokens", "3", "--n-prompts", "2",
                          "--batch-new-tokens", "2", "--settle")
    assert code == 0 and "settled: no GPU: nothing compiles" in out, out + err
