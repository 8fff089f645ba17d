"""Rebuild the demo model: ``python -m nvkit.demo.build [--out DIR] [--steps N] [--seed S]``.

The shipped checkpoint in ``nvkit/demo/model/`` is exactly what this script produced from the
shipped ``corpus.txt`` with the defaults below (seeded, 2 CPU threads, deterministic on one
machine). It trains a byte-level BPE tokenizer on the corpus, then a tiny Qwen3 model on the same
text for a few minutes of CPU time, so that ``nvkit.load("demo")`` has something that answers in
real words without ever touching the Hub.

``--write-corpus`` regenerates ``corpus.txt`` itself from the templates in ``corpus.py`` (hand-written
sentences combined with vocabulary lists); the build normally reads the shipped file as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

from ..errors import NvkitError
from .corpus import EOS, IM_END, IM_START, SPECIAL_TOKENS, make_corpus

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"
MODEL_DIR = HERE / "model"


# Qwen-style ChatML. A system message is optional; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The demo architecture: the real Qwen3 layout (GQA, q/k norms, SwiGLU, tied embeddings), shrunk.
MODEL_SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)

DEFAULTS = dict(vocab_size=4096, steps=400, seed=0, batch_size=16, seq_len=128, lr=2e-3)


def read_documents(corpus_path: Path = CORPUS) -> list[str]:
    """Paragraphs of the corpus (blank-line separated); each is one training document."""
    text = corpus_path.read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


# --------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------

def train_tokenizer(documents: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # The special tokens are markup, not text to learn merges from.
    plain = [d.replace(IM_START, " ").replace(IM_END, " ") for d in documents]
    tok.train_from_iterator(plain, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------

def train_model(tokenizer, documents: list[str], *, steps: int, seed: int, batch_size: int, seq_len: int,
                lr: float, log=print):
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)

    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer(doc, add_special_tokens=False)["input_ids"])
        ids.append(eos_id)
    data = torch.tensor(ids, dtype=torch.long)
    log(f"corpus: {len(documents)} documents, {len(data)} tokens")

    config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=eos_id, eos_token_id=eos_id,
                         pad_token_id=eos_id, dtype="bfloat16", **MODEL_SHAPE)
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM(config).float()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters")

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(seed)
    start = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        starts = torch.randint(0, len(data) - seq_len, (batch_size,), generator=gen)
        batch = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
        out = model(input_ids=batch, labels=batch)  # the model shifts labels itself
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            log(f"step {step:5d}  loss {out.loss.item():.3f}  lr {lr_at(step):.2e}  {time.time() - start:6.1f}s")

    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id,
        do_sample=False, max_new_tokens=64,
    )
    return model, time.time() - start


def sample(model, tokenizer, prompt: str = "NVIDIA GPUs are", max_new_tokens: int = 24) -> str:
    import torch

    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=False)


_OUTPUT_FILES = ["config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                 "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "nvkit_demo.json"]


def _check_out(out: Path) -> None:
    """A build replaces its own files in ``out``: a folder holding files of those names that no
    build wrote (no nvkit_demo.json) is another model, which it must not delete."""
    info = out / "nvkit_demo.json"
    if info.is_file() and not info.is_symlink():
        return
    theirs = [name for name in _OUTPUT_FILES if os.path.lexists(out / name)]
    if theirs:
        raise NvkitError(f"{out} holds {', '.join(theirs)} and no nvkit_demo.json: it is not a demo model a build "
                         "wrote, and a build would replace those files. Give --out a new or empty folder.")


def build(out: Path, *, steps: int, seed: int, vocab_size: int, batch_size: int, seq_len: int, lr: float,
          corpus_path: Path = CORPUS, log=print) -> dict:
    import torch

    _check_out(out)
    documents = read_documents(corpus_path)
    tokenizer = train_tokenizer(documents, vocab_size)
    model, seconds = train_model(tokenizer, documents, steps=steps, seed=seed, batch_size=batch_size,
                                 seq_len=seq_len, lr=lr, log=log)
    # bf16 halves the file (about 8 MB) and greedy output on the prompts we check is unchanged.
    model = model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    for stale in _OUTPUT_FILES:  # only what a build writes: --out may point at a directory with other files
        (out / stale).unlink(missing_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for name in _OUTPUT_FILES:  # safetensors writes 0600; the shipped files are world-readable like the rest
        if (out / name).is_file() and not (out / name).is_symlink():
            (out / name).chmod(0o644)
    info = {
        "what": "nvkit demo model: tiny Qwen3 trained on nvkit/demo/corpus.txt; rebuild with python -m nvkit.demo.build",
        "steps": steps, "seed": seed, "vocab_size": len(tokenizer), "batch_size": batch_size, "seq_len": seq_len,
        "lr": lr, "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(seconds, 1), "torch_threads": 2,
        "sample": {"prompt": "NVIDIA GPUs are", "greedy": sample(model, tokenizer)},
    }
    (out / "nvkit_demo.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    log(f"greedy from 'NVIDIA GPUs are': {info['sample']['greedy']!r}")
    return info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m nvkit.demo.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=MODEL_DIR, help="checkpoint directory (default: the shipped one)")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--vocab-size", type=int, default=DEFAULTS["vocab_size"])
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    p.add_argument("--seq-len", type=int, default=DEFAULTS["seq_len"])
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    p.add_argument("--corpus", type=Path, default=CORPUS, help="training text (blank-line separated documents)")
    p.add_argument("--write-corpus", action="store_true",
                   help="regenerate the corpus file from the templates in this script, then stop")
    args = p.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.write_corpus:
        text = make_corpus(args.seed)
        args.corpus.write_text(text, encoding="utf-8")
        print(f"wrote {args.corpus} ({len(text.encode()) / 1024:.0f} KiB)")
        return
    build(args.out, steps=args.steps, seed=args.seed, vocab_size=args.vocab_size, batch_size=args.batch_size,
          seq_len=args.seq_len, lr=args.lr, corpus_path=args.corpus)


if __name__ == "__main__":
    main()
