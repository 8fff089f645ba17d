"""The shapes' random weights: built on the meta device and initialised once (``random_model``),
they must be the model transformers' ``from_config`` builds — the same tensors, the same buffers, the
same init's spread — only faster."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from nvkit.demo.shaped import SHAPES, random_model, shaped_config


def cut(name: str):
    """The shape's config with 2 layers, a 512-token vocabulary and narrow MLPs (every module kind kept)."""
    cfg = shaped_config(name)
    cfg.num_hidden_layers = 2
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:2]
    cfg.vocab_size = 512
    for key, width in (("intermediate_size", 256), ("moe_intermediate_size", 128)):
        if getattr(cfg, key, None):
            setattr(cfg, key, width)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key) >= 512:
            setattr(cfg, key, 0)
    return cfg


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_random_model_is_from_configs_model(name):
    cfg = cut(name)
    torch.manual_seed(0)
    usual = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    built = random_model(cfg)
    assert type(built) is type(usual)
    ours, theirs = built.state_dict(), usual.state_dict()
    assert ours.keys() == theirs.keys()
    for key, want in theirs.items():
        got = ours[key]
        assert (got.shape, got.dtype) == (want.shape, want.dtype), key
        assert torch.isfinite(got.float()).all(), key
        if want.numel() < 1000 or want.float().std() == 0:
            assert torch.equal(got, want), key  # norms, biases, constants: the init's exact values
        else:
            g, w = got.float(), want.float()
            assert abs(g.std() - w.std()) < 0.1 * w.std(), key
            assert abs(g.mean() - w.mean()) < 0.1 * w.std(), key
    theirs_buffers = dict(usual.named_buffers())
    for key, got in built.named_buffers():  # rotary tables, embedding scales: filled, not left empty
        assert torch.equal(got, theirs_buffers[key]), key
    if cfg.tie_word_embeddings:
        assert built.get_output_embeddings().weight.data_ptr() == built.get_input_embeddings().weight.data_ptr()


def test_random_model_is_the_same_every_time():
    cfg = cut("qwen3-tiny")
    a, b = random_model(cfg), random_model(cfg)
    for (key, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), key


@pytest.mark.parametrize("device, match", [("gpu", "give 'cpu' or 'cuda'"), ("cuda:0", "give 'cpu' or 'cuda'")]
                         + ([] if torch.cuda.is_available() else [("cuda", "no CUDA device here")]))
def test_a_build_device_that_cannot_be_used_is_refused_before_anything_is_written(tmp_path, device, match):
    from nvkit.demo import shaped
    from nvkit.errors import NvkitError
    with pytest.raises(NvkitError, match=match):
        shaped("qwen3-tiny", cache_dir=tmp_path, device=device)
    assert not list(tmp_path.iterdir())
    assert shaped("qwen3-tiny", cache_dir=tmp_path)  # the next call builds as usual
