"""Every family of issue 37 on the GPU with the fast path's CUDA graphs (tiny random models in
float32, transformers' configs): greedy tokens equal plain ``generate``'s for 64 new tokens at
batch 1, with one compile per decoder (the models' own forwards compiled too); a list on the rows graphs, each prompt as it decodes alone
(the fused families on the fused step over rows, the others over their own forward, compiled
too); the fused families in bf16; adapters on a fused family's list (folded) and in PEFT's layers
on a list over a model's own forward; the mixtures' grouped experts kernel.
The same logic without graphs on the CPU: tests/generate/test_families_step.py."""

import pytest
import torch
import transformers

import nvkit.generate.fast as fast
from nvkit.generate.fast.model_rows import ModelRowsDecoder
from nvkit.generate.fast.rows import BatchedDecoder
from tests.generate.test_families_step import (ALL_FAMILIES, FUSED_ALL, NEVER, SIZES, gemma3_vision_language,
                                              list_case, longrope_phi3)


def _model(family):
    cfg = getattr(transformers, family + "Config")(**SIZES, **ALL_FAMILIES[family])
    cfg._attn_implementation = "eager" if family in ("GptOss", "Gemma2") else "sdpa"  # sinks; soft-capping
    torch.manual_seed(0)
    return getattr(transformers, family.replace("Text", "") + "ForCausalLM")(cfg).eval().to("cuda")


@pytest.mark.parametrize("family", list(ALL_FAMILIES))
def test_each_family_runs_its_graphs_as_plain_generate(family):
    model = _model(family)
    d = fast.FastDecoder(model, k_steps=8)
    gen = dict(max_new_tokens=64, do_sample=False, eos_token_id=NEVER)
    try:
        for prompt_len in (5, 40):
            ids = torch.randint(1, SIZES["vocab_size"], (1, prompt_len), device="cuda",
                                generator=torch.Generator("cuda").manual_seed(prompt_len))
            with torch.inference_mode():
                ref = model.generate(ids, pad_token_id=0, **gen)[0, prompt_len:].tolist()
                sampling, why = fast.resolve(model, gen)
                assert why is None, why
                assert d.generate(ids, sampling) == ref, (family, prompt_len, d.describe())
        want = "fused step" if family in FUSED_ALL else "model forward"
        assert d.describe().startswith(want) and d.counts["compiles"] == 1, (d.describe(), d.counts)
    finally:
        d.release()
    if family not in FUSED_ALL:  # the model's own forward compiled whole (a mixture's experts switched outside)
        d = fast.FastDecoder(model, k_steps=8, compile_after=0)
        try:
            with torch.inference_mode():
                assert d.generate(ids, sampling) == ref, (family, d.describe())
            assert d.compile_error is None and "measured" in d.describe(), d.describe()
        finally:
            d.release()


@pytest.mark.parametrize("family", list(ALL_FAMILIES))
def test_each_family_runs_a_list_on_the_rows_graphs(family):
    """A list of 5 prompts through 4 rows (refilled), each prompt as plain ``generate`` of it
    alone: the fused families on the fused step over rows, the others (issue 37) over their own
    forward (``ModelRowsDecoder``), those also once their forward is compiled (each rung measured
    against its uncompiled graph)."""
    model = _model(family)
    fused = family in FUSED_ALL
    bd = (BatchedDecoder if fused else ModelRowsDecoder)(fast.FastDecoder(model, k_steps=8), max_rows=4)
    _, prompts, sampling, refs = list_case(model, 48, (4, 30, 9, 17, 2), seed=3, device="cuda")
    try:
        with torch.inference_mode():
            got = bd.generate(prompts, sampling)
        for p, tokens, ref in zip(prompts, got, refs):
            assert tokens == ref, (family, len(p), bd.describe())
        assert bd.describe().startswith("fused step over rows" if fused else "model forward over rows, uncompiled"), \
            bd.describe()
        # a model's own forward attends through the paged kernel, but gpt-oss (its sinks) gathers
        assert ("matmul attention" if family == "GptOss" else "paged attention") in bd.describe(), bd.describe()
        if not fused:
            bd.compile_next()
            with torch.inference_mode():
                assert bd.generate(prompts, sampling) == got, bd.describe()
            assert "measured" in bd.describe() and bd.counts["compiles"] >= 1, (bd.describe(), bd.counts)
    finally:
        bd.release()


@pytest.mark.parametrize("family", ["Olmoe", "Qwen3Moe", "Mixtral", "GptOss"])
def test_a_mixtures_grouped_experts_run_as_plain_generate_alone_and_in_lists(family):
    """``StepVariant.experts``: the mixtures' uncompiled steps over their own forward with nvkit's
    grouped experts kernel, at batch 1 and on the rows (4 rows: the rung the dense experts would
    take), token for token as plain ``generate``."""
    from nvkit.generate.fast.runner import StepVariant
    model = _model(family)
    d = fast.FastDecoder(model, k_steps=8, variant=StepVariant(experts=True))
    bd = ModelRowsDecoder(d, max_rows=4)
    _, prompts, sampling, refs = list_case(model, 48, (4, 30, 9, 17, 2), seed=5, device="cuda")
    try:
        with torch.inference_mode():
            assert d.generate(torch.tensor([prompts[1]], device="cuda"), sampling) == refs[1], d.describe()
            assert bd.generate(prompts, sampling) == refs, bd.describe()
        assert "uncompiled with nvkit kernels" in d.describe() and d.kernels, d.describe()
        assert "with nvkit kernels" in bd.describe() and bd.kernels, bd.describe()
    finally:
        bd.release()
        d.release()


@pytest.mark.parametrize("family", sorted(FUSED_ALL))
def test_a_fused_family_runs_its_graphs_in_bfloat16(family):
    """The dtype a user loads: each fused family's batch-1 graphs (nvkit's Triton attention) and
    rows graphs run in bf16 (OLMo 2's float32 rotary tables, the Gemma family's float32 norm
    weights and bf16-rounded embedding scale among them), the first logits within
    bf16's rounding of the model's own forward, and a list's first tokens those of the prompt alone."""
    model = _model(family).to(torch.bfloat16)
    d = fast.FastDecoder(model, k_steps=8)
    bd = BatchedDecoder(d, max_rows=4)
    rng = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (9, 30, 4)]
    sampling, _ = fast.resolve(model, dict(max_new_tokens=16, do_sample=False, eos_token_id=NEVER))
    try:
        with torch.inference_mode():
            ids = torch.tensor([prompts[0]], device="cuda")
            tokens, logits = d.trace(ids, sampling)
            ref = model(ids).logits[0, -1].float()
            rows = bd.generate(prompts, sampling)
        assert float((logits[0].float() - ref).abs().max()) <= 0.05 * float(ref.abs().max()), (family, d.describe())
        assert [len(r) for r in rows] == [16] * 3 and rows[0][0] == tokens[0] == int(ref.argmax())
        assert d.describe().startswith("fused step") and bd.describe().startswith("fused step over rows")
    finally:
        bd.release()
        d.release()


def _list_as_peft_alone(pm, bd, seed: int) -> None:
    """A list of 5 prompts on ``bd`` with ``pm``'s adapter on gives each prompt PEFT's greedy text
    of it alone, and with the adapter switched off the base model's (which differs)."""
    gen = dict(max_new_tokens=32, do_sample=False, eos_token_id=NEVER)
    rng = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (5, 21, 3, 12, 8)]
    sampling, _ = fast.resolve(pm.get_base_model(), gen)

    def alone():
        return [pm.generate(input_ids=torch.tensor([p], device="cuda"), pad_token_id=0, **gen)[0, len(p):].tolist()
                for p in prompts]
    with torch.inference_mode():
        tuned = alone()
        assert bd.generate(prompts, sampling) == tuned, bd.describe()
        with pm.disable_adapter():
            assert bd.generate(prompts, sampling) == alone() != tuned


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "folded"])
@pytest.mark.parametrize("family", ["Llama", "Qwen3", "Gemma2", "Gemma3Text"])
def test_a_list_with_an_adapter_on_the_fused_rows_folds_it(family, merged):
    """A LoRA adapter on a fused family's list, each prompt as PEFT's ``generate`` of it alone and,
    switched off, the base model's: by default the rows step is the base step over the batch-1
    decoder's merged copy; with the adapters apart (``lora_merged=False``), the rows step with
    nvkit's kernels folds its first product into the base one (one float32 product and one kernel
    per projection group, for every row at once)."""
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(_model(family), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                   init_lora_weights=False))
    d = fast.FastDecoder(pm.get_base_model(), k_steps=8, lora_merged=merged)
    bd = BatchedDecoder(d, max_rows=4)
    try:
        _list_as_peft_alone(pm, bd, seed=8)
        assert bd.describe().startswith("fused step over rows") and bd.kernels, bd.describe()
        assert (d._adapters.merged is not None) == merged, d.describe()
    finally:
        bd.release()
        d.release()


@pytest.mark.parametrize("family", ["Starcoder2", "Cohere2", "Olmoe"])
def test_a_list_with_an_adapter_on_its_own_forwards_graphs(family):
    """A LoRA adapter on a family off the fused step: the list's rows graphs run PEFT's layers
    (each prompt as PEFT's ``generate`` of it alone), and switched off, the base model's."""
    from peft import LoraConfig, get_peft_model
    cfg = getattr(transformers, family + "Config")(**SIZES, **ALL_FAMILIES[family])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, family.replace("Text", "") + "ForCausalLM")(cfg).eval()
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)).to("cuda")
    bd = ModelRowsDecoder(fast.FastDecoder(pm.get_base_model(), k_steps=8), max_rows=4)
    try:
        _list_as_peft_alone(pm, bd, seed=7)
        assert "LoRA in PEFT's own layers" not in bd.describe()  # the last request ran without it
    finally:
        bd.release()


@pytest.mark.parametrize("attention", ["matmul", "triton-split", "triton-fused"])
@pytest.mark.parametrize("family", ["Gemma2", "Gemma3Text", "Mistral"])
def test_a_windowed_family_runs_every_attention_kind_as_plain_generate(family, attention):
    """The fused step's three attention kinds on the sliding-window families (Gemma 2's soft-capped
    scores, Gemma 3's sliding layers with their own rotary table, a Mistral windowed on every
    layer): the kernels start each sliding layer's reads at its window, and a 40-token prompt with
    64 new tokens crosses the window of 6 many times; greedy tokens as plain ``generate``."""
    model = _model(family)
    d = fast.FastDecoder(model, k_steps=8, attention=attention)
    gen = dict(max_new_tokens=64, do_sample=False, eos_token_id=NEVER)
    ids = torch.randint(1, SIZES["vocab_size"], (1, 40), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(9))
    try:
        with torch.inference_mode():
            ref = model.generate(ids, pad_token_id=0, **gen)[0, 40:].tolist()
            sampling, _ = fast.resolve(model, gen)
            assert d.generate(ids, sampling) == ref, d.describe()
        assert d.describe().startswith("fused step") and f"{attention} attention" in d.describe(), d.describe()
    finally:
        d.release()


def test_gemma3_vision_language_checkpoint_runs_its_language_model_on_the_graphs():
    """Gemma 3 as its 4B-and-up checkpoints load (``Gemma3ForConditionalGeneration``): the fused
    step's graphs on its language model, alone and in a list, as plain ``generate``."""
    model = gemma3_vision_language().to("cuda")
    d = fast.FastDecoder(model, k_steps=8)
    bd = BatchedDecoder(d, max_rows=4)
    gen = dict(max_new_tokens=48, do_sample=False, eos_token_id=NEVER)
    sampling, _ = fast.resolve(model, gen)
    rng = torch.Generator().manual_seed(6)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (30, 4, 17, 9, 2)]
    try:
        with torch.inference_mode():
            want = [model.generate(torch.tensor([p], device="cuda"), pad_token_id=0, **gen)[0, len(p):].tolist()
                    for p in prompts]
            assert d.generate(torch.tensor([prompts[0]], device="cuda"), sampling) == want[0], d.describe()
            assert bd.generate(prompts, sampling) == want, bd.describe()
        assert d.describe().startswith("fused step") and bd.describe().startswith("fused step over rows")
    finally:
        bd.release()
        d.release()


def test_a_longrope_model_swaps_its_tables_under_the_captured_graphs():
    """Phi-3 with LongRoPE (original context 16): the graphs captured on the short factors' tables
    replay a prompt past 16 tokens on the long factors' (copied into the same buffers) and then a
    short prompt on the short ones again, alone and in lists, each as plain ``generate``."""
    model = longrope_phi3().to("cuda")
    d = fast.FastDecoder(model, k_steps=8)
    bd = BatchedDecoder(d, max_rows=4)

    def prompt(n):
        return torch.randint(1, SIZES["vocab_size"], (n,), generator=torch.Generator().manual_seed(n)).tolist()

    def plain(p, new):
        return model.generate(torch.tensor([p], device="cuda"), pad_token_id=0, max_new_tokens=new, do_sample=False,
                              eos_token_id=NEVER)[0, len(p):].tolist()
    try:
        with torch.inference_mode():
            for n, new in ((5, 8), (20, 40), (7, 8)):
                sampling, _ = fast.resolve(model, dict(max_new_tokens=new, do_sample=False, eos_token_id=NEVER))
                assert d.generate(torch.tensor([prompt(n)], device="cuda"), sampling) == plain(prompt(n), new), n
            for lengths, new in (((20, 30, 17), 24), ((4, 6, 2), 8)):
                sampling, _ = fast.resolve(model, dict(max_new_tokens=new, do_sample=False, eos_token_id=NEVER))
                prompts = [prompt(n) for n in lengths]
                assert bd.generate(prompts, sampling) == [plain(p, new) for p in prompts], lengths
        # one capture: the tables are swapped under the graphs, not captured again
        assert d.counts["compiles"] == 1 and d.describe().startswith("fused step"), (d.counts, d.describe())
    finally:
        bd.release()
        d.release()


@pytest.mark.parametrize("family", ["Gemma2", "Gemma3Text", "Olmo2", "Phi3"])
def test_deterministic_gives_a_fused_family_its_own_tokens_in_any_list(family):
    """``deterministic=True``'s decoder on the layouts with norms after the branches (Gemma 2/3,
    OLMo 2) and partial rotary (Phi-3), in bf16 where the row count would otherwise change the
    sums: each prompt alone and in lists (rows padded to a class of 4, a row refilled) gives the
    same tokens, on CUDA graphs."""
    from nvkit.generate.fast.rows_invariant import InvariantRowsDecoder
    model = _model(family).to(torch.bfloat16)
    gen = dict(max_new_tokens=32, do_sample=False, eos_token_id=NEVER)
    rng = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (4, 30, 9, 17, 2)]
    sampling, _ = fast.resolve(model, gen)
    d = InvariantRowsDecoder(fast.FastDecoder(model, k_steps=8), max_rows=4)
    try:
        with torch.inference_mode():
            alone = [d.generate([p], sampling)[0] for p in prompts]
            assert d.generate(prompts, sampling) == alone, family
            assert d.generate([prompts[3], prompts[1]], sampling) == [alone[3], alone[1]], family
        assert d.describe().startswith("batch-invariant kernels"), d.describe()
    finally:
        d.release()
