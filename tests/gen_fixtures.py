"""A model directory for the generation tests: nvkit's demo checkpoint when it is built, else a tiny
random Qwen3 with a small byte-level BPE tokenizer and a ChatML template (built once per process)."""

from __future__ import annotations

import functools
import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def demo_ready() -> bool:
    try:
        import nvkit.demo as demo
        demo.path()
        return True
    except Exception:  # noqa: BLE001 - not built yet
        return False


@functools.lru_cache(maxsize=1)
def tiny_model_dir() -> str:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    out = tempfile.mkdtemp(prefix="nvkit-tiny-qwen3-")
    text = ["NVIDIA GPUs are fast at matrix work.", "Hello there, how are you today?",
            "The quick brown fox jumps over the lazy dog.", "Transformers generate text one token at a time."] * 20
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, intermediate_size=128, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    # Random weights give near-uniform logits; a larger output layer keeps greedy choices clear of near-ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    return out


def model_dir() -> str:
    """The demo checkpoint if present (what users get), else the tiny stand-in."""
    if demo_ready():
        import nvkit.demo as demo
        return demo.path()
    return tiny_model_dir()


def shaped_dir(name: str) -> str:
    """``nvkit.demo.shaped(name)`` when the demo tokenizer exists, else the same random-weight shape
    with the tiny tokenizer (the shape, not the tokenizer, is what speed and logits checks need)."""
    import nvkit.demo as demo
    if demo_ready():
        return demo.shaped(name)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    out = os.path.join(tempfile.gettempdir(), f"nvkit-shaped-{name}-tinytok")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    cfg = demo.shaped_config(name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                                               pad_token_id=cfg.bos_token_id, do_sample=False)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir()).save_pretrained(out)
    return out
