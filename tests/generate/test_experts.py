"""The decode steps' experts (nvkit.generate.fast.experts): every expert applied to every row,
summed by the routing weights, and each row's picked experts on nvkit's grouped kernel (run by
Triton's interpreter), compute what transformers' own "batched_mm" computes, for each
mixture-of-experts family nvkit runs (OLMoE, Qwen3-MoE, Mixtral, gpt-oss: gated, biased, transposed
weights, gpt-oss's own gate); the steps run dense from num_experts / (2 × top_k) rows up, grouped
where they run nvkit's kernels (the kernel itself: tests/generate/kernels/test_grouped_experts.py)."""

from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers.integrations.moe import batched_mm_experts_forward

from nvkit.generate.fast import experts as experts_mod, static_cache
from tests.triton_interpreter import interpret

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
        got = experts_mod.dense_experts_forward(experts, x, index, weights)
    assert got.shape == want.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(want.abs().max()) > 0.1  # not a comparison of zeros


def test_the_rows_step_runs_dense_from_num_experts_over_twice_top_k_rows():
    olmoe = SimpleNamespace(num_experts=64, num_experts_per_tok=8)
    assert [experts_mod.implementation_for(olmoe, r) for r in (1, 2, 3, 4, 64)] == \
        ["batched_mm"] * 3 + [experts_mod.DENSE] * 2
    assert experts_mod.implementation_for(olmoe, None) == "batched_mm"   # the batch-1 step
    mixtral = SimpleNamespace(num_local_experts=8, num_experts_per_tok=2)
    assert experts_mod.implementation_for(mixtral, 1) == "batched_mm"
    assert experts_mod.implementation_for(mixtral, 2) == experts_mod.DENSE
    assert experts_mod.implementation_for(SimpleNamespace(), 64) == "batched_mm"  # not a mixture


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
    assert seen == ["batched_mm", experts_mod.DENSE, experts_mod.DENSE]  # 4 experts, top 2: dense from one row
    assert model.config._experts_implementation == own
    seen.clear()
    for rows in (None, 1, 4):  # (the grouped kernel runs on a GPU or in Triton's interpreter: below)
        with static_cache.experts_for_graphs(model, rows=rows, grouped=True):
            seen.append(model.config._experts_implementation)
    assert seen == [experts_mod.GROUPED] * 3 and model.config._experts_implementation == own


def test_where_the_step_runs_nvkits_kernels_every_row_count_runs_grouped():
    olmoe = SimpleNamespace(num_experts=64, num_experts_per_tok=8)
    assert [experts_mod.implementation_for(olmoe, r, grouped=True) for r in (None, 1, 4, 256)] == \
        [experts_mod.GROUPED] * 4
    assert experts_mod.implementation_for(SimpleNamespace(), None, grouped=True) == "batched_mm"  # not a mixture
    assert experts_mod.is_mixture(olmoe) and not experts_mod.is_mixture(SimpleNamespace(num_experts=0))


def test_the_grouped_kernel_computes_what_batched_mm_computes_for_every_family():
    """In float32 (Triton's interpreter gets a bf16 ``tl.dot`` wrong): tokens of 1, 7 and 40 rows
    (more than a block of one expert), gated, biased, transposed weights and gpt-oss's own gate."""
    out = interpret("""
        import torch
        from transformers.integrations.moe import batched_mm_experts_forward
        from nvkit.generate.fast import experts as experts_mod
        from tests.generate.test_experts import MOE, SIZES, _experts, _model
        for family in MOE:
            experts = _experts(_model(family))
            rng = torch.Generator().manual_seed(2)
            for tokens in (1, 7, 40):
                x = torch.randn(tokens, SIZES["hidden_size"], generator=rng)
                index = torch.stack([torch.randperm(experts.num_experts, generator=rng)[:2] for _ in range(tokens)])
                weights = torch.rand(tokens, 2, generator=rng)
                with torch.inference_mode():
                    want = batched_mm_experts_forward(experts, x, index, weights)
                    got = experts_mod.grouped_experts_forward(experts, x, index, weights)
                assert got.shape == want.shape and got.dtype == x.dtype, family
                assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (family, tokens, (got - want).abs().max())
                assert float(want.abs().max()) > 0.1
            print(family, "ok", experts.is_transposed, experts.has_bias)
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count(" ok ") == len(MOE), out


def test_a_decoder_that_runs_nvkits_kernels_gives_its_steps_the_grouped_experts():
    """``StepVariant.experts``: the batch-1 step and the rows step over a mixture's own forward run
    the grouped experts where the decoder runs nvkit's kernels (as on a GPU; here Triton's
    interpreter runs them, without graphs), token for token as plain ``generate``; without the
    kernels they keep transformers' and the dense experts."""
    out = interpret("""
        import torch
        from transformers.integrations.moe import ExpertsInterface
        import nvkit.generate.fast as fast
        from nvkit.generate.fast import experts as experts_mod
        from nvkit.generate.fast.model_rows import ModelRowsDecoder
        from nvkit.generate.fast.runner import StepVariant
        from tests.generate.test_experts import _model
        experts_mod.register()
        calls = []

        def counted(*a, **kw):
            calls.append(a[1].shape[0])
            return experts_mod.grouped_experts_forward(*a, **kw)
        ExpertsInterface.register(experts_mod.GROUPED, counted)
        model = _model("Olmoe")
        gen = dict(max_new_tokens=6, do_sample=False, eos_token_id=127)
        sampling, _ = fast.resolve(model, gen)
        prompts = [[5, 9, 2], [7, 1, 1, 4, 30, 2, 8], [3]]
        with torch.inference_mode():
            ref = [model.generate(torch.tensor([p]), pad_token_id=0, **gen)[0, len(p):].tolist() for p in prompts]
        for kernels in (False, True):
            d = fast.FastDecoder(model, k_steps=2, graphs=False, variant=StepVariant(experts=True))
            assert not d.kernels  # no GPU: none
            d.kernels = kernels  # as a GPU would have them
            bd = ModelRowsDecoder(d, max_rows=2)
            calls.clear()
            with torch.inference_mode():
                assert d.generate(torch.tensor([prompts[1]]), sampling) == ref[1], d.describe()
                one = len(calls)
                assert bd.generate(prompts, sampling) == ref, bd.describe()
            assert (one > 0 and len(calls) > one) if kernels else not calls, (kernels, calls)
            print("kernels", kernels, "ok")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count(" ok") == 2, out
