"""Random-weight shapes train with finite gradients whatever ids they are given.

The shaped builder once zeroed the rows of every id the demo tokenizer cannot spell. The head is
tied to the input embedding, so a sequence starting with such ids kept a zero hidden state through
every layer; RMSNorm's gradient at zero input is 1/sqrt(eps) (it computes in float32), and the
backward overflowed through the depth of Qwen3-0.6B (28 layers), then inf × the zero input gave NaN
in every weight gradient below: grad_norm NaN from the first step. A narrow model of the same depth
shows it in seconds on a CPU (the gradient grows by decades per layer: no CPU's rounding decides it)."""

import math

import pytest
import torch

from nvkit.demo.shaped import fill_unspellable

SPELLABLE = 100  # ids a pretend tokenizer knows; the rest of the vocabulary is "unspellable"


def _deep_narrow():
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen3", hidden_size=128, intermediate_size=256, num_hidden_layers=28,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1024,
                               tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()


def _grad_norm(model, ids) -> float:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    assert math.isfinite(loss.item())  # the forward is fine either way: the backward is what breaks
    loss.backward()
    return math.sqrt(sum(float(p.grad.float().pow(2).sum()) for p in model.parameters() if p.grad is not None))


@pytest.mark.parametrize("start", ["unspellable", "spellable"])
def test_rows_past_the_tokenizer_keep_the_backward_finite(start):
    model = _deep_narrow()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(SPELLABLE, 1024, (2, 32), generator=g)
    if start == "spellable":
        ids[:, 0] = 5
    with torch.no_grad():
        model.get_output_embeddings().weight[SPELLABLE:] = 0  # what the builder did before
    zeroed = _grad_norm(model, ids)
    if start == "unspellable":
        assert not math.isfinite(zeroed)  # the failure this guards against, reproduced
    else:
        assert math.isfinite(zeroed)  # one real id first: attention lifts every later position off zero
    fill_unspellable(model, SPELLABLE)
    head = model.get_output_embeddings().weight.detach()
    assert model.get_input_embeddings().weight.data_ptr() == head.data_ptr()  # tied: the input rows changed too
    assert torch.equal(head[SPELLABLE], head[-1]) and float(head[SPELLABLE].abs().min()) > 0
    assert not torch.equal(head[SPELLABLE - 1], head[SPELLABLE])  # the spellable rows are untouched
    assert math.isfinite(_grad_norm(model, ids))
