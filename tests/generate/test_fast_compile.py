"""The fused decode step traces whole under ``torch.compile(fullgraph=True)`` (inductor on the CPU
here, as on a GPU before the capture), with and without LoRA adapters, and computes what the
eager step does: a graph break would mean host work per token on the GPU."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import nvkit
import nvkit.generate.fast as fast


def test_decode_step_compiles_fullgraph_with_and_without_adapters():
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path(), dtype=torch.float32).eval()
    get_peft_model(m, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)).eval()
    d = fast.FastDecoder(m, k_steps=2, graphs=False)
    with torch.inference_mode():
        assert d._sync()  # the adapter is active: its buffers are filled
        c = d._cache_for(100)
        for lora_on in (False, True):
            step = d._step(c, lora_on)
            compiled = torch.compile(step, fullgraph=True, dynamic=False)
            c.pos.fill_(5)
            c.tok.fill_(7)
            got = compiled(c.tok)
            assert int(c.pos) == 6  # the step advances the position on the device
            c.pos.fill_(5)
            want = step(c.tok)
            assert got.shape == (1, m.config.vocab_size)
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (lora_on, (got - want).abs().max())


def test_one_compiled_layer_serves_every_layer_and_computes_the_whole_step():
    """``FastOptions.regional``: the decode layer and the head compiled on their own
    (``llama_step.decode_layer``, ``decode_head``) give the eager step's logits, with and without
    adapters, and one compile of the layer serves all the model's layers."""
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.testing import CompileCounterWithBackend

    from nvkit.generate.fast.llama_step import decode_head, decode_layer, decode_step
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path(), dtype=torch.float32).eval()
    get_peft_model(m, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)).eval()
    d = fast.FastDecoder(m, k_steps=2, graphs=False, regional=True, lora_merged=False)
    assert d.variant.regional and d.regional
    fw = d._fw
    assert len(fw.layers) > 1
    with torch.inference_mode():
        assert d._sync()
        c = d._cache_for(100)
        for lora_on in (False, True):
            lora = d._adapters.slots if lora_on else None
            compiles = CompileCounterWithBackend("inductor")
            layer = torch.compile(decode_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, d.attention), fullgraph=True,
                                  dynamic=False, backend=compiles)
            head = torch.compile(decode_head(fw), fullgraph=True, dynamic=False, backend=compiles)
            regional = decode_step(fw, c, d.attention, lora, layer=layer, head=head)
            c.pos.fill_(5)
            c.tok.fill_(7)
            got = regional(c.tok)
            assert compiles.frame_count == 2  # the layer once for every layer, and the head
            assert int(c.pos) == 6
            c.pos.fill_(5)
            want = d._step(c, lora_on)(c.tok)
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (lora_on, (got - want).abs().max())
    # its compile artifacts are kept apart from the whole step's
    keys = {}
    for regional in (False, True):
        e = fast.FastDecoder(m, k_steps=2, graphs=False, regional=regional, disk_cache=True, compile=True)
        keys[regional] = e._disk_key(c, False)
    assert keys[False] != keys[True]


def test_how_the_step_compiles_is_a_benchmark_variant_not_a_user_option():
    from nvkit.errors import NvkitError
    from nvkit.generate.fast.options import ENVIRONMENT_VARIABLES, FastOptions
    from nvkit.generate.fast.runner import StepVariant, split_overrides
    assert StepVariant().regional is True and StepVariant().tune is True and StepVariant().pdl is None
    assert not {"NVKIT_FAST_REGIONAL", "NVKIT_FAST_TUNE", "NVKIT_FAST_PDL"} & set(ENVIRONMENT_VARIABLES)
    with pytest.raises(NvkitError, match="regional must be True or False"):
        StepVariant(regional="yes")
    with pytest.raises(NvkitError, match="inductor must be a dict"):
        StepVariant(inductor=["combo_kernels"])
    opts, variant = split_overrides(FastOptions(), StepVariant(), dict(k_steps=4, regional=False, tune=None))
    assert opts.k_steps == 4 and variant == StepVariant(regional=False)
    with pytest.raises(NvkitError, match="Unknown fast-path option"):
        split_overrides(FastOptions(), StepVariant(), dict(warp=9))
    assert StepVariant().gemv is True and not {"NVKIT_FAST_GEMV"} & set(ENVIRONMENT_VARIABLES)
    with pytest.raises(NvkitError, match="gemv must be True or False"):
        StepVariant(gemv=1)
    assert StepVariant().experts is False
    with pytest.raises(NvkitError, match="experts must be True or False"):
        StepVariant(experts="on")


def test_the_six_kernel_layers_say_where_they_run_and_why_not():
    """``StepVariant.gemv`` (on by default; the decode benchmark's "+nogemv" turns it off): where
    the uncompiled step has nvkit's Triton kernels (a GPU gives them), the stats line says whether
    the six-kernel layers run and why not; without those kernels, or compiled, it says nothing of
    them (they are not that step's)."""
    from nvkit.generate.fast.single import FastDecoder
    from tests.generate.test_families_step import tiny

    def with_kernels(d):  # what a GPU gives the uncompiled step; only the step's wiring is read here
        d.kernels = True
        return d
    asked = with_kernels(FastDecoder(tiny("Qwen3"), graphs=False, attention="triton-fused"))
    assert "six-kernel layers: uncompiled" in asked.describe() and "apart" not in asked.describe(), asked.describe()
    assert "six-kernel" not in with_kernels(FastDecoder(tiny("Qwen3"), graphs=False, gemv=False,
                                                        attention="triton-fused")).describe()
    assert "six-kernel" not in FastDecoder(tiny("Qwen3"), graphs=False, attention="triton-fused").describe()
    matmul = with_kernels(FastDecoder(tiny("Qwen3"), graphs=False, attention="matmul"))
    assert "six-kernel layers: it runs on the triton-fused attention" in matmul.describe()
    gemma = with_kernels(FastDecoder(tiny("Gemma2"), graphs=False, attention="matmul"))
    assert "six-kernel layers: it runs on the triton-fused" in gemma.describe()

    def layer_of(d, lora_on=False):  # the layer function the decoder's step runs
        step = d._step(d._cache_for(64), lora_on)
        return next(c.cell_contents for c, name in zip(step.__closure__, step.__code__.co_freevars)
                    if name == "layer").__qualname__
    # the adapter's step too: its products apart in the layer's kernels
    assert layer_of(asked).startswith("gemv_decode_layer") and layer_of(asked, True).startswith("gemv_decode_layer")
    nine = with_kernels(FastDecoder(tiny("Qwen3"), graphs=False, gemv=False, attention="triton-fused"))
    assert layer_of(nine).startswith("decode_layer")
    assert layer_of(FastDecoder(tiny("Qwen3"), graphs=False, attention="triton-fused")).startswith(
        "decode_layer")  # no Triton kernels in the step: the usual layer


def test_the_folded_adapter_layer_compiles_and_computes_the_unfolded_step():
    """``FastOptions.lora_fold``: the layer with A folded below the weights traces whole, once for
    every layer, and gives the unfolded step's logits; its compile artifacts are keyed apart."""
    from peft import LoraConfig, get_peft_model
    from torch._dynamo.testing import CompileCounterWithBackend

    from nvkit.errors import NvkitError
    from nvkit.generate.fast.llama_step import decode_head, decode_layer, decode_step
    from nvkit.generate.fast.options import FastOptions
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path(), dtype=torch.float32).eval()
    get_peft_model(m, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)).eval()
    plain = fast.FastDecoder(m, k_steps=2, graphs=False, lora_fold=False, lora_merged=False)
    d = fast.FastDecoder(m, k_steps=2, graphs=False, lora_fold=True, lora_merged=False)  # the default: fused weights with spare rows
    fw = d._fw
    with torch.inference_mode():
        assert d._sync() and d._adapters.slots.folded and plain._sync() and not plain._adapters.slots.folded
        c, pc = d._cache_for(100), plain._cache_for(100)
        compiles = CompileCounterWithBackend("inductor")
        layer = torch.compile(decode_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, d.attention), fullgraph=True,
                              dynamic=False, backend=compiles)
        head = torch.compile(decode_head(fw), fullgraph=True, dynamic=False, backend=compiles)
        step = decode_step(fw, c, d.attention, d._adapters.slots, layer=layer, head=head)
        c.pos.fill_(5)
        c.tok.fill_(7)
        got = step(c.tok)
        assert compiles.frame_count == 2
        pc.pos.fill_(5)
        pc.tok.fill_(7)
        want = plain._step(pc, True)(pc.tok)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
        assert d._disk_key(c, True) != d._disk_key(c, False)
    with pytest.raises(NvkitError, match="NVKIT_FAST_LORA_FOLD"):
        FastOptions.from_env({"NVKIT_FAST_LORA_FOLD": "perhaps"})
    assert FastOptions().lora_fold and not FastOptions.from_env({"NVKIT_FAST_LORA_FOLD": "0"}).lora_fold


@pytest.mark.parametrize("raw, ok", [("0", 0.0), ("2.5", 2.5), ("-1", None), ("soon", None), ("nan", None),
                                     ("inf", None)])
def test_prefill_after_from_the_environment(raw, ok):
    """``NVKIT_FAST_PREFILL_AFTER``: seconds of eager prefill before the batched prefill compiles."""
    from nvkit.errors import NvkitError
    from nvkit.generate.fast.options import FastOptions
    assert FastOptions().prefill_after == 10.0
    if ok is None:
        with pytest.raises(NvkitError, match="NVKIT_FAST_PREFILL_AFTER"):
            FastOptions.from_env({"NVKIT_FAST_PREFILL_AFTER": raw})
    else:
        assert FastOptions.from_env({"NVKIT_FAST_PREFILL_AFTER": raw}).prefill_after == ok
    for bad in (-0.5, "1", True, float("nan")):
        with pytest.raises(NvkitError, match="prefill_after"):
            FastOptions(prefill_after=bad)


@pytest.mark.parametrize("raw, ok", [("0", 0.0), ("45", 45.0), ("-1", None), ("later", None), ("inf", None)])
def test_compile_after_from_the_environment(raw, ok):
    """``NVKIT_FAST_COMPILE_AFTER``: seconds of uncompiled decoding before the batch-1 step compiles."""
    from nvkit.errors import NvkitError
    from nvkit.generate.fast.options import FastOptions
    assert FastOptions().compile_after == 30.0
    if ok is None:
        with pytest.raises(NvkitError, match="NVKIT_FAST_COMPILE_AFTER"):
            FastOptions.from_env({"NVKIT_FAST_COMPILE_AFTER": raw})
    else:
        assert FastOptions.from_env({"NVKIT_FAST_COMPILE_AFTER": raw}).compile_after == ok
    for bad in (-1, "30", False, float("nan"), float("inf")):
        with pytest.raises(NvkitError, match="compile_after"):
            FastOptions(compile_after=bad)


@pytest.mark.parametrize("family", ["Gemma2", "Gemma3Text"])
def test_a_windowed_family_compiles_fullgraph_whole_and_by_layer(family):
    """The Gemma family on the fused step traces whole under ``fullgraph`` (its windows' masks, the
    soft-caps, the second rotary table, GELU, the four norms of 1 + w), whole and by layer, and
    computes the eager step's logits."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from nvkit.generate.fast.llama_step import decode_head, decode_step, model_decode_layer
    from tests.generate.test_families_step import tiny
    model = tiny(family)
    d = fast.FastDecoder(model, k_steps=2, graphs=False)
    fw = d._fw
    assert {w.window for w in fw.layers} == {0, 6}
    with torch.inference_mode():
        c = d._cache_for(100)
        eager = d._step(c, False)
        whole = torch.compile(eager, fullgraph=True, dynamic=False, backend="eager")
        compiles = CompileCounterWithBackend("eager")
        layer = torch.compile(model_decode_layer(fw, d.attention), fullgraph=True, dynamic=False, backend=compiles)
        head = torch.compile(decode_head(fw), fullgraph=True, dynamic=False, backend=compiles)
        regional = decode_step(fw, c, d.attention, layer=layer, head=head)
        got = {}
        for name, fn in (("eager", eager), ("whole", whole), ("regional", regional)):
            c.pos.fill_(11)  # past the window of 6
            c.tok.fill_(7)
            got[name] = fn(c.tok)
        # matmul attention reads the layer's mask, not its window: one compile of the layer serves
        # sliding and full layers alike (the kernels take the window: two variants on a GPU)
        assert compiles.frame_count == 2, compiles.frame_count
    for name in ("whole", "regional"):
        diff = (got[name] - got["eager"]).abs().max()
        assert torch.allclose(got[name], got["eager"], atol=1e-4, rtol=1e-4), (name, diff)
