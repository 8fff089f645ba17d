"""LoRA adapters on the fast path, unmerged (CPU, the fused step without CUDA graphs, fp32): the
same greedy tokens as PEFT's own generate with a trained adapter; adapters switched, disabled,
trained further or merged without compiling again."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import nvkit
import nvkit.generate.fast as fast
from nvkit.generate.fast import lora

NEVER = 10 ** 7
PROMPTS = ["NVIDIA GPUs are", "The memory of a GPU", "Hello there"]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(nvkit.demo.path())


def _model():
    return AutoModelForCausalLM.from_pretrained(nvkit.demo.path(), dtype=torch.float32).eval()


def _train(peft_model, tok, steps: int = 6, seed: int = 0):
    """A few optimizer steps on a sentence, so the adapter is a trained one (B no longer zero)."""
    torch.manual_seed(seed)
    batch = tok(["NVIDIA GPUs are built for parallel work: thousands of cores share the memory."] * 2,
                return_tensors="pt")
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=5e-3)
    peft_model.train()
    for _ in range(steps):
        loss = peft_model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    peft_model.eval()


def _peft_greedy(model, tok, prompt, n=20):
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return ids, model.generate(input_ids=ids, max_new_tokens=n, do_sample=False, eos_token_id=NEVER,
                                   pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()


def _fast(d, model, ids, n=20):
    sampling, _ = fast.resolve(model, dict(max_new_tokens=n, do_sample=False, eos_token_id=NEVER))
    with torch.inference_mode():
        return d.generate(ids, sampling)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "apart"])
def test_trained_adapter_decodes_as_peft_does_and_switches_without_compiling(tok, merged):
    """Merged into a copy (the default) and with the products apart: PEFT's tokens, adapters
    switched, disabled, trained further and merged by PEFT, with one compile for the adapter step."""
    from peft import LoraConfig, get_peft_model
    base = _model()
    plain = {p: _peft_greedy(base, tok, p)[1] for p in PROMPTS}
    pm = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.1))
    _train(pm, tok)
    assert lora.lora_why(pm) is None and lora.active(base) and lora.needed_rank(base) == 8
    d = fast.FastDecoder(base, k_steps=4, graphs=False, lora_merged=merged)
    tuned = {}
    for p in PROMPTS:
        ids, ref = _peft_greedy(pm, tok, p)
        tuned[p] = ref
        assert _fast(d, base, ids) == ref, p
    assert tuned != plain  # the adapter changes the text: the check above compared something
    assert d.counts == {"compiles": 1}
    assert ("LoRA merged into a copy of 16 projection groups" if merged else "LoRA unmerged") in d.describe()
    copy = d._adapters.merged
    assert (copy is not None) == merged
    ids = tok(PROMPTS[0], return_tensors="pt")["input_ids"]
    with pm.disable_adapter():  # off: the base model's text, from the graphs already there
        assert not lora.active(base) and _fast(d, base, ids) == plain[PROMPTS[0]]
    assert _fast(d, base, ids) == tuned[PROMPTS[0]]
    # a second adapter of the same rank: loaded into the same buffers, nothing compiled
    pm.add_adapter("second", LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    pm.set_adapter("second")
    _train(pm, tok, seed=1)
    ids2, ref2 = _peft_greedy(pm, tok, PROMPTS[1])
    assert _fast(d, base, ids2) == ref2 and d._adapters.merged is copy  # refilled in place: its graphs stay
    pm.set_adapter("default")
    assert _fast(d, base, ids) == tuned[PROMPTS[0]]
    # trained further in place (an optimizer step): the buffers follow
    _train(pm, tok, steps=3, seed=2)
    ids3, ref3 = _peft_greedy(pm, tok, PROMPTS[2])
    assert _fast(d, base, ids3) == ref3
    compiles = dict(d.counts)
    # merged: the weights change in place or are replaced; either way decoded, no compile
    merged = pm.merge_and_unload()
    assert merged is base and not lora.active(base)
    _, ref4 = _peft_greedy(merged, tok, PROMPTS[2])
    assert _fast(d, base, ids3) == ref4 and dict(d.counts) == compiles
    assert d._adapters.merged is None  # the adapters gone (merged by PEFT): no copy held for them


def test_a_larger_rank_gets_larger_buffers_once(tok):
    from peft import LoraConfig, get_peft_model
    base = _model()
    pm = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "o_proj"], init_lora_weights=False))
    d = fast.FastDecoder(base, k_steps=4, graphs=False, lora_merged=False)
    ids, ref = _peft_greedy(pm, tok, PROMPTS[0], n=8)
    assert _fast(d, base, ids, n=8) == ref and d._adapters.slots.rank == 8
    pm.add_adapter("wide", LoraConfig(r=24, target_modules=["k_proj", "up_proj"], init_lora_weights=False))
    pm.base_model.set_adapter(["default", "wide"])  # both at once: their ranks add up where they share a layer
    ids, ref = _peft_greedy(pm, tok, PROMPTS[0], n=8)
    assert lora.needed_rank(base) == 24 and _fast(d, base, ids, n=8) == ref and d._adapters.slots.rank == 24
    assert d.counts == {"compiles": 2}


def test_what_the_fast_path_does_not_run_of_an_adapter_is_named(tok):
    from peft import LoraConfig, get_peft_model
    dora = get_peft_model(_model(), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert "DoRA" in lora.lora_why(dora)
    saved = get_peft_model(_model(), LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    assert "modules_to_save" in lora.lora_why(saved)
    head = get_peft_model(_model(), LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    assert "lm_head" in lora.lora_why(head)
    from types import SimpleNamespace
    ok = get_peft_model(_model(), LoraConfig(r=4, target_modules="all-linear"))
    on_gpu = SimpleNamespace(model=ok, tokenizer=tok, device=SimpleNamespace(type="cuda"), quantization=None)
    assert fast.single_why(on_gpu, dict(max_new_tokens=4, do_sample=False)) is None
    on_gpu.model = dora
    assert "DoRA" in fast.single_why(on_gpu, dict(max_new_tokens=4, do_sample=False))


def test_folded_adapters_decode_as_peft_does(tok):
    """``lora_fold``: A folded into spare rows below the fused weights (batch-1 step) gives PEFT's
    greedy tokens with a trained adapter, the base model's with it disabled, and the model itself
    computes as before the spare rows; a rank past the spare rows runs its products apart."""
    from peft import LoraConfig, get_peft_model

    from nvkit.generate.fast.options import FOLD_RANK
    base = _model()
    ids = tok(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        before = base(input_ids=ids).logits
    pm = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.1))
    _train(pm, tok)
    d = fast.FastDecoder(base, k_steps=4, graphs=False, lora_fold=True, lora_merged=False)
    fw = d._fw
    assert fw.spare == 2 * FOLD_RANK and fw.layers[0].spare[0].shape[0] == fw.layers[0].qkv.shape[0] + 3 * fw.spare
    # the model's own weights are the fused tensors' rows (no second copy kept)
    from nvkit.generate.fast.fused_fit import base_layer
    layer0 = base.model.layers[0]
    assert base_layer(layer0.self_attn.o_proj).weight.data_ptr() == fw.layers[0].o.data_ptr()
    assert base_layer(layer0.mlp.down_proj).weight.data_ptr() == fw.layers[0].down.data_ptr()
    with torch.inference_mode(), pm.disable_adapter():
        assert torch.equal(base(input_ids=ids).logits, before)  # re-pointed weights, the same model
    for p in PROMPTS:
        ids, ref = _peft_greedy(pm, tok, p)
        assert _fast(d, base, ids) == ref, p
    assert d._adapters.slots.folded and "LoRA unmerged (rank ≤ 8, folded)" in d.describe()
    # the high and low halves sum to A: what x A.T needs
    a, b = d._adapters.slots.layers[0].qkv
    stacked = d._adapters.slots.layers[0].folded[0]
    n, r = b.shape[0], a.shape[0]
    assert torch.equal(stacked[n:n + r].float() + stacked[n + r:].float(), a.float())
    with pm.disable_adapter():
        ids, ref = _peft_greedy(pm, tok, PROMPTS[1])
        assert _fast(d, base, ids) == ref
    pm.add_adapter("wide", LoraConfig(r=24, target_modules=["k_proj", "down_proj"], init_lora_weights=False))
    pm.set_adapter("wide")
    ids, ref = _peft_greedy(pm, tok, PROMPTS[2], n=8)
    assert _fast(d, base, ids, n=8) == ref and d._adapters.slots.rank == 24 and not d._adapters.slots.folded


def test_folded_products_keep_the_adapters_precision():
    """In bf16 weights with a float32 adapter, the folded form computes what PEFT does (the base
    output rounded to bf16, the adapter's products in float32 added, rounded again) up to the
    last bit of a few outputs: A's two halves carry it to about 16 bits, not bf16's 8."""
    from nvkit.generate.fast.llama_step import linear
    torch.manual_seed(0)
    n, h, r = 512, 256, 16
    x = torch.randn(1, h).to(torch.bfloat16)
    w = torch.randn(n, h).to(torch.bfloat16)
    a, b = torch.randn(r, h) * 0.05, torch.randn(n, r) * 0.05
    high = a.to(torch.bfloat16)
    stacked = torch.cat([w, high, (a - high.float()).to(torch.bfloat16)])
    y = (x.double() @ w.double().T).to(torch.bfloat16)
    want = (y.double() + (x.double() @ a.double().T) @ b.double().T).to(torch.bfloat16)  # PEFT's order, exact sums
    got = linear(x, w, None, (a, b, stacked))
    assert got.dtype == torch.bfloat16 and got.shape == (1, n)
    spacing = 2.0 ** (torch.floor(torch.log2(want.float().abs())) - 7)  # one bf16 step at each output
    assert ((got.float() - want.float()).abs() <= spacing).all()
    assert (got != want).float().mean() <= 0.05
    # A rounded to bf16 alone would be off by far more in x A.T than the two halves are
    exact = x.double() @ a.double().T
    t_two = x.double() @ (high.double() + (a - high.float()).to(torch.bfloat16).double()).T
    t_one = x.double() @ high.double().T
    assert (t_two - exact).abs().max() < (t_one - exact).abs().max() / 50


def test_merged_copy_holds_pefts_merged_weights_and_grows_with_the_groups_adapters_change(tok):
    """``lora.MergedWeights``: each copied group is W + scaling·B·A (PEFT's own delta), the groups
    no adapter changes are the base tensors themselves (no copy); an adapter that changes a group
    the copy lacks makes a larger copy (its graphs captured again), PEFT's tokens throughout."""
    from peft import LoraConfig, get_peft_model
    base = _model()
    pm = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    d = fast.FastDecoder(base, k_steps=4, graphs=False)
    ids, ref = _peft_greedy(pm, tok, PROMPTS[0], n=8)
    assert _fast(d, base, ids, n=8) == ref
    copy = d._adapters.merged
    layers = len(base.model.layers)
    assert copy.groups == {(i, "qkv") for i in range(layers)}
    fw, w0 = d._fw, copy.weights.layers[0]
    assert w0.o is fw.layers[0].o and w0.gate_up is fw.layers[0].gate_up and w0.qkv is not fw.layers[0].qkv
    attn = base.model.layers[0].self_attn
    nq, nkv = attn.q_proj.base_layer.out_features, attn.k_proj.out_features
    with torch.no_grad():
        for name, rows in (("q_proj", slice(0, nq)), ("k_proj", slice(nq, nq + nkv)),
                           ("v_proj", slice(nq + nkv, nq + 2 * nkv))):
            m = getattr(attn, name)
            want = getattr(m, "base_layer", m).weight + (m.get_delta_weight("default") if hasattr(m, "lora_A") else 0)
            torch.testing.assert_close(w0.qkv[rows], want, rtol=1e-6, atol=1e-6)
    assert copy.nbytes() == sum(fw.layers[i].qkv.numel() * 4 for i in range(layers))
    compiles = d.counts["compiles"]
    pm.add_adapter("mlp", LoraConfig(r=4, target_modules=["down_proj"], init_lora_weights=False))
    pm.base_model.set_adapter(["default", "mlp"])
    ids, ref = _peft_greedy(pm, tok, PROMPTS[1], n=8)
    assert _fast(d, base, ids, n=8) == ref
    grown = d._adapters.merged
    assert grown is not copy and grown.groups == copy.groups | {(i, "down") for i in range(layers)}
    assert d.counts["compiles"] == compiles + 1  # the adapter step again, on the larger copy
    pm.base_model.set_adapter("default")  # fewer groups: the larger copy serves, refilled
    ids, ref = _peft_greedy(pm, tok, PROMPTS[2], n=8)
    assert _fast(d, base, ids, n=8) == ref and d._adapters.merged is grown


def test_an_adapter_that_cannot_be_merged_runs_apart_and_says_why(tok, monkeypatch):
    """Where the copy does not fit (``merge_why``: over ``MERGE_SHARE`` of the free memory) the
    products run apart, PEFT's tokens, and the stats line says why; ``release_merged`` (what a
    fine-tune asks for, through ``Decoders.release_lists``) drops the copy, and the next request
    makes it again."""
    from peft import LoraConfig, get_peft_model
    fw_groups = {}
    rule = lora.merge_why

    def budget(fw, groups, free=None):
        fw_groups["need"] = rule(fw, groups, free=1)  # the real rule with one byte free
        return fw_groups["need"]
    base = _model()
    pm = get_peft_model(base, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))
    d = fast.FastDecoder(base, k_steps=4, graphs=False)
    with monkeypatch.context() as mp:
        mp.setattr(lora, "merge_why", budget)
        ids, ref = _peft_greedy(pm, tok, PROMPTS[0], n=8)
        assert _fast(d, base, ids, n=8) == ref
        assert d._adapters.merged is None and "copy of the weights it changes, over 50% of the 1 B free" in \
            fw_groups["need"]
        assert "; merging the adapter needs a" in d.describe(), d.describe()
    assert lora.merge_why(d._fw, {(0, "qkv")}, free=10 ** 12) is None
    d.release()  # a new decoder state: the budget allows the copy now
    assert _fast(d, base, ids, n=8) == ref and d._adapters.merged is not None
    held = d._adapters.merged.nbytes()
    assert d.release_merged() == held and d._adapters.merged is None and d.release_merged() == 0
    assert _fast(d, base, ids, n=8) == ref and d._adapters.merged is not None and "LoRA merged" in d.describe()
    from nvkit.generate.fast.decoders import Decoders
    held = Decoders()
    held.single = d
    held.release_lists()  # what a fine-tune calls first: the copy goes with the lists, the decoder stays
    assert d._adapters.merged is None and held.single is d and _fast(d, base, ids, n=8) == ref


def test_base_weights_replaced_under_a_merged_adapter_are_merged_again(tok):
    """New base weights copied into the fused tensors (``FusedWeights.sync``) while an adapter is
    attached: the copy is recomputed from them, so the tokens are PEFT's on the new weights."""
    from peft import LoraConfig, get_peft_model
    base = _model()
    pm = get_peft_model(base, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False))
    d = fast.FastDecoder(base, k_steps=4, graphs=False)
    ids, ref = _peft_greedy(pm, tok, PROMPTS[0], n=8)
    assert _fast(d, base, ids, n=8) == ref
    torch.manual_seed(1)
    for layer in base.model.layers:
        down = layer.mlp.down_proj.base_layer
        with torch.no_grad():  # a replaced parameter, as loading weights does
            down.weight = torch.nn.Parameter(torch.randn_like(down.weight) * down.weight.std() * 2)
    ids, ref2 = _peft_greedy(pm, tok, PROMPTS[0], n=8)
    assert ref2 != ref and _fast(d, base, ids, n=8) == ref2 and d._adapters.merged is not None
