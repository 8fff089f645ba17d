"""The model the model-choice tests load: nvkit's demo checkpoint once it is built, else a tiny
random Qwen3 with a small BPE tokenizer made in a temporary directory (same architecture)."""

import os
import tempfile


def model_path() -> str:
    import nvkit.demo
    try:
        return nvkit.demo.path()
    except nvkit.NvkitError:
        pass
    d = os.path.join(tempfile.gettempdir(), f"nvkit-tiny-qwen3-{os.getuid()}")
    if os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "tokenizer.json")):
        return d
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["NVIDIA GPUs are fast. Attention kernels and quantization save memory on the GPU."] * 50
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    cfg = Qwen3Config(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, intermediate_size=128, eos_token_id=0)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    t.save_pretrained(d)
    return d
