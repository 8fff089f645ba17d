"""What the fast path can honour of a generation request, and how it picks each token on the device.

``resolve`` turns the request's generation arguments and the model's generation config into a
``Sampling`` (or says why the fast path cannot run them); ``unsupported_reason`` adds what the
session itself rules out; ``pick`` is the token choice inside the CUDA graph.

Sampling (temperature, top_k, top_p) uses the Gumbel-max trick on the default CUDA generator, so
``seed=`` makes runs repeatable without a host sync; the random stream differs from transformers'
``generate``, so the sampled text does too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

# Generation options the fast path honours; the first group changes nothing in the logits.
_SUPPORTED = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "pad_token_id", "eos_token_id",
              "use_cache", "return_dict_in_generate"}
# Generation-config fields that would add a logits processor the graph does not implement, with
# the values that mean "off".
_PROCESSORS_OFF = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0), "num_beams": (None, 1),
    "num_return_sequences": (None, 1), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "sequence_bias": (None,),
    "guidance_scale": (None, 1.0), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
    "min_p": (None,), "top_h": (None,), "exponential_decay_length_penalty": (None,), "watermarking_config": (None,),
    "renormalize_logits": (None, False), "stop_strings": (None,), "assistant_model": (None,),
    "prompt_lookup_num_tokens": (None,),
}


@dataclass
class Sampling:
    """How each token is picked, resolved from the request and the model's generation config."""
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos: tuple[int, ...] = ()
    max_new_tokens: int = 50

    @property
    def key(self) -> tuple:
        """What shapes the captured graph: temperature and top_p live in device tensors (no new
        capture), top_k and which filters run do not."""
        return ("greedy",) if not self.do_sample else ("sample", self.top_k, self.top_p < 1.0)


def resolve(model, gen: dict) -> tuple[Sampling | None, str | None]:
    """(Sampling, None) when the fast path can honour ``gen``, else (None, why not)."""
    extra = sorted(k for k in gen if k not in _SUPPORTED)
    if extra:
        return None, f"generation option(s) {', '.join(extra)} are not implemented by the fast path"
    try:
        cfg = copy.deepcopy(model.generation_config)
        cfg.update(**gen)
    except Exception as e:  # noqa: BLE001 - an odd config means: use plain generate
        return None, f"the model's generation config could not be read ({e})"
    for name, off in _PROCESSORS_OFF.items():
        value = getattr(cfg, name, None)
        if value not in off:
            return None, f"{name}={value!r} (from the request or the model's generation_config) is not implemented by the fast path"
    eos = cfg.eos_token_id if "eos_token_id" not in gen else gen["eos_token_id"]
    if eos is None and "eos_token_id" not in gen:
        eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    eos = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    s = Sampling(do_sample=bool(cfg.do_sample), eos=eos, max_new_tokens=int(gen["max_new_tokens"]))
    if s.do_sample:
        s.temperature = float(cfg.temperature if cfg.temperature is not None else 1.0)
        s.top_k = int(cfg.top_k if cfg.top_k is not None else 50)  # transformers' default when unset
        s.top_p = float(cfg.top_p if cfg.top_p is not None else 1.0)
        vocab = int(model.config.get_text_config().vocab_size)
        if s.top_k >= vocab:
            s.top_k = 0
    return s, None


def unsupported_reason(session, texts: list[str], gen: dict) -> str | None:
    """Why this request cannot take the fast path here (None when it can)."""
    model = session.model
    if session.device.type != "cuda":
        return f"the model is on {session.device}, and the fast path replays CUDA graphs"
    if len(texts) != 1:
        return "the fast path decodes one prompt at a time (lists go through continuous batching)"
    dev_map = getattr(model, "hf_device_map", None)
    if dev_map and len({str(v) for v in dev_map.values()}) > 1:
        return "the model is spread over several devices (device_map); the fast path needs it on one GPU"
    if getattr(model, "peft_config", None):
        return "a LoRA adapter is attached; merge it first (s.merge_adapter()) to decode fast"
    if getattr(session, "quantization", None):
        return f"the model is quantized ({session.quantization}); the fast path covers bf16/fp16/fp32 weights"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"{type(model).__name__} does not support a static KV cache"
    text_cfg = model.config.get_text_config()
    layer_types = getattr(text_cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "the model has sliding-window or other non-full attention layers"
    attn = getattr(model.config, "_attn_implementation", None)
    if attn not in ("sdpa", "eager"):
        return f"attention backend {attn!r}: the fast path passes its own mask, which needs 'sdpa' or 'eager'"
    _, why = resolve(model, gen)
    return why


def pick(logits, temperature, top_p, key: tuple):
    """The next token from (1, vocab) float logits, as a (1,) int64 tensor; device ops only
    (``temperature`` and ``top_p`` are 0-dim device tensors, so one graph serves any value)."""
    import torch
    if key[0] == "greedy":
        return logits.argmax(-1)
    _, top_k, use_top_p = key
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if use_top_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly above each token; the top token always stays
        sorted_logits = sorted_logits.masked_fill(before > top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    # Gumbel-max: argmax(p / Exp(1)) is a draw from p, with no host sync (multinomial would need one)
    noise = torch.empty_like(probs).exponential_(1.0)
    return (probs / noise).argmax(-1)
