"""Every family issue 37 names, on the batch-1 fast path's step logic (issue 37): the Llama family
and the layers near it (SmolLM3, OLMo 2, Granite, Gemma 1/2/3 with their sliding windows and
soft-caps, Phi-3 with its partial rotary) on nvkit's fused step, the others (Starcoder2, Cohere 2
and the mixtures of experts OLMoE, Qwen3-MoE, Mixtral, gpt-oss) on their own forward over the
static cache, each greedy
token for token as plain ``generate``. Tiny random models in float32 on the CPU,
built from transformers' configs; the captured graphs of the same step run in
tests/gpu/test_sliding_window_gpu.py and ``nvkit bench --families``."""

import pytest
import torch
import transformers

import nvkit.generate.fast as fast
from nvkit.generate.fast import support

NEVER = 10 ** 7
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
MOE = dict(num_experts_per_tok=2)
FAMILIES = {  # transformers' class prefix -> the config's own settings (a window of 6 crosses the 9-token prompt)
    "Llama": {}, "Qwen2": {}, "Qwen3": dict(head_dim=16),
    "Gemma": dict(head_dim=16),
    # 12 of 16 dims rotate; weights large enough that attention follows the rotation (near uniform
    # at the default scale, where a wrong rotation would go unseen)
    "Phi3": dict(pad_token_id=0, partial_rotary_factor=0.75, initializer_range=0.25),
    "SmolLM3": dict(no_rope_layer_interval=2, pad_token_id=0),
    "Olmo2": {}, "Granite": dict(residual_multiplier=0.5, embedding_multiplier=2.0, logits_scaling=4.0),
    "Starcoder2": {}, "Cohere2": dict(head_dim=16, sliding_window=6),
    "Olmoe": dict(num_experts=4, **MOE), "Qwen3Moe": dict(num_experts=4, moe_intermediate_size=32, head_dim=16, **MOE),
    "Mixtral": dict(num_local_experts=4, **MOE), "GptOss": dict(num_local_experts=4, head_dim=16, sliding_window=6, **MOE),
}
FUSED = {"Llama", "Qwen2", "Qwen3", "SmolLM3", "Granite", "Olmo2", "Gemma", "Phi3"}
# the windowed and hybrid families, their windows crossed by the prompts and answers (Gemma 3's
# sliding layers with a rotary table of their own; Gemma 2's soft-caps low enough to bite), with
# weights large enough that attention follows the window, the rotation and the caps (untied, as with
# Gemma's embedding scale and tied weights such large ones would make each token predict itself)
SHARP = dict(initializer_range=0.25, tie_word_embeddings=False)
ALL_FAMILIES = {**FAMILIES, "Mistral": dict(sliding_window=6, **SHARP),
                "Gemma2": dict(head_dim=16, sliding_window=6, attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
                               **SHARP),
                "Gemma3Text": dict(head_dim=16, sliding_window=6,
                                   layer_types=["sliding_attention", "sliding_attention", "full_attention"], **SHARP)}
FUSED_ALL = FUSED | {"Mistral", "Gemma2", "Gemma3Text"}


def _session(model):
    """What the support checks read of a session: the model, on a GPU as a user's session has it."""
    class Session:
        device = torch.device("cuda")
        quantization = None
    s = Session()
    s.model = model
    return s


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_decodes_as_plain_generate(family):
    cfg = getattr(transformers, family + "Config")(**SIZES, **FAMILIES[family])
    cfg._attn_implementation = "eager" if family == "GptOss" else "sdpa"  # gpt-oss's sinks: eager attention
    torch.manual_seed(0)
    model = getattr(transformers, family + "ForCausalLM")(cfg).eval()

    s = _session(model)
    assert support.single_why(s, dict(max_new_tokens=8, do_sample=False)) is None
    d = fast.FastDecoder(model, k_steps=4, graphs=False)
    assert d.describe().startswith("fused step" if family in FUSED else "model forward"), d.describe()
    ids = torch.randint(1, SIZES["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=20, do_sample=False, eos_token_id=NEVER)
    with torch.inference_mode():
        ref = model.generate(ids, pad_token_id=0, **gen)[0, 9:].tolist()
        sampling, why = fast.resolve(model, gen)
        assert why is None, why
        assert d.generate(ids, sampling) == ref


def list_case(model, new_tokens: int, lengths, seed: int, device: str = "cpu"):
    """A greedy list's request for the rows tests: (its generation arguments, prompts of random ids
    of ``lengths``, its sampling, each prompt's tokens from plain ``generate`` of it alone)."""
    gen = dict(max_new_tokens=new_tokens, do_sample=False, eos_token_id=NEVER)
    rng = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in lengths]
    sampling, _ = fast.resolve(model, gen)
    with torch.inference_mode():
        ref = [model.generate(torch.tensor([p], device=device), pad_token_id=0, **gen)[0, len(p):].tolist()
               for p in prompts]
    return gen, prompts, sampling, ref


def tiny(family, **sizes):
    """A tiny random model of ``family`` (``ALL_FAMILIES``' config at ``SIZES``, with ``sizes`` over them)."""
    cfg = getattr(transformers, family + "Config")(**{**SIZES, **ALL_FAMILIES[family], **sizes})
    cfg._attn_implementation = "eager" if family in ("GptOss", "Gemma2") else "sdpa"  # sinks; Gemma 2's soft-caps
    torch.manual_seed(0)
    return getattr(transformers, family.replace("Text", "") + "ForCausalLM")(cfg).eval()


@pytest.mark.parametrize("family", ["Starcoder2", "Cohere2", "Olmoe"])
def test_a_lora_adapter_runs_in_the_models_own_forward(family):
    """A family the fused step does not cover runs its adapters in PEFT's own layers (any module
    they wrap, Phi-3's fused qkv_proj and the experts' router included): the tuned tokens are PEFT's,
    the adapter switched off gives the base model's, and each adapter state has a key of its own,
    so a graph captured in one state never replays in another."""
    from peft import LoraConfig, get_peft_model

    from nvkit.generate.fast import lora
    model = tiny(family)
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))

    s = _session(pm)
    assert support.single_why(s, dict(max_new_tokens=8, do_sample=False)) is None
    d = fast.FastDecoder(pm.get_base_model(), k_steps=4, graphs=False)
    ids = torch.randint(1, SIZES["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=16, do_sample=False, eos_token_id=NEVER)
    sampling, _ = fast.resolve(model, gen)

    def both():
        with torch.inference_mode():
            return pm.generate(input_ids=ids, pad_token_id=0, **gen)[0, 9:].tolist(), d.generate(ids, sampling)
    tuned, ours = both()
    on = lora.forward_state(d.model)
    assert ours == tuned and on and "LoRA in PEFT's own layers" in d.describe()
    with pm.disable_adapter():
        base, ours = both()
        assert ours == base and lora.forward_state(d.model) == ()
    assert base != tuned  # the adapter changes the answer, so the check above can tell them apart
    pm.add_adapter("other", LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
    pm.set_adapter("other")
    other = lora.forward_state(d.model)
    assert other and other != on
    tuned, ours = both()
    assert ours == tuned
    assert d._cache is not None and not [k for k in d._cache.graphs if k.lora and k.lora != other]  # older states dropped

    # a list on the rows over the model's own forward: the same adapters in PEFT's layers, rows
    # refilled, each state on graphs of its own
    from nvkit.generate.fast.model_rows import ModelRowsDecoder
    assert support.rows_why(s, gen) is None
    bd = ModelRowsDecoder(d, max_rows=2)
    rng = torch.Generator().manual_seed(6)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (3, 10, 6)]

    def lists():
        with torch.inference_mode():
            return ([pm.generate(input_ids=torch.tensor([p]), pad_token_id=0, **gen)[0, len(p):].tolist()
                     for p in prompts], bd.generate(prompts, sampling))
    want, got = lists()
    assert got == want and "LoRA in PEFT's own layers" in bd.describe(), bd.describe()
    with pm.disable_adapter():
        base_want, got = lists()
        assert got == base_want != want
    pm.set_adapter("default")
    want, got = lists()
    assert got == want
    assert {k.lora for k in bd._arena.graphs} <= {0, max(bd._states.values())}  # "other"'s graphs dropped


def test_other_adapter_types_on_the_models_own_forward_say_why():
    from peft import PromptTuningConfig, get_peft_model
    pm = get_peft_model(tiny("Phi3"), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))

    s = _session(pm)
    assert "PROMPT_TUNING" in support.single_why(s, dict(max_new_tokens=8, do_sample=False))


@pytest.mark.parametrize("family", ["SmolLM3", "Granite", "Olmo2", "Gemma", "Gemma2", "Gemma3Text", "Mistral", "Phi3",
                                    "Starcoder2"])
def test_a_list_runs_on_the_fused_rows_where_the_family_fits(family):
    """A list: SmolLM3 (NoPE layers), Granite (multipliers), OLMo 2 (norms after each branch,
    q/k normed over all heads), the Gemma family (norms of 1 + w, GELU, Gemma 2/3's four norms and
    sliding layers, Gemma 2's soft-caps, Gemma 3's second rotary table), Phi-3 (q/k/v and gate/up
    as one module each, the adapter on those, and 12 of 16 dims rotated) and a Mistral with a window
    on every layer (prompts and answers longer than the window) take the fused step over rows, each
    prompt greedy token for token as plain ``generate`` of the prompt alone, with rows refilled
    (3 prompts through 2 rows), and with a LoRA adapter attached; a family the fused step does not
    cover runs its list on its own forward, and with an adapter attached says why it does not."""
    from peft import LoraConfig, get_peft_model

    from nvkit.generate.fast.rows import BatchedDecoder
    model = tiny(family)

    s = _session(model)
    gen = dict(max_new_tokens=12, do_sample=False, eos_token_id=NEVER)
    if family == "Starcoder2":  # the model's own forward (test_a_lora_adapter_runs_in_the_models_own_forward)
        assert support.rows_why(s, gen) is None
        return
    assert support.rows_why(s, gen) is None
    rng = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (3, 11, 7)]
    sampling, _ = fast.resolve(model, gen)

    def alone(m, p):
        with torch.inference_mode():
            return m.generate(torch.tensor([p]), pad_token_id=0, **gen)[0, len(p):].tolist()
    answers = []
    for tuned in (False, True):
        m = model if not tuned else get_peft_model(model, LoraConfig(  # PEFT wraps the model's layers in place
            r=4, lora_alpha=64, init_lora_weights=False,
            target_modules=(["qkv_proj", "o_proj", "gate_up_proj"] if family == "Phi3"
                            else ["q_proj", "v_proj", "o_proj", "down_proj"])))
        s.model = m
        assert support.rows_why(s, gen) is None
        bd = BatchedDecoder(fast.FastDecoder(support.base_model(m), k_steps=4, graphs=False), max_rows=2)
        with torch.inference_mode():
            got = bd.generate(prompts, sampling)
        assert bd.describe().startswith("fused step over rows"), bd.describe()
        assert got == [alone(m, p) for p in prompts]
        answers.append(got)
    assert answers[0] != answers[1]  # the adapter changes the answers, so the tuned check can tell them apart


@pytest.mark.parametrize("family", ["Olmoe", "Qwen3Moe", "Llama"])
def test_the_decode_step_runs_experts_a_graph_can_capture(family):
    """Issue 37: transformers' default experts ("grouped_mm") read their offsets through the host,
    which a CUDA graph capture refuses: the model-forward decode step runs the experts on
    "batched_mm" (gathered on the device) and puts the model's own setting back after each call;
    the prompt's forward keeps the model's setting; a dense model is left alone."""
    from nvkit.generate.fast import static_cache
    model = tiny(family)
    own = getattr(model.config, "_experts_implementation", None)
    seen = []
    model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(((a or [kw["input_ids"]])[0].shape[-1], m.config._experts_implementation)),
        with_kwargs=True)
    with static_cache.experts_for_graphs(model):
        inside = model.config._experts_implementation
        with torch.inference_mode():
            model(torch.tensor([[1, 2, 3]]))
    assert model.config._experts_implementation == own
    if family == "Llama":
        assert inside == own
        return
    assert own == "grouped_mm" and inside == "batched_mm" and seen == [(3, "batched_mm")]
    d = fast.FastDecoder(model, k_steps=4, graphs=False)
    ids = torch.randint(1, SIZES["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(4))
    gen = dict(max_new_tokens=6, do_sample=False, eos_token_id=NEVER)
    with torch.inference_mode():
        ref = model.generate(ids, pad_token_id=0, **gen)[0, 9:].tolist()
        seen.clear()
        assert d.generate(ids, fast.resolve(model, gen)[0]) == ref
    assert (9, "grouped_mm") in seen and {how for n, how in seen if n == 1} == {"batched_mm"}, seen
    assert model.config._experts_implementation == "grouped_mm"


def test_the_compiled_step_over_a_mixtures_forward_switches_its_experts_outside_what_it_compiles():
    """transformers' switch of the experts implementation walks the model's modules and compares
    config classes, which Dynamo failed to trace on a GPU (OLMoE's batch-1 compile): the compiled
    step runs the switch around the compiled forward, never inside it, and decodes what the eager
    step decodes."""
    from nvkit.generate.fast import static_cache
    model = tiny("Olmoe")
    switches = []
    own_switch = model.set_experts_implementation

    def switch(how):
        switches.append((how, torch.compiler.is_compiling()))
        return own_switch(how)
    model.set_experts_implementation = switch
    ids = torch.randint(1, SIZES["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(5))
    runs = []
    torch._dynamo.reset()
    for compiler in (None, lambda f: torch.compile(f, fullgraph=True, backend="eager")):
        c = static_cache.new_cache(model, None, 64, 4, torch.device("cpu"))
        step = static_cache.model_step(model, c, torch.device("cpu"), compiler=compiler)
        with torch.inference_mode():
            with static_cache.experts_for_graphs(model):
                logits = static_cache.model_prefill(model, c, ids)
            c.pos.fill_(9)
            toks = []
            for _ in range(4):
                toks.append(int(logits.argmax(-1)))
                logits = step(torch.tensor([[toks[-1]]]))
        runs.append(toks)
    torch._dynamo.reset()
    assert runs[0] == runs[1]
    assert switches and not any(inside for _, inside in switches), switches
    assert {how for how, _ in switches} == {"batched_mm", "grouped_mm"}
    assert model.config._experts_implementation == "grouped_mm"


@pytest.mark.parametrize("family", sorted(FUSED_ALL))
def test_each_fused_family_runs_in_bfloat16(family):
    """In the dtype a user loads (bf16), each fused family's batch-1 step and rows step run (every
    tensor of a layer in one dtype, whatever the dtype of the model's own tables: OLMo 2's rotary
    tables are float32), the first logits agree with the model's own forward within bf16's
    rounding, and the list's first tokens are the batch-1 step's."""
    from nvkit.generate.fast.rows import BatchedDecoder
    model = tiny(family).to(torch.bfloat16)
    rng = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (9, 5)]
    sampling, _ = fast.resolve(model, dict(max_new_tokens=6, do_sample=False, eos_token_id=NEVER))
    d = fast.FastDecoder(model, k_steps=4, graphs=False)
    bd = BatchedDecoder(d, max_rows=2)
    with torch.inference_mode():
        ids = torch.tensor([prompts[0]])
        tokens, logits = d.trace(ids, sampling)
        ref = model(ids).logits[0, -1].float()
        rows = bd.generate(prompts, sampling)
    assert d.describe().startswith("fused step") and bd.describe().startswith("fused step over rows")
    spread = float(ref.abs().max())
    assert float((logits[0].float() - ref).abs().max()) <= 0.05 * spread, (logits[0], ref)
    assert [len(r) for r in rows] == [6, 6] and rows[0][0] == tokens[0] == int(ref.argmax())


@pytest.mark.parametrize("family", [f for f in ALL_FAMILIES if f not in FUSED_ALL])
def test_a_list_runs_on_the_models_own_forward_where_the_fused_step_does_not_fit(family):
    """Issue 37: a family the fused step does not cover (Phi-3, Starcoder2, Cohere 2 with its sliding
    and full layers, the mixtures of experts) runs a list on
    the rows path over its own forward (``ModelRowsDecoder``): each prompt greedy token for token
    as plain ``generate`` of the prompt alone, 4 prompts of 2–13 tokens through 2 rows (refilled;
    2 rows of a 4-expert, top-2 mixture run every expert on every row, ``dense_experts``)."""
    from nvkit.generate.fast.model_rows import ModelRowsDecoder
    cfg_class = getattr(transformers, family + "Config")
    model_class = getattr(transformers, family.replace("Text", "") + "ForCausalLM")
    cfg = cfg_class(**SIZES, **ALL_FAMILIES[family])
    cfg._attn_implementation = "eager" if family == "GptOss" else "sdpa"  # gpt-oss's sinks
    torch.manual_seed(0)
    model = model_class(cfg).eval()

    s = _session(model)
    gen, prompts, sampling, ref = list_case(model, 10, (2, 13, 7, 9), seed=5)
    assert support.rows_why(s, gen) is None  # the mixtures of experts too: their rows run every expert (experts)
    d = fast.FastDecoder(model, k_steps=4, graphs=False)
    assert not d.fused
    bd = ModelRowsDecoder(d, max_rows=2)
    with torch.inference_mode():
        got = bd.generate(prompts, sampling)
    assert got == ref, bd.describe()
    assert bd.describe().startswith("model forward over rows") and max(bd.last_batches) == 2, bd.describe()


def test_a_list_over_a_models_own_forward_attends_through_the_paged_kernel():
    """The rows step over a model's own forward with its attention through nvkit's paged kernel
    (``model_rows.paged_rows_attention``, run by Triton's interpreter: families the fused step does
    not cover, with sliding and hybrid windows and a mixture of experts): each prompt
    token for token as plain ``generate`` of it alone, the page tables as wide as the model's
    context while the rows read only their own positions; the model's own attention is back after."""
    from tests.triton_interpreter import interpret
    out = interpret("""
        import torch
        import nvkit.generate.fast as fast
        from nvkit.generate.fast.model_rows import ModelRowsDecoder, paged_rows_why
        from tests.generate.test_families_step import SIZES, tiny, list_case
        for family in ("Starcoder2", "Cohere2", "Olmoe"):  # every layer sliding; hybrid; a mixture of experts
            model = tiny(family)
            own = model.config._attn_implementation
            assert paged_rows_why(model) is None, family
            bd = ModelRowsDecoder(fast.FastDecoder(model, k_steps=4, graphs=False), max_rows=2)
            assert bd.attention == "matmul" and "CUDA" in bd.attention_why  # "auto" on a CPU
            bd.attention = "paged"  # as "auto" takes it on a GPU
            _, prompts, sampling, ref = list_case(model, 10, (2, 13, 7, 9), seed=5)
            with torch.inference_mode():
                got = bd.generate(prompts, sampling)
            assert got == ref, (family, got, ref)
            assert "paged attention" in bd.describe() and model.config._attn_implementation == own, bd.describe()
            assert bd._arena.table.shape[1] * 32 >= min(SIZES["max_position_embeddings"], 4096), bd._arena.table.shape
            print(family, "ok")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count(" ok") == 3, out


def test_the_paged_attention_over_a_models_forward_says_where_it_cannot_run():
    from nvkit.errors import NvkitError
    from nvkit.generate.fast.model_rows import ModelRowsDecoder, paged_rows_attention, paged_rows_why
    gpt_oss = tiny("GptOss")
    assert paged_rows_why(gpt_oss) == "its attention has sinks"  # gpt-oss gathers its rows' positions
    bd = ModelRowsDecoder(fast.FastDecoder(gpt_oss, k_steps=4, graphs=False), max_rows=2)
    assert bd.attention == "matmul" and "CUDA" in bd.attention_why and "matmul attention" in bd.describe()
    d = fast.FastDecoder(tiny("Olmoe"), k_steps=4, graphs=False, attention="matmul")
    assert ModelRowsDecoder(d, max_rows=2).attention == "matmul"  # asked for by name: no kernel looked for
    q = torch.zeros(2, 4, 1, 16)
    with pytest.raises(NvkitError, match="only inside nvkit's rows decode step"):
        paged_rows_attention(d.model.model.layers[0].self_attn, q, q, q, None)


def test_the_models_own_forward_refuses_a_fused_model_and_the_session_picks_the_right_rows():
    """``ModelRowsDecoder`` is for models the fused step does not fit; a session's rows decoder is
    the fused one where it fits and the model-forward one elsewhere."""
    from nvkit.errors import NvkitError
    from nvkit.generate.fast.decoders import Decoders
    from nvkit.generate.fast.model_rows import ModelRowsDecoder
    from nvkit.generate.fast.rows import BatchedDecoder
    fused = fast.FastDecoder(tiny("Llama"), k_steps=4, graphs=False)
    with pytest.raises(NvkitError, match="use BatchedDecoder"):
        ModelRowsDecoder(fused)
    for family, kind in (("Llama", BatchedDecoder), ("Starcoder2", ModelRowsDecoder)):
        decoders = Decoders()
        model = tiny(family)
        decoders.swap(model, fast.FastDecoder(model, k_steps=4, graphs=False))
        rows = decoders.batched(model)
        assert type(rows) is kind, (family, type(rows))
        decoders.release()


def test_a_sampled_list_on_the_models_own_forward_depends_on_each_prompts_seed_only():
    """Sampling on the rows over a model's own forward (Cohere 2's sliding and full layers): a
    prompt's text depends on its seed, not on the prompts beside it or the row it lands in, and a
    repetition penalty and ``min_new_tokens`` hold per row."""
    from nvkit.generate.fast.model_rows import ModelRowsDecoder
    model = tiny("Cohere2")
    bd = ModelRowsDecoder(fast.FastDecoder(model, k_steps=4, graphs=False), max_rows=2)
    rng = torch.Generator().manual_seed(8)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (4, 12, 7)]
    gen = dict(max_new_tokens=10, min_new_tokens=10, do_sample=True, temperature=0.9, top_p=0.9,
               repetition_penalty=1.3, eos_token_id=3)
    sampling, why = fast.resolve(model, gen)
    assert why is None, why
    with torch.inference_mode():
        together = bd.generate(prompts, sampling, seeds=[11, 12, 13])
        alone = [bd.generate([p], sampling, seeds=[s])[0] for p, s in zip(prompts, (11, 12, 13))]
        reordered = bd.generate(prompts[::-1], sampling, seeds=[13, 12, 11])[::-1]
        other_seed = bd.generate(prompts[:1], sampling, seeds=[99])[0]
    assert together == alone == reordered and all(len(t) == 10 for t in together)
    assert other_seed != together[0]


def longrope_phi3():
    """A tiny Phi-3 with LongRoPE (original context 16, 12 of 16 dims rotated), with weights large
    enough that attention follows the rotation (at the default scale it is near uniform, and tables
    of the wrong factors would go unseen)."""
    rope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                original_max_position_embeddings=16, short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                long_factor=[1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    cfg = transformers.Phi3Config(**SIZES, pad_token_id=0, original_max_position_embeddings=16, initializer_range=0.25,
                                  rope_parameters=rope)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.Phi3ForCausalLM(cfg).eval()


def gemma3_vision_language():
    """A tiny Gemma 3 as its 4B-and-up checkpoints load (``Gemma3ForConditionalGeneration``)."""
    text = dict(SIZES, **ALL_FAMILIES["Gemma3Text"])
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def test_a_longrope_model_runs_fast_where_its_text_stays_on_one_side_of_the_switch():
    """Phi-3 with LongRoPE (Phi-3.5, Phi-4-mini), original context 16 here: transformers rotates a
    text up to that long with the short factors and a longer one with the long factors from its
    first position (encoding the whole text again where it grows past it). The fused step takes
    the short or the long tables by the request, in place (no capture again), alone and in lists;
    a request that would grow past the switch, or a list mixing both sides, runs plain
    ``generate`` and says why; so does the model's own forward (``fused=False``) for the same reasons."""
    from nvkit.generate.fast.fused_fit import long_rope_from
    from nvkit.generate.fast.rows import BatchedDecoder
    model = longrope_phi3()
    assert long_rope_from(model.config) == 16
    gen = dict(max_new_tokens=20, do_sample=False, eos_token_id=NEVER)

    def plain(p, new):
        with torch.inference_mode():
            out = model.generate(torch.tensor([p]), pad_token_id=0, **dict(gen, max_new_tokens=new))
        return out[0, len(p):].tolist()

    def prompt(n):
        return torch.randint(1, SIZES["vocab_size"], (n,), generator=torch.Generator().manual_seed(n)).tolist()
    for fused in (None, False):
        d = fast.FastDecoder(model, k_steps=4, graphs=False, fused=fused)
        assert d.describe().startswith("fused step" if fused is None else "model forward"), d.describe()
        for n, new in ((5, 8), (20, 20), (9, 6)):  # short tables, long ones, short again (switched back in place)
            with torch.inference_mode():
                assert d.generate(torch.tensor([prompt(n)]), fast.resolve(model, dict(gen, max_new_tokens=new))[0]) \
                    == plain(prompt(n), new), (fused, n, new)
        crossing = prompt(9)  # 9 + 20 grows past 16: the captured step's text is not transformers'
        with torch.inference_mode():
            assert d.generate(torch.tensor([crossing]), fast.resolve(model, gen)[0]) != plain(crossing, 20)
    bd = BatchedDecoder(fast.FastDecoder(model, k_steps=4, graphs=False), max_rows=2)
    for lengths, new in (((5, 7, 3), 8), ((20, 30, 17), 12)):
        prompts = [prompt(n) for n in lengths]
        with torch.inference_mode():
            assert bd.generate(prompts, fast.resolve(model, dict(gen, max_new_tokens=new))[0]) == \
                [plain(p, new) for p in prompts], lengths

    class Decoders:  # a session whose lists' graphs are captured: a prompt could take them instead
        @staticmethod
        def batched_ready():
            return True
    s = _session(model)
    s.tokenizer = lambda text: {"input_ids": [1] * len(text)}
    s.decoders = Decoders()
    for texts, path, why in ((["x" * 9], "generate", "grow past 16 tokens"), (["x" * 20], "fast", None),
                             (["x" * 5], "fast", None), (["x" * 20, "x" * 9], "generate", "grow past 16 tokens"),
                             (["x" * 20, "x" * 3], "generate", "mixes prompts over and under 16"),
                             (["x" * 20, "x" * 30], "fast batch", None)):
        r = support.route(s, texts, dict(gen, max_new_tokens=10), True)
        assert r.path == path and (why is None or why in r.why), (texts, r)


def test_gemma3_as_its_larger_checkpoints_load_runs_the_fused_step_on_its_language_model():
    """Gemma 3 from 4B up is a vision-language checkpoint (``Gemma3ForConditionalGeneration``,
    what ``AutoModelForCausalLM`` loads): text generation runs the fused step on its language model
    (``fused_fit.decoder_of``), alone and in a list, token for token as plain ``generate``."""
    from nvkit.generate.fast.fused_fit import decoder_of
    from nvkit.generate.fast.rows import BatchedDecoder
    model = gemma3_vision_language()
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    assert decoder_of(model) is model.model.language_model
    gen = dict(max_new_tokens=16, do_sample=False, eos_token_id=NEVER)
    assert support.single_why(_session(model), gen) is None and support.rows_why(_session(model), gen) is None
    d = fast.FastDecoder(model, k_steps=4, graphs=False)
    assert d.describe().startswith("fused step"), d.describe()
    sampling, _ = fast.resolve(model, gen)
    rng = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (9, 4, 12)]
    with torch.inference_mode():
        want = [model.generate(torch.tensor([p]), pad_token_id=0, **gen)[0, len(p):].tolist() for p in prompts]
        assert d.generate(torch.tensor([prompts[0]]), sampling) == want[0]
        bd = BatchedDecoder(d, max_rows=2)
        assert bd.generate(prompts, sampling) == want
    assert bd.describe().startswith("fused step over rows")
