"""What the fast path can honour of a generation request, and how it picks each token on the device.

``resolve`` turns the request's generation arguments and the model's generation config into a
``Sampling`` (or says why the fast path cannot run them; ``support`` adds what the session itself
rules out); ``choose`` is the token choice inside the CUDA graph.

Inside the graph: the repetition penalty (over a device mask of the ids seen so far),
``min_new_tokens``/``min_length`` (EOS ids masked until a position held on the device), then
greedy, or sampling with temperature, top-k and top-p by the Gumbel-max trick on the default CUDA
generator, so ``seed=`` makes runs repeatable without a host sync; the random stream differs from
transformers' ``generate``, so the sampled text does too. On the host: several EOS ids, and stop
strings (``StopStrings``), checked on each chunk of ids a replay hands back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

# Generation options the fast path honours; the first group changes nothing in the logits.
_SUPPORTED = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "pad_token_id", "eos_token_id",
              "use_cache", "return_dict_in_generate", "repetition_penalty", "min_new_tokens", "min_length",
              "stop_strings"}
# Generation-config fields that would add a logits processor the graph does not implement, with
# the values that mean "off".
_PROCESSORS_OFF = {
    "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,), "num_beams": (None, 1),
    "num_return_sequences": (None, 1), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "sequence_bias": (None,),
    "guidance_scale": (None, 1.0), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
    "min_p": (None,), "top_h": (None,), "exponential_decay_length_penalty": (None,), "watermarking_config": (None,),
    "renormalize_logits": (None, False), "assistant_model": (None,), "prompt_lookup_num_tokens": (None,),
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
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    min_length: int = 0          # prompt + new tokens, as transformers counts it
    stop_strings: tuple[str, ...] = ()

    @property
    def processors(self) -> bool:
        """True when logits processors run in the graph (repetition penalty, a minimum length)."""
        return self.repetition_penalty != 1.0 or ((self.min_new_tokens > 0 or self.min_length > 0) and bool(self.eos))

    @property
    def key(self) -> tuple:
        """What shapes the captured graph: (mode, top-k, top-p filter on, processors on).
        temperature, top_p, the penalty and the minimum length live in device tensors (no new
        capture); top-k's k and which filters run do not."""
        if not self.do_sample:
            return ("greedy", 0, False, self.processors)
        return ("sample", self.top_k, self.top_p < 1.0, self.processors)

    def eos_allowed_from(self, prompt_len: int) -> int:
        """The first position (0-based, prompt included) whose token may be an EOS."""
        return max(prompt_len + self.min_new_tokens, self.min_length)


def resolve(model, gen: dict) -> tuple[Sampling | None, str | None]:
    """(Sampling, None) when the fast path can honour ``gen``, else (None, why not)."""
    extra = sorted(k for k in gen if k not in _SUPPORTED)
    if extra:
        asked = ", ".join(f"{k}={gen[k]!r}" for k in extra)
        return None, f"{asked} {'is' if len(extra) == 1 else 'are'} not implemented by the fast path"
    try:
        cfg = copy.deepcopy(model.generation_config)
        cfg.update(**gen)
    except Exception as e:  # noqa: BLE001 - an odd config means: use plain generate
        return None, f"the model's generation config could not be read ({e})"
    for name, off in _PROCESSORS_OFF.items():
        value = getattr(cfg, name, None)
        if value not in off:
            return None, f"{name}={value!r} is not implemented by the fast path"
    eos = cfg.eos_token_id if "eos_token_id" not in gen else gen["eos_token_id"]
    if eos is None and "eos_token_id" not in gen:
        eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    eos = () if eos is None else tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    stops = cfg.stop_strings
    stops = () if not stops else ((stops,) if isinstance(stops, str) else tuple(stops))
    s = Sampling(do_sample=bool(cfg.do_sample), eos=eos, max_new_tokens=int(gen["max_new_tokens"]),
                 repetition_penalty=float(cfg.repetition_penalty if cfg.repetition_penalty is not None else 1.0),
                 min_new_tokens=int(cfg.min_new_tokens or 0), min_length=int(cfg.min_length or 0),
                 stop_strings=stops)
    if s.do_sample:
        s.temperature = float(cfg.temperature if cfg.temperature is not None else 1.0)
        s.top_k = int(cfg.top_k if cfg.top_k is not None else 50)  # transformers' default when unset
        s.top_p = float(cfg.top_p if cfg.top_p is not None else 1.0)
        vocab = int(model.config.get_text_config().vocab_size)
        if s.top_k >= vocab:
            s.top_k = 0
    return s, None


def choose(logits, buffers, key: tuple):
    """The next token from (1, vocab) float logits, as a (1,) int64 tensor; device ops only.

    ``buffers`` holds the request's device tensors (``temperature``, ``top_p``, ``penalty``,
    ``seen``, ``eos_mask``, ``pos``, ``min_pos``), so one graph serves any of their values."""
    import torch
    mode, top_k, use_top_p, processors = key
    b = buffers
    if processors:
        # transformers' RepetitionPenaltyLogitsProcessor on every id seen so far, prompt included
        penalized = torch.where(logits < 0, logits * b.penalty, logits / b.penalty)
        logits = torch.where(b.seen, penalized, logits)
        # MinNewTokens/MinLength: no EOS before its position (b.pos: the position this token takes)
        logits = logits.masked_fill(b.eos_mask & (b.pos < b.min_pos), float("-inf"))
    if mode == "greedy":
        tok = logits.argmax(-1)
    else:
        logits = logits / b.temperature
        if top_k:
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if use_top_p:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            before = probs.cumsum(-1) - probs  # mass strictly above each token; the top token always stays
            sorted_logits = sorted_logits.masked_fill(before > b.top_p, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        probs = logits.softmax(-1)
        # Gumbel-max: argmax(p / Exp(1)) is a draw from p, with no host sync (multinomial would need one)
        noise = torch.empty_like(probs).exponential_(1.0)
        tok = (probs / noise).argmax(-1)
    if processors:
        b.seen.index_fill_(1, tok, True)
    return tok


class StopStrings:
    """transformers' ``stop_strings`` on the host: generation ends at the first token that
    completes one of the strings (the text of that token may run past it), and that token is kept.
    A string wholly inside the prompt does not count; one that starts in the prompt does."""

    def __init__(self, tokenizer, strings: tuple[str, ...], prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.strings = strings
        self.prompt = list(prompt_ids)
        self.longest = max(len(s) for s in strings)

    def cut(self, tokens: list[int], checked: int) -> int | None:
        """With ``tokens`` generated so far, of which the first ``checked`` were looked at already:
        how many to keep when one of them completes a stop string (None: none does)."""
        ids = self.prompt + tokens
        for i in range(len(self.prompt) + checked, len(ids)):
            # enough tokens back that their text holds any stop string ending in token i
            start = max(0, i - self.longest - 1)
            prev = self.tokenizer.decode(ids[start:i], skip_special_tokens=False)
            cur = self.tokenizer.decode(ids[start:i + 1], skip_special_tokens=False)
            for s in self.strings:
                if cur.find(s, max(0, len(prev) - len(s) + 1)) != -1:
                    return i - len(self.prompt) + 1
        return None


# --- many rows at once (the batched fast path) ---------------------------------------------------

_M32 = 0xFFFFFFFF


def _mix32(x):
    """A 32-bit integer hash (xor-shift-multiply rounds) on int64 tensors holding values below
    2**32: the multiplier is below 2**27, so no product overflows."""
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seed, counter):
    """One uniform number in (0, 1) per row (float32) from the row's ``seed`` and ``counter``
    (int64 tensors of whole numbers ≥ 0). A hash, not a generator stream: a row's draw depends on
    its seed and counter only — not on the rows beside it, the batch size, or what ran before —
    and it is the same on every device (integer arithmetic)."""
    a = _mix32(seed & _M32)
    b = _mix32(((seed >> 32) & _M32) ^ a)
    c = _mix32((counter & _M32) ^ b)
    c = _mix32(((counter >> 32) & _M32) ^ c ^ 0x2545F491)
    return ((c >> 9).float() + 0.5) * (1.0 / (1 << 23))  # 23 bits: exact in float32, never 0 or 1


def request_seeds(base: int, n: int) -> list[int]:
    """Seeds for prompts 0..n-1 of a batched request from one ``base`` seed: prompt i's seed
    depends on ``base`` and i only."""
    import hashlib
    return [int.from_bytes(hashlib.blake2b(f"{base}:{i}".encode(), digest_size=8).digest(), "little") >> 1
            for i in range(n)]


@dataclass
class RowParams:
    """The per-row tensors ``choose_rows`` reads ((rows,) unless said otherwise)."""
    temperature: object
    top_p: object
    penalty: object
    seed: object       # int64
    counter: object    # int64: the position the picked token takes (the noise's counter)
    min_pos: object    # int64: the first position an EOS may take
    eos_mask: object   # (1, vocab) bool
    seen: object = None  # (rows, vocab) bool when the repetition penalty runs: ids in the prompt and text so far


def choose_rows(logits, key: tuple, p: RowParams):
    """The next token of each row from (rows, vocab) float logits, as (rows,) int64; device ops
    only, no host sync. The same choices as ``choose`` (repetition penalty, minimum length,
    greedy, temperature, top-k, top-p), except the draw: sampling inverts each row's cumulative
    distribution at ``counter_uniform(seed, counter)``, so a request's text depends on its seed,
    never on which prompts share its batch."""
    import torch
    mode, top_k, use_top_p, processors = key
    if processors:
        if p.seen is not None:  # the repetition penalty (only the minimum length runs without it)
            pen = p.penalty.unsqueeze(1)
            penalized = torch.where(logits < 0, logits * pen, logits / pen)
            logits = torch.where(p.seen, penalized, logits)
        logits = logits.masked_fill(p.eos_mask & (p.counter < p.min_pos).unsqueeze(1), float("-inf"))
    if mode == "greedy":
        tok = logits.argmax(-1)
    else:
        logits = logits / p.temperature.unsqueeze(1)
        if top_k:
            vals, idx = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)  # sorted, largest first
        elif use_top_p:
            vals, idx = torch.sort(logits, dim=-1, descending=True)
        else:
            vals, idx = logits, None
        probs = vals.softmax(-1)
        if use_top_p:
            before = probs.cumsum(-1) - probs  # mass strictly above each token; the top token always stays
            probs = probs.masked_fill(before > p.top_p.unsqueeze(1), 0.0)
        cdf = probs.cumsum(-1)
        target = counter_uniform(p.seed, p.counter) * cdf[:, -1]
        j = torch.searchsorted(cdf, target.unsqueeze(1)).clamp_(max=cdf.shape[-1] - 1)
        tok = (idx.gather(1, j) if idx is not None else j).squeeze(1)
    if processors and p.seen is not None:
        p.seen.scatter_(1, tok.unsqueeze(1), True)
    return tok
