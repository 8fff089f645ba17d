"""Sliding-window and hybrid models on the batch-1 fast path (issue 37): Gemma 2 and 3 (sliding and
full layers), a Mistral and a Phi-3 with a window on every layer. All run nvkit's fused step, each
sliding layer masked to its window (``llama_step.window_masks``; the kernels' lower bound on the
GPU); with ``fused=False`` the model's own forward is the step, over a cache that keeps every
position, with masks that keep each sliding layer to its window (``static_cache.model_masks``).
Either way greedy tokens equal plain ``generate``'s well past the window. Tiny random models in
float32 on the CPU, built from transformers' configs (nothing downloaded)."""

import pytest
import torch
import transformers

import nvkit.generate.fast as fast
from nvkit.generate.fast.fused_fit import fusable_why, layer_kinds
from nvkit.generate.fast.static_cache import model_masks

NEVER = 10 ** 7
WINDOW = 6
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=WINDOW)
FAMILIES = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(layer_types=["sliding_attention", "full_attention"] * 2)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
}


def _model(family, **extra):
    config_cls, model_cls, kw = FAMILIES[family]
    sizes = dict(SIZES, **kw, **extra)
    if family == "phi3":
        sizes.pop("head_dim")
    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(**sizes)
    cfg._attn_implementation = "sdpa" if family != "gemma2" else "eager"  # Gemma 2 soft-caps its scores
    return getattr(transformers, model_cls)(cfg).eval()


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sliding_window_model_decodes_as_plain_generate_past_its_window(family, fused):
    model = _model(family)
    assert "sliding_attention" in layer_kinds(model.config)
    assert fusable_why(model) is None, fusable_why(model)
    d = fast.FastDecoder(model, k_steps=4, graphs=False, fused=fused)
    on_fused = fused is None
    assert d.describe().startswith("fused step" if on_fused else "model forward"), d.describe()
    for prompt_len, n in ((3, 20), (11, 9)):  # decoding across the window, and a prompt longer than it
        ids = torch.randint(1, SIZES["vocab_size"], (1, prompt_len))
        gen = dict(max_new_tokens=n, do_sample=False, eos_token_id=NEVER)
        with torch.inference_mode():
            ref = model.generate(ids, pad_token_id=0, **gen)[0, prompt_len:].tolist()
            sampling, why = fast.resolve(model, gen)
            assert why is None, why
            assert d.generate(ids, sampling) == ref, (family, prompt_len)


def test_the_masks_keep_a_sliding_layer_to_its_window():
    model = _model("gemma3")
    arange = torch.arange(16)
    masks = model_masks(model, arange, torch.tensor([10]))
    assert set(masks) == {"full_attention", "sliding_attention"}
    seen = lambda m: (m[0, 0, 0] == 0).nonzero().view(-1).tolist()  # noqa: E731
    assert seen(masks["full_attention"]) == list(range(11))
    assert seen(masks["sliding_attention"]) == list(range(11 - WINDOW, 11))  # the window's last WINDOW positions
    # a window at least as long as the context is full attention: one mask, no sliding
    wide = _model("mistral", sliding_window=SIZES["max_position_embeddings"])
    assert layer_kinds(wide.config) == ["full_attention"] * 4 and fusable_why(wide) is None
    assert isinstance(model_masks(wide, arange, torch.tensor([10])), torch.Tensor)


def test_a_list_or_another_attention_kind_says_why_not(monkeypatch):
    from nvkit.generate.fast import support
    model = _model("mistral")  # a fused family, windowed

    class Session:  # the fields the support checks read: a model on a GPU, as a user's session has it
        device = torch.device("cuda")
        quantization = None
    s = Session()
    s.model = model
    gen = dict(max_new_tokens=8, do_sample=False)
    assert support.single_why(s, gen) is None
    # a list runs on the rows over the model's own forward (model_rows), not transformers' paged cache
    assert support.rows_why(s, gen) is None and "sliding-window" in support.batch_why(s, gen)
    model.config.layer_types = ["chunked_attention"] * 4
    assert support.single_why(s, gen) == "the model has chunked_attention layers"
    model.config.layer_types = ["full_attention"] * 4
    monkeypatch.setattr(model.config, "use_bidirectional_attention", True, raising=False)
    assert support.single_why(s, gen) == "the model attends in both directions"
