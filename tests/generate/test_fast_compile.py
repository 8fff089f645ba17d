"""The fused decode step traces whole under ``torch.compile(fullgraph=True)`` (inductor on the CPU
here, as on a GPU before the capture), with and without LoRA adapters, and computes what the
eager step does: a graph break would mean host work per token on the GPU."""

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
