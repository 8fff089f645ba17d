"""Shared by the fine-tune tests: the model they train on.

The shipped demo model when it is there (nvkit/demo/model); otherwise a tiny random Qwen3 with a
small byte-level BPE tokenizer built once per test session, so the tests don't depend on the
order in which the demo checkpoint lands.
"""

from __future__ import annotations

import os
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def demo_available() -> bool:
    d = Path(__file__).resolve().parents[1] / "nvkit" / "demo" / "model"
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def build_tiny(out: Path) -> str:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    corpus = Path(__file__).resolve().parents[1] / "nvkit" / "demo" / "corpus.txt"
    lines = corpus.read_text(encoding="utf-8").splitlines()[:3000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=special[1:])
    fast.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=True, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                      bos_token_id=fast.eos_token_id)
    model = Qwen3ForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return str(out)


def model_path(tmp_path_factory) -> str:
    if demo_available() and not os.environ.get("NVKIT_TEST_TINY"):
        return "demo"
    return build_tiny(tmp_path_factory.mktemp("tiny-qwen3"))
