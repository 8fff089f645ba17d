"""The rows decode step's experts (nvkit.generate.fast.dense_experts): every expert applied to every
row, summed by the routing weights, computes what transformers' own "batched_mm" computes, for each
mixture-of-experts family nvkit runs (OLMoE, Qwen3-MoE, Mixtral, gpt-oss: gated, biased, transposed
weights, gpt-oss's own gate); the step runs it from num_experts / (2 × top_k) rows up."""

from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers.integrations.moe import batched_mm_experts_forward

from nvkit.generate.fast import dense_experts, static_cache

SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, num_experts_per_tok=2)
MOE = {"Olmoe": dict(num_experts=4), "Qwen3Moe": dict(num_experts=4, moe_intermediate_size=32, head_dim=16),
       "Mixtral": dict(num_local_experts=4), "GptOss": dict(num_local_experts=4, head_dim=16)}


def _model(family):
    cfg = getattr(transformers, family + "Config")(**SIZES, **MOE[family])
    cfg._attn_implementation = "eager" if family == "GptOss" else "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, family + "ForCausalLM")(cfg).eval()
    for p in model.parameters():  # biases too (gpt-oss's): nonzero, so a dropped one would show
        torch.nn.init.normal_(p, std=0.2)
    return model


def _experts(model):
    return next(m for m in model.modules() if type(m).__name__.endswith("Experts"))


@pytest.mark.parametrize("family", list(MOE))
def test_every_expert_on_every_row_computes_what_batched_mm_computes(family):
    experts = _experts(_model(family))
    rng = torch.Generator().manual_seed(1)
    tokens, e = 7, experts.num_experts
    x = torch.randn(tokens, SIZES["hidden_size"], generator=rng)
    index = torch.stack([torch.randperm(e, generator=rng)[:2] for _ in range(tokens)])  # each row's own two experts
    weights = torch.rand(tokens, 2, generator=rng)
    with torch.inference_mode():
        want = batched_mm_experts_forward(experts, x, index, weights)
        got = dense_experts.dense_experts_forward(experts, x, index, weights)
    assert got.shape == want.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(want.abs().max()) > 0.1  # not a comparison of zeros


def test_the_rows_step_runs_dense_from_num_experts_over_twice_top_k_rows():
    olmoe = SimpleNamespace(num_experts=64, num_experts_per_tok=8)
    assert [dense_experts.implementation_for(olmoe, r) for r in (1, 2, 3, 4, 64)] == \
        ["batched_mm"] * 3 + [dense_experts.NAME] * 2
    assert dense_experts.implementation_for(olmoe, None) == "batched_mm"   # the batch-1 step
    mixtral = SimpleNamespace(num_local_experts=8, num_experts_per_tok=2)
    assert dense_experts.implementation_for(mixtral, 1) == "batched_mm"
    assert dense_experts.implementation_for(mixtral, 2) == dense_experts.NAME
    assert dense_experts.implementation_for(SimpleNamespace(), 64) == "batched_mm"  # not a mixture


def test_the_step_sets_the_implementation_for_its_rows_and_puts_the_models_back():
    model = _model("Olmoe")
    own = model.config._experts_implementation
    assert own == "grouped_mm"
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(m.config._experts_implementation), with_kwargs=True)
    ids = torch.tensor([[1, 2, 3]])
    with torch.inference_mode():
        for rows in (None, 1, 4):
            with static_cache.experts_for_graphs(model, rows=rows):
                model(ids)
    assert seen == ["batched_mm", dense_experts.NAME, dense_experts.NAME]  # 4 experts, top 2: dense from one row
    assert model.config._experts_implementation == own
