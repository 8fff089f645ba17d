"""Random-weight checkpoints with the exact shape of real models, built from their configs alone.

Benchmarks and memory measurements need a model of real size, and the machines here never reach
the Hub. A model's shape is fully given by its config, so we keep the published configs of a few
models here, build each one once with random bf16 weights and cache it on disk. The tokenizer is the
demo one: its ids are all far below the real vocabulary size, which is all a benchmark needs. The
ids past it share one small embedding row (``fill_unspellable``), so greedy text stays readable and
training stays finite whatever ids it is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from .. import cache
from ..errors import NvkitError

_QWEN3_COMMON = dict(
    model_type="qwen3",
    architectures=["Qwen3ForCausalLM"],
    vocab_size=151936,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=40960,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    rms_norm_eps=1e-6,
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    sliding_window=None,
    initializer_range=0.02,
    bos_token_id=151643,
    eos_token_id=151645,
    dtype="bfloat16",
)

_LLAMA32_COMMON = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    vocab_size=128256,
    hidden_act="silu",
    max_position_embeddings=131072,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    rms_norm_eps=1e-5,
    attention_bias=False,
    attention_dropout=0.0,
    mlp_bias=False,
    initializer_range=0.02,
    tie_word_embeddings=True,
    bos_token_id=128000,
    eos_token_id=128001,
    dtype="bfloat16",
)

# Gemma 3's text model (the 1B is text only; the 4B's text half): five sliding-window layers to
# one global, GeGLU, 256-wide heads
_GEMMA3_COMMON = dict(
    model_type="gemma3_text",
    architectures=["Gemma3ForCausalLM"],
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=256,
    rms_norm_eps=1e-6,
    sliding_window_pattern=6,
    attention_bias=False,
    attention_dropout=0.0,
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    initializer_range=0.02,
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=[1, 106],
    pad_token_id=0,
    dtype="bfloat16",
)

# name -> config fields, as published in each model's config.json on the Hub.
SHAPES: dict[str, dict] = {
    "qwen3-0.6b": {**_QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "max_window_layers": 28,
                   "tie_word_embeddings": True},
    "qwen3-1.7b": {**_QWEN3_COMMON, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "max_window_layers": 28,
                   "tie_word_embeddings": True},
    "qwen3-4b": {**_QWEN3_COMMON, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "max_window_layers": 36,
                 "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "max_window_layers": 36,
                 "tie_word_embeddings": False},
    "llama-3.2-1b": {**_LLAMA32_COMMON, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "llama-3.2-3b": {**_LLAMA32_COMMON, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
    # Other families (issue 37). Phi-4-mini's longrope factor lists are left out: they change the
    # rotary angles past 4 k positions, not the shape or the work per token.
    "gemma-3-1b": {**_GEMMA3_COMMON, "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
                   "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "max_position_embeddings": 32768, "sliding_window": 512,
                   "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "gemma-3-4b": {**_GEMMA3_COMMON, "vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
                   "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                   "max_position_embeddings": 131072, "sliding_window": 1024,
                   "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "phi-4-mini": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=200064, hidden_size=3072,
                       intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24, num_key_value_heads=8,
                       max_position_embeddings=131072, original_max_position_embeddings=4096,
                       partial_rotary_factor=0.75,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
                       rms_norm_eps=1e-5, hidden_act="silu", attention_bias=False, resid_pdrop=0.0, embd_pdrop=0.0,
                       attention_dropout=0.0, sliding_window=262144, tie_word_embeddings=True,
                       bos_token_id=199999, eos_token_id=199999, pad_token_id=199999, initializer_range=0.02,
                       dtype="bfloat16"),
    "smollm3-3b": dict(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], vocab_size=128256, hidden_size=2048,
                       intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4,
                       max_position_embeddings=65536, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
                       no_rope_layer_interval=4, use_sliding_window=False, rms_norm_eps=1e-6, hidden_act="silu",
                       attention_bias=False, mlp_bias=False, tie_word_embeddings=True, bos_token_id=128000,
                       eos_token_id=128012, pad_token_id=128004, initializer_range=0.02, dtype="bfloat16"),
    "olmo-2-1b": dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], vocab_size=100352, hidden_size=2048,
                      intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                      max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                      rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=100257, pad_token_id=100277, initializer_range=0.02,
                      dtype="bfloat16"),
    # mixture of experts: 64 experts of which 8 run per token (1.3 B active of 6.9 B)
    "olmoe-1b-7b": dict(model_type="olmoe", architectures=["OlmoeForCausalLM"], vocab_size=50304, hidden_size=2048,
                        intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                        num_experts=64, num_experts_per_tok=8, max_position_embeddings=4096,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-5,
                        hidden_act="silu", clip_qkv=None, norm_topk_prob=False, tie_word_embeddings=False,
                        bos_token_id=None, eos_token_id=50279, pad_token_id=1, initializer_range=0.02,
                        dtype="bfloat16"),
    # Not a real model: the Qwen3-0.6B layout and vocabulary with tiny layers, so the whole
    # build-and-load path can be tested on a CPU in seconds (about 10 M parameters, mostly embedding).
    "qwen3-tiny": {**_QWEN3_COMMON, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_window_layers": 2,
                   "tie_word_embeddings": True},
}

_MARKER = "nvkit_shaped.json"
_WHAT = "shaped models"
_BUILD = 4  # bumped whenever _build makes different weights (see _fingerprint)


def _spec(name: str) -> dict:
    key = name.lower()
    if key not in SHAPES:
        raise NvkitError(f"Unknown model shape {name!r}. Known shapes: {', '.join(sorted(SHAPES))}. "
                         "Add its config fields to nvkit.demo.shaped.SHAPES to use another one.")
    return SHAPES[key]


def shaped_config(name: str):
    """The transformers config of a known shape (no weights are built or read)."""
    from transformers import AutoConfig

    fields = dict(_spec(name))
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return cache.root() / "shaped"


def _fingerprint(name: str) -> str:
    # "build" changes when _build makes different weights, so older caches are rebuilt
    blob = json.dumps({"name": name, "spec": _spec(name), "build": _BUILD}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _is_built(target: Path, fingerprint: str) -> bool:
    # ownership before the fingerprint: a folder another user made (or can write to) holds weights
    # and a tokenizer of their choosing however right its marker looks (the rule: nvkit.cache)
    if cache.trusted_folder(target, _WHAT) is None:
        return False
    raw = cache.read_trusted_bytes(target / _MARKER, _WHAT, limit=64 * 1024)
    if raw is None:
        return False
    try:
        marker = json.loads(raw.decode("utf-8"))
    except ValueError:
        return False
    # a marker that is not nvkit's object (edited, truncated to a list or a number) means stale
    return (isinstance(marker, dict) and marker.get("fingerprint") == fingerprint
            and cache.trusted_file(target / "config.json", _WHAT) is not None)


def shaped(name: str, cache_dir: str | os.PathLike | None = None, *, device: str = "cpu") -> str:
    """Directory of a random-weight model with the exact shape of ``name``; built on first use.

    ``device`` is where a build initialises the weights: ``"cuda"`` takes seconds where the CPU
    takes minutes for a 4B shape (torch draws bf16 normals on one CPU core), for a process that runs
    on the GPU anyway (the benchmarks). The two draw different random weights; a built folder is
    reused whichever drew it. A GPU without room for the model builds on the CPU.

    The cache lives in ``cache_dir/<name>``; by default ``$NVKIT_CACHE/shaped/<name>``, and without
    ``NVKIT_CACHE`` ``~/.cache/nvkit/shaped/<name>``. A build goes to a temporary directory that is
    renamed into place when complete, so an interrupted build never leaves a half checkpoint and
    concurrent builders end with one copy. A built folder is reused only when it and its marker are
    this user's and no one else can write them (:mod:`nvkit.cache`); otherwise it is built afresh.
    """
    key = name.lower()
    _spec(key)
    if device not in ("cpu", "cuda"):
        raise NvkitError(f"shaped(device={device!r}): give 'cpu' or 'cuda'.")
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise NvkitError("shaped(device='cuda'): no CUDA device here; build with device='cpu'.")
    root = _cache_root(cache_dir)
    target = root / key
    fingerprint = _fingerprint(key)
    if _is_built(target, fingerprint):
        return str(target)

    try:
        if cache_dir is None:
            cache.own_dir("shaped")  # nvkit's own folder: private (see nvkit.cache)
        else:
            root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError as e:
        raise NvkitError(f"Cannot create the shaped-model cache in {root}: {e}. "
                         "Set NVKIT_CACHE to a writable directory.") from e
    try:
        _build(key, tmp, fingerprint, device)
        if target.exists():  # stale (older spec) or built meanwhile by another process
            if _is_built(target, fingerprint):
                return str(target)
            old = Path(tempfile.mkdtemp(prefix=f".{key}-old-", dir=root))
            # onto that empty folder, in the same parent: a folder another user planted can be moved
            # aside too (moving it into another folder would need write access to it)
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if _is_built(target, fingerprint):  # lost a race to another builder: theirs is as good
                return str(target)
            raise
    except NvkitError:
        raise
    except Exception as e:
        raise NvkitError(f"Building the random-weight {key!r} model in {root} failed: {e}. It needs about "
                         "two bytes per parameter of free RAM and disk.") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def fill_unspellable(model, n_tok: int, seed: int = 1) -> None:
    """Make the LM-head rows of the ids ``n_tok`` and up (ids the demo tokenizer cannot spell) one
    shared random row at half the init scale, in place.

    Why: with random rows everywhere, greedy decoding nearly always picks an id the tokenizer cannot
    spell (about 150 k of them against 2 k it can) and the text comes out empty. A single shared row
    gives all of them one logit, h·row, with half the spread of any one real id's logit, so the best
    of the 2 k real ids beats it and the noise is readable text. Why not zero rows: Qwen3 and Llama tie
    the head to the input embedding, so a zero row is also a zero input. A sequence that starts with
    such ids keeps an exactly zero hidden state through every layer (attention over zero values
    gives zero), where RMSNorm's gradient is 1/sqrt(eps) instead of about 1/rms; the backward
    multiplies by that at every layer and overflows to inf, then NaN (inf × the zero input) in
    every LoRA gradient below, through 28 layers. The head is read in full on every step either
    way, so speed and memory are unchanged."""
    import torch
    head = model.get_output_embeddings().weight
    if n_tok >= head.shape[0]:
        return
    std = float(getattr(model.config.get_text_config(), "initializer_range", 0.02) or 0.02)
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(head.shape[1], generator=g) * (std / 2)
    with torch.no_grad():
        head[n_tok:] = row.to(head.device, head.dtype)


def _pad(config):
    """The model's own pad id where it has one, else its BOS (Qwen3 and Llama publish none)."""
    pad = getattr(config, "pad_token_id", None)
    return pad if pad is not None else config.bos_token_id


def random_model(config, device: str = "cpu"):
    """A bf16 causal LM of ``config`` with the model's own random init, its weights on ``device``.

    Built on the meta device and then initialised once: ``from_config`` on the CPU runs torch's
    default init in every layer's constructor and then transformers' init over all of it again, and
    at 4B parameters those two passes over bf16 take minutes even on 16 cores. Seeded, so every
    CPU that builds a shape gets the same weights (a GPU draws others, the same on GPUs of a kind)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to_empty(device=device)
    torch.manual_seed(0)
    # transformers' init also fills the buffers the meta device left empty (rotary tables,
    # embedding scales), as it does for a checkpoint loaded onto the meta device
    model.initialize_weights()
    model.tie_weights()
    return model


def _build(name: str, out: Path, fingerprint: str, device: str = "cpu") -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from .checkpoint import path as demo_path

    config = shaped_config(name)
    try:
        model = random_model(config, device)
    except torch.OutOfMemoryError:  # the GPU is busy with other work: the CPU is slower, not wrong
        torch.cuda.empty_cache()
        model = random_model(config, "cpu")
    fill_unspellable(model, len(AutoTokenizer.from_pretrained(demo_path())))
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=_pad(config), do_sample=False)
    model.to("cpu")  # written from host memory; the GPU's copy is freed before the caller loads
    model.save_pretrained(out, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    AutoTokenizer.from_pretrained(demo_path()).save_pretrained(out)
    # with a umask such as 002 the files come out group-writable, which nvkit.cache's rule refuses to
    # read back; the folder is this user's alone anyway
    for f in out.iterdir():
        f.chmod(stat.S_IMODE(f.lstat().st_mode) & ~0o022)
    cache.write_atomic(out / _MARKER, json.dumps({
        "name": name, "fingerprint": fingerprint, "parameters": n_params,
        "what": "random bf16 weights with the exact shape of the real model; for memory and speed "
                "measurements only (the text it writes is noise). Tokenizer: the nvkit demo tokenizer; "
                "the LM-head rows past its ids are one shared small row, so greedy decoding picks ids it "
                "can spell.",
    }, indent=2) + "\n")
