"""Sliding-window and hybrid models on the batch-1 fast path with its CUDA graphs (issue 37):
greedy tokens equal plain ``generate``'s for 64 new tokens, decoding well past the window, on tiny
random Gemma 2, Gemma 3, Mistral (windowed) and Phi-3 models in float32, on nvkit's fused step
and with ``fused=False`` on the model's own forward; the stats
line says which ran. The same models on the CPU, without graphs:
tests/generate/test_sliding_window.py."""

import pytest
import torch

import nvkit.generate.fast as fast
from tests.generate.test_sliding_window import FAMILIES, NEVER, SIZES, _model


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sliding_window_model_runs_its_graphs_as_plain_generate(family, fused):
    model = _model(family).to("cuda")
    d = fast.FastDecoder(model, k_steps=8, fused=fused)
    try:
        for prompt_len in (5, 40):
            ids = torch.randint(1, SIZES["vocab_size"], (1, prompt_len), device="cuda")
            gen = dict(max_new_tokens=64, do_sample=False, eos_token_id=NEVER)
            with torch.inference_mode():
                ref = model.generate(ids, pad_token_id=0, **gen)[0, prompt_len:].tolist()
                sampling, why = fast.resolve(model, gen)
                assert why is None, why
                got = d.generate(ids, sampling)
            assert got == ref, (family, prompt_len, d.describe())
        want = "fused step" if fused is None else "model forward"
        assert d.describe().startswith(want) and d.counts["compiles"] == 1, (d.describe(), d.counts)
    finally:
        d.release()


@pytest.mark.parametrize("family", ["gemma3", "phi3"])
def test_a_lora_adapter_in_the_models_own_forward_runs_its_own_graphs(family):
    """Adapters on a family the fused step does not cover run in PEFT's own layers inside the
    captured graphs: tuned tokens are PEFT's, the adapter switched off gives the base model's from
    a graph of its own, and another adapter gets new graphs (a stale one would replay the old)."""
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(_model(family), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                    init_lora_weights=False)).to("cuda")
    d = fast.FastDecoder(pm.get_base_model(), k_steps=8, fused=False)  # Gemma 3 fits the fused step too
    ids = torch.randint(1, SIZES["vocab_size"], (1, 12), device="cuda")
    gen = dict(max_new_tokens=48, do_sample=False, eos_token_id=NEVER)
    sampling, _ = fast.resolve(pm.get_base_model(), gen)

    def both():
        with torch.inference_mode():
            return pm.generate(input_ids=ids, pad_token_id=0, **gen)[0, 12:].tolist(), d.generate(ids, sampling)
    try:
        for _ in range(2):  # the second time from the graphs captured the first
            tuned, ours = both()
            assert ours == tuned
            with pm.disable_adapter():
                base, ours = both()
                assert ours == base
        assert base != tuned
        pm.add_adapter("other", LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False))
        pm.set_adapter("other")
        tuned, ours = both()
        assert ours == tuned and "LoRA in PEFT's own layers" in d.describe()
    finally:
        d.release()
