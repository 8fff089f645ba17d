"""Fast single-stream decoding on CUDA: a static KV cache and K decode steps per CUDA-graph replay.

Why not just ``generate(cache_implementation="static")``: its compiled decode step is fast on the
GPU, but every token still pays the host work of the generate loop and of the graph-tree checks
(measured ≈ 290 tok/s on an H200 for the Qwen3-0.6B shape, ≈ 430 with a bare Python loop around a
``reduce-overhead`` step). The GPU is then idle most of the time. Here one CUDA graph holds K
consecutive decode steps: each step's picked token is written into the next step's input buffer on
the device, so the host wakes once per K tokens, reads K ids with one copy, checks EOS and the stop
event, and streams the K tokens at once (up to K-1 extra steps are computed past an EOS and
dropped).

For the Llama family (Llama, Mistral, Qwen2, Qwen3: ``_FUSABLE``) the decode step is nvkit's own
(``_fused_step``): the q/k/v and gate/up projections become one matrix-vector product each (the
modules' weights are re-pointed at slices of one fused tensor, so no memory is added and the model
computes exactly as before), and attention over the cache is a grouped-query product with no
``repeat_kv`` copy. At batch 1 every kernel is tiny, so the number of kernels per token is what
costs. Measured on the H200 (Qwen3-0.6B shape, bf16, K=8, same process): the model's own forward
594 tok/s, the fused step 725 (339 kernels and 1.06 ms of kernel time per token, against 379 and
1.34 ms). With Programmatic Dependent Launch between the kernels (``pdl``, on by default) later
runs measured 820–1011 tok/s. nvkit's own attention (``nvkit.decode_attention``: norms, RoPE, cache
writes and attention in two kernels per layer; ``DEFAULT_ATTENTION``) and the pipelined host loop
(``generate``: the next replay is queued before the host reads the last one's ids) brought it to
1084.6 tok/s, against 853.4 for the matmul attention, in one ``nvkit bench --decode`` process.
Other architectures use the model's own forward over a ``StaticCache``.

The decode step is compiled with inductor
(``torch.compile(fullgraph=True)``, no cudagraphs of its own) so the many small elementwise kernels
are fused, and then captured K times into our graph. If compiling fails, the eager forward is
captured instead (more kernels per token, still no host work between them).

Shapes: the cache length is rounded up to a bucket (powers of two from 256), so the capture is paid
once per session and bucket, shown as a ``compile`` event (``nvkit.events``). The prompt's prefill
runs eagerly (any length) into the same cache.

Sampling (temperature, top_k, top_p) runs on the device inside the graph with the Gumbel-max trick
on the default CUDA generator, so ``seed=`` makes runs repeatable; the random stream differs from
transformers' ``generate``, so the sampled text does too. Anything else that changes the logits
(repetition penalty, bad words, min length, beams, ...) is not supported: ``unsupported_reason``
says so and ``nvkit.generation.run`` falls back to plain ``generate``.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ... import events
from ...checks import env_choice, env_flag, env_int
from ...errors import NvkitError, error_summary
from ...memory.estimate import attention_dims

#: steps per graph replay; 8 keeps streaming smooth (a chunk every few ms) and the host idle.
DEFAULT_K = env_int("NVKIT_FAST_K", 8, 1, 64)
# fast=None (the default) on a length/sampling mode not captured yet: only requests of at least this
# many new tokens pay the one-time capture (measured 20-75 s on the H200 for the Qwen3-0.6B shape)
# themselves; shorter ones run plain generate at once (a 24-token first reply in tutorial 00 had
# waited 75 s). Once captured, every request of that length and mode takes the fast path.
AUTO_MIN_TOKENS = env_int("NVKIT_FAST_MIN_TOKENS", 128, 1)
MIN_BUCKET = 256
MAX_BUCKETS = 3  # captured buckets kept per model (each holds a KV cache of its length)

# Generation options the fast path honours; the first group changes nothing in the logits.
_SUPPORTED = {"max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "pad_token_id", "eos_token_id",
              "use_cache", "return_dict_in_generate"}
# Generation-config fields that would add a logits processor the graph does not implement, with
# the value that means "off".
_PROCESSORS_OFF = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,), "min_length": (None, 0), "min_new_tokens": (None, 0), "num_beams": (None, 1),
    "num_return_sequences": (None, 1), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "sequence_bias": (None,),
    "guidance_scale": (None, 1.0), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
    "min_p": (None,), "top_h": (None,), "exponential_decay_length_penalty": (None,), "watermarking_config": (None,),
    "renormalize_logits": (None, False), "max_length": None,  # max_length: see resolve
    "stop_strings": (None,), "assistant_model": (None,), "prompt_lookup_num_tokens": (None,),
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
        # temperature/top_p live in device tensors (no recapture); top_k and which filters run shape the graph
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
        if off is None:
            continue
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


def _bucket_len(needed: int) -> int:
    n = MIN_BUCKET
    while n < needed:
        n *= 2
    return n


def _pick(logits, s: "_Bucket", key: tuple):
    """The next token from (1, vocab) float logits, as a (1,) int64 tensor; device ops only."""
    import torch
    if key[0] == "greedy":
        return logits.argmax(-1)
    _, top_k, use_top_p = key
    logits = logits / s.temperature
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if use_top_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly above each token; the top token always stays
        sorted_logits = sorted_logits.masked_fill(before > s.top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    # Gumbel-max: argmax(p / Exp(1)) is a draw from p, with no host sync (multinomial would need one)
    noise = torch.empty_like(probs).exponential_(1.0)
    return (probs / noise).argmax(-1)


# Architectures whose decoder layer is exactly: RMSNorm, q/k/v (optional q/k RMSNorm), RoPE,
# attention, o, residual, RMSNorm, SiLU-gated MLP, residual (checked module by module in _fusable).
_FUSABLE = ("llama", "mistral", "qwen2", "qwen3")


def _fusable(model) -> str | None:
    """Why nvkit's own fused decode step does not fit ``model`` (None when it does)."""
    cfg = model.config.get_text_config()
    mtype = getattr(cfg, "model_type", None)
    if mtype not in _FUSABLE:
        return f"model type {mtype!r} is not one of {', '.join(_FUSABLE)}"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("layers", "embed_tokens", "norm", "rotary_emb")):
        return "the model does not have the usual decoder layout"
    if getattr(inner.rotary_emb, "rope_type", "default") in ("dynamic", "longrope"):
        return "its RoPE rescales with the length at run time"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"its MLP activation is {cfg.hidden_act!r}"
    import torch.nn as nn
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(type(m) is not nn.Linear for m in names):  # exact type: LoRA or quantized layers compute otherwise
            return "its projections are not plain Linear layers"
    return None


ATTENTION_KINDS = ("matmul", "reduce", "triton", "triton-fused")
# The fused step's attention when none is asked for: "auto" is triton-fused where it fits (CUDA, a
# power-of-two head size, per-head RMS q/k norms or none), matmul elsewhere, and matmul also where the Triton step
# fails to capture on this GPU (FastDecoder._captured). Timed against matmul in one process on the
# H200 (Qwen3-0.6B shape, bf16, 256 tokens, 5 alternating rounds): 845.5 vs 822.5 tok/s
# (`bash scripts/gpu_session.sh decide`); after the decode loop was pipelined 880.9 vs 843.9 in one
# process and 1084.6 vs 853.4 in another (`bash scripts/gpu_session.sh table`). Logits and tokens
# match the model's (tests/gpu/test_fast_gpu.py, also with NVKIT_FAST_ATTENTION=triton-fused).
DEFAULT_ATTENTION = "auto"


def _triton_cannot_run_on(device) -> str | None:
    """Why nvkit's Triton decode-attention kernels cannot run on ``device`` (None: they can).
    "auto" asks this first; a kernel asked for by name is built anyway (Triton's interpreter runs
    it on a CPU in the tests)."""
    if device.type != "cuda":
        return f"nvkit's Triton attention kernels run on CUDA GPUs; this model is on {device.type}"
    return None


def _qk_norms(attn):
    """(q_norm weight, k_norm weight, eps) of an attention layer; (None, None, 0.0) without norms."""
    if not hasattr(attn, "q_norm"):
        return None, None, 0.0
    return attn.q_norm.weight, attn.k_norm.weight, float(attn.q_norm.variance_epsilon)


def _qk_norm_why(model, hd: int) -> str | None:
    """Why the per-head q/k norms are not the plain RMS norm the fused kernel applies (None: they are)."""
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
            return "it normalises only one of q and k"
        if not hasattr(attn, "q_norm"):
            continue
        for norm in (attn.q_norm, attn.k_norm):
            w = getattr(norm, "weight", None)
            if not type(norm).__name__.endswith("RMSNorm") or w is None or tuple(w.shape) != (hd,) \
                    or not hasattr(norm, "variance_epsilon"):
                return f"its q/k norm ({type(norm).__name__}) is not a per-head RMS norm"
        if attn.q_norm.variance_epsilon != attn.k_norm.variance_epsilon:
            return "its q and k norms use different epsilons"
    return None


def _fuse(mods) -> tuple[Any, Any]:
    """One (weight, bias) for Linear layers that read the same input, stacked by output rows.

    The layers' parameters are re-pointed at slices of the new tensors, so memory stays as it was
    and the layers compute what they did. Called again after the weights were replaced (merging an
    adapter, loading new weights), it fuses the new ones."""
    import torch
    # Fusing happens inside generation, under inference_mode; tensors made there could never be
    # used for training again ("Inference tensors cannot be saved for backward", seen on the H200
    # when a training step followed a fast generate). The fused tensors must be ordinary ones.
    with torch.inference_mode(False), torch.no_grad():
        ws = [m.weight for m in mods]
        fused_w = torch.cat([w.detach() for w in ws])
        off = 0
        for m, w in zip(mods, ws):
            n = w.shape[0]
            m.weight.data = fused_w[off:off + n]
            off += n
        fused_b = None
        if any(m.bias is not None for m in mods):
            fused_b = torch.cat([m.bias.detach() if m.bias is not None else
                                 torch.zeros(m.weight.shape[0], dtype=fused_w.dtype, device=fused_w.device)
                                 for m in mods])
            off = 0
            for m in mods:
                n = m.weight.shape[0]
                if m.bias is not None:
                    m.bias.data = fused_b[off:off + n]
                off += n
    return fused_w, fused_b


def _still_fused(mods, fused_w) -> bool:
    off = 0
    for m in mods:
        w = m.weight
        if off + w.shape[0] > fused_w.shape[0] or w.data_ptr() != fused_w[off].data_ptr():
            return False
        off += w.shape[0]
    return off == fused_w.shape[0]


class _Fused:
    """The fused q/k/v and gate/up projections of every layer (see ``_fuse``)."""

    def __init__(self, model):
        self.groups = []
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.groups.append(((a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)))
        self.fuse()

    def fuse(self):
        self.qkv, self.gate_up = [], []
        for qkv, gu in self.groups:
            self.qkv.append(_fuse(qkv))
            self.gate_up.append(_fuse(gu)[0])

    def valid(self) -> bool:
        return all(_still_fused(qkv, w) and _still_fused(gu, g)
                   for (qkv, gu), (w, _), g in zip(self.groups, self.qkv, self.gate_up))


def _fused_step(model, fused: "_Fused", b: "_Bucket", eager_head: bool = False,
                attention: str = "matmul") -> Callable:
    """nvkit's decode step for the ``_FUSABLE`` family: same math as the model's forward for one
    token, with one product for q/k/v, one for gate/up, and grouped-query attention without
    copies. Reads and advances ``b.pos``; writes the new key/value into the static cache.

    ``eager_head``: the step stops at the final norm and ``b.head`` (left out of compilation, so
    cuBLAS runs it, still inside the captured graph) applies the LM head. Why: in one H200 profile
    inductor's tuned reduction took 114 µs per token for the 152k × 1024 head where cuBLAS took
    72 µs; ``nvkit bench --decode --paths "fast,fast cublas head"`` measures the whole step.

    ``attention="reduce"`` writes attention as products and sums instead of two batched matmuls,
    so inductor generates its own reductions rather than calling cuBLAS for (16 × 128) · (128 × L)
    products (2.6–3.1 µs each in the H200 profile); "fast reduce attention" in the bench measures it.
    ``attention="triton"`` uses nvkit's split-cache decode kernel (``nvkit.decode_attention``): two
    small kernels instead of three per layer, and nothing read past the current position.
    ``attention="triton-fused"`` hands it the q/k/v projection's output instead: the same two
    kernels also apply the q/k norms and RoPE and write the new key and value into the cache, which
    the other paths do in kernels of their own."""
    import torch
    import torch.nn.functional as F
    inner = model.model
    nh, nkv, hd = attention_dims(model.config)
    groups = nh // nkv
    layers = list(inner.layers)
    caches = b.cache.layers
    dtype = model.dtype
    neg = torch.finfo(torch.float32).min
    if attention == "triton":
        from ..decode_attention import decode_attention
    if attention == "triton-fused":
        from ..decode_attention import decode_attention_rope
        norms = [_qk_norms(layer.self_attn) for layer in layers]

    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def step(tok):
        pos = b.pos
        h = inner.embed_tokens(tok)                                    # (1, 1, hidden)
        cos, sin = inner.rotary_emb(h, pos.view(1, 1))                 # (1, 1, hd)
        cos, sin = cos.view(1, hd), sin.view(1, hd)
        mask = torch.where(b.arange <= pos, 0.0, neg)                  # (length,) float32
        where = pos.view(1)
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(h)
            w, bias = fused.qkv[i]
            qkv = F.linear(x, w, bias).view(nh + 2 * nkv, hd)
            keys, values = caches[i].keys, caches[i].values            # (1, nkv, length, hd)
            if attention == "triton-fused":  # norms, RoPE, cache writes and attention in two kernels
                qw, kw, eps = norms[i]
                o = decode_attention_rope(qkv, qw, kw, cos.view(hd), sin.view(hd), keys[0], values[0], pos,
                                          float(attn.scaling), eps).reshape(1, 1, nh * hd)
            else:
                q, k, v = qkv.split((nh, nkv, nkv))
                if hasattr(attn, "q_norm"):
                    q, k = attn.q_norm(q), attn.k_norm(k)
                q, k = rope(q, cos, sin), rope(k, cos, sin)
                keys.index_copy_(2, where, k.view(1, nkv, 1, hd))
                values.index_copy_(2, where, v.view(1, nkv, 1, hd))
                # (FlexAttention's decode kernel measured slower here: 449 against 620 tok/s untuned)
                if attention == "triton":
                    o = decode_attention(q.reshape(nh, hd), keys[0], values[0], pos,
                                         float(attn.scaling)).reshape(1, 1, nh * hd)
                elif attention == "reduce":
                    kf, vf = keys[0].unsqueeze(1).float(), values[0].unsqueeze(1).float()    # (nkv, 1, length, hd)
                    scores = (q.view(nkv, groups, 1, hd).float() * kf).sum(-1) * attn.scaling + mask
                    probs = scores.softmax(-1)
                    o = (probs.unsqueeze(-1) * vf).sum(-2).to(dtype).reshape(1, 1, nh * hd)
                else:
                    scores = torch.matmul(q.view(nkv, groups, hd), keys[0].transpose(1, 2)).float() * attn.scaling + mask
                    probs = scores.softmax(-1).to(dtype)
                    o = torch.matmul(probs, values[0]).reshape(1, 1, nh * hd)
            h = h + attn.o_proj(o)
            x = layer.post_attention_layernorm(h)
            gate, up = F.linear(x, fused.gate_up[i]).chunk(2, dim=-1)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        b.pos.add_(1)
        if eager_head:
            return inner.norm(h)
        return model.lm_head(inner.norm(h))[:, -1, :].float()

    if eager_head:
        b.head = lambda hidden: model.lm_head(hidden)[:, -1, :].float()
    return step


@dataclass
class _Bucket:
    length: int
    cache: Any
    tok: Any          # (1, 1) int64: the next step's input id
    out: Any          # (K,) int64: the ids picked by one replay
    arange: Any       # (length,) int64
    temperature: Any  # 0-dim float32
    top_p: Any        # 0-dim float32
    pos: Any = None   # 0-dim int64: the next position (the fused step's own counter)
    step: Callable | None = None
    head: Callable | None = None  # applied to the step's output outside compilation (see _fused_step)
    graphs: dict = field(default_factory=dict)
    logits: Any = None  # (K, vocab) float32 when a graph keeps its logits (tests)
    host: Any = None    # two (pinned K-id buffer, CUDA event) pairs the host reads replays through


def _has_inductor_option(config, dotted: str) -> bool:
    obj = config
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


class FastDecoder:
    """Greedy/sampled decoding of one sequence on one GPU, K steps per CUDA-graph replay.

    ``compile``: fuse the decode step with inductor before capture (falls back to the eager
    forward if compiling fails). ``graphs=False`` runs the same step code without capture (for
    checking the logic on a CPU; not a fast path)."""

    def __init__(self, model, k_steps: int = DEFAULT_K, compile: bool = True, graphs: bool = True,
                 tune: bool | None = None, fused: bool | None = None, head: str | None = None,
                 attention: str | None = None, pdl: bool | None = None, inductor: dict | None = None):
        if not isinstance(k_steps, int) or isinstance(k_steps, bool) or not 1 <= k_steps <= 64:
            raise NvkitError(f"k_steps must be a whole number from 1 to 64, not {k_steps!r}.")
        self.model = model
        self.k = k_steps
        self.compile = compile
        self.graphs = graphs
        self.tune = env_flag("NVKIT_FAST_TUNE", True) if tune is None else tune
        self.device = model.get_input_embeddings().weight.device
        self.max_positions = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 1 << 20)
        self._buckets: "collections.OrderedDict[int, _Bucket]" = collections.OrderedDict()
        self._compiled = None
        self.compiled = False      # True once the inductor step was used for a capture
        self.compile_error: str | None = None
        self.compile_detail: str | None = None  # the whole message (inductor's carry the worker's traceback)
        self.capture_seconds: dict[tuple, float] = {}
        self._lock = threading.Lock()
        # fused=None: nvkit's own step where the architecture allows (NVKIT_FAST_FUSED=0 turns it off)
        why = _fusable(model)
        if fused is None:
            fused = why is None and env_flag("NVKIT_FAST_FUSED", True)
        elif fused and why:
            raise NvkitError(f"The fused decode step does not fit this model: {why}. Use fused=None or False.")
        self.fused_why = why
        self.attention_why: str | None = None  # why attention="auto" settled on matmul
        self._fused = _Fused(model) if fused else None
        # head: "compiled" (inside the inductor step) or "cublas" (eager, fused step only)
        head = head or env_choice("NVKIT_FAST_HEAD", "compiled", ("compiled", "cublas"))
        if head not in ("compiled", "cublas"):
            raise NvkitError(f"head must be 'compiled' or 'cublas', not {head!r}.")
        self.head = head
        # attention: "matmul" (two batched products), "reduce" (products and sums), "triton"
        # (nvkit.decode_attention's kernels) or "triton-fused" (the same kernels also doing the q/k
        # norms, RoPE and the cache writes); all but "matmul" in the fused step only
        # "auto": triton-fused where it fits this model and machine, else matmul (see DEFAULT_ATTENTION)
        attention = attention or env_choice("NVKIT_FAST_ATTENTION", DEFAULT_ATTENTION, ATTENTION_KINDS + ("auto",))
        if attention not in ATTENTION_KINDS + ("auto",):
            raise NvkitError(f"attention must be one of {', '.join(map(repr, ATTENTION_KINDS + ('auto',)))}, "
                             f"not {attention!r}.")
        self._attention_asked = attention  # what settings() repeats: "auto" re-decides for a rebuilt decoder
        if attention == "auto":
            why = _triton_cannot_run_on(self.device)
            if why is None:
                try:
                    self._check_triton_attention(model, "triton-fused")
                except NvkitError as e:
                    why = str(e)
            attention, self.attention_why = ("matmul", why) if why else ("triton-fused", None)
        elif attention.startswith("triton"):
            self._check_triton_attention(model, attention)
        self.attention = attention
        # pdl: inductor's Triton kernels launched with Programmatic Dependent Launch (Hopper and
        # newer; inductor checks the GPU), so each kernel's launch overlaps the tail of the one before
        # it inside the graph. Measured on the H200 (Qwen3-0.6B shape, K=8, 256 tokens), each pair in
        # one process but with other GPU jobs sharing the host: 839 tok/s without, 923 with; in a
        # second run 868 without, 856 with (noise of that size). Tokens stay identical to plain
        # greedy on the demo model. Default on where this torch can emit it (NVKIT_FAST_PDL=0: off).
        import torch._inductor.config as inductor_config
        can_pdl = hasattr(inductor_config.triton, "enable_pdl")
        if pdl is None:
            pdl = can_pdl and env_flag("NVKIT_FAST_PDL", True)
        elif pdl and not can_pdl:
            import torch
            raise NvkitError(f"pdl=True needs a torch whose inductor can emit Programmatic Dependent Launch "
                             f"(torch._inductor.config.triton.enable_pdl); torch {torch.__version__} has none. "
                             "Use pdl=False.")
        # inductor: more inductor settings for the capture (the bench's "combo" tries combo_kernels)
        self.inductor = dict(inductor or {})
        bad = [k for k in self.inductor if not _has_inductor_option(inductor_config, k)]
        if bad:
            raise NvkitError(f"Unknown inductor option(s) {bad}: see torch._inductor.config.")
        self.pdl = bool(pdl)

    def _check_triton_attention(self, model, kind: str) -> None:
        if self._fused is None:
            raise NvkitError(f"attention={kind!r} belongs to the fused decode step, which does not fit this model"
                             f"{': ' + self.fused_why if self.fused_why else ' (fused=False)'}.")
        try:
            from .. import decode_attention  # noqa: F401 - imports triton
        except ImportError as e:
            raise NvkitError(f"attention={kind!r} needs the triton package ({e}); PyTorch's CUDA builds bring it.") from e
        hd = attention_dims(model.config)[2]
        if hd & (hd - 1):
            raise NvkitError(f"attention={kind!r} needs a power-of-two head_dim; this model's is {hd}.")
        if kind == "triton-fused":
            why = _qk_norm_why(model, hd)
            if why:
                raise NvkitError(f"attention='triton-fused' does not fit this model: {why}. attention='triton' does.")

    @property
    def fused(self) -> bool:
        return self._fused is not None

    def describe(self) -> str:
        """How this decoder runs, in a few words for the stats line: the step, compiled or why not,
        its attention, the steps per graph replay."""
        step = "fused step" if self._fused is not None else "model forward"
        if not self.graphs:
            how = "eager, no CUDA graphs"
        elif self.compiled:
            how = "compiled"
        elif self.compile_error:
            how = f"eager: torch.compile failed ({self.compile_error})"
        else:
            how = "eager"
        parts = [f"{step}, {how}"]
        if self._fused is not None:
            parts.append(f"{self.attention} attention" + (" (auto)" if self._attention_asked == "auto" else ""))
        parts.append(f"{self.k} steps per replay")
        return ", ".join(parts)

    @property
    def settings(self) -> dict:
        """The constructor arguments this decoder was built with (``decoder()`` compares them)."""
        return dict(k_steps=self.k, compile=self.compile, head=self.head, attention=self._attention_asked, pdl=self.pdl,
                    inductor=self.inductor)

    def _check_fused(self) -> None:
        """Weights replaced since fusing (an adapter merged, say) -> fuse again and capture again."""
        if self._fused is not None and not self._fused.valid():
            self._fused.fuse()
            self._buckets.clear()
            events.record("compile", "fast decode: the weights changed; fusing and capturing again")

    # --- setup ---------------------------------------------------------------------------------
    def _new_bucket(self, length: int) -> _Bucket:
        import torch
        from transformers import StaticCache
        dev = self.device
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        b = _Bucket(length=length, cache=cache, pos=torch.zeros((), dtype=torch.long, device=dev),
                    tok=torch.zeros((1, 1), dtype=torch.long, device=dev),
                    out=torch.zeros((self.k,), dtype=torch.long, device=dev),
                    arange=torch.arange(length, device=dev),
                    temperature=torch.ones((), dtype=torch.float32, device=dev),
                    top_p=torch.ones((), dtype=torch.float32, device=dev))
        # Allocate the cache eagerly (lazy allocation inside a traced/captured region would move it).
        self.model(input_ids=b.tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.reset()
        model = self.model
        layer0 = cache.layers[0]

        dtype = model.dtype
        zero = torch.zeros((), dtype=dtype, device=dev)
        neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=dev)

        def step(tok):
            # The position lives on the device (the cache's own counter), so the graph needs no host input.
            pos = layer0.cumulative_length
            # additive mask in the model dtype: sdpa takes it as is (a bool one is converted in every layer)
            mask = torch.where(b.arange <= pos, zero, neg).view(1, 1, 1, length)
            out = model(input_ids=tok, attention_mask=mask, position_ids=pos.view(1, 1), past_key_values=cache,
                        use_cache=True, logits_to_keep=1)
            return out.logits[:, -1, :].float()

        b.step = self._fused_step_for(b) if self._fused is not None else step
        return b

    def _fused_step_for(self, b: _Bucket) -> Callable:
        return _fused_step(self.model, self._fused, b, eager_head=self.head == "cublas", attention=self.attention)

    def _bucket(self, needed: int) -> _Bucket:
        length = _bucket_len(needed)
        if length > self.max_positions:
            raise NvkitError(f"The prompt plus max_new_tokens (+{self.k} steps of slack) needs {needed} positions; "
                             f"the model handles {self.max_positions}. Shorten the prompt or ask for fewer tokens.")
        b = self._buckets.get(length)
        if b is None:
            while len(self._buckets) >= MAX_BUCKETS:
                self._buckets.popitem(last=False)  # oldest: its cache and graphs are freed
            b = self._buckets[length] = self._new_bucket(length)
        self._buckets.move_to_end(length)
        return b

    def _step_fn(self, b: _Bucket):
        if not (self.compile and self.graphs) or self.compile_error:
            return b.step
        import torch
        # dynamic=False: one specialised kernel set per bucket; fullgraph: a graph break would mean host work per step
        return torch.compile(b.step, fullgraph=True, dynamic=False)

    def _body(self, b: _Bucket, key: tuple, fn, keep_logits: bool):
        def body():
            for i in range(self.k):
                logits = fn(b.tok)
                if b.head is not None:
                    logits = b.head(logits)
                nxt = _pick(logits, b, key)
                if keep_logits:
                    b.logits[i].copy_(logits[0])
                b.out[i].copy_(nxt[0])
                b.tok.copy_(nxt.view(1, 1))
        return body

    def _capture(self, b: _Bucket, key: tuple, keep_logits: bool):
        import torch
        gkey = (key, keep_logits)
        if gkey in b.graphs:
            return b.graphs[gkey]
        if keep_logits and b.logits is None:
            vocab = int(self.model.config.get_text_config().vocab_size)
            b.logits = torch.zeros((self.k, vocab), dtype=torch.float32, device=self.device)
        if not self.graphs:
            b.graphs[gkey] = self._body(b, key, b.step, keep_logits)
            return b.graphs[gkey]
        what = f"fast decode: capturing {self.k} steps per graph for cache length {b.length} ({key[0]})"
        events.record("compile", what + (" with torch.compile; once per session and length" if self.compile else ""))
        t = time.perf_counter()
        # Warm-up and capture draw random numbers; keep the user's seeded stream as it was.
        rng = torch.cuda.get_rng_state(self.device)
        try:
            graph = self._captured(b, key, keep_logits)
        finally:
            torch.cuda.set_rng_state(rng, self.device)
            b.cache.reset()
        seconds = time.perf_counter() - t
        self.capture_seconds[(b.length, key, keep_logits)] = seconds
        self.compiled = self.compile and not self.compile_error
        events.record("compile", f"fast decode ready for cache length {b.length} in {seconds:.1f} s "
                                 f"({'compiled' if self.compiled else 'eager'} step, {self.k} steps per replay)")
        b.graphs[gkey] = graph.replay
        return b.graphs[gkey]

    def _captured(self, b: _Bucket, key: tuple, keep_logits: bool):
        """The bucket's graph: the compiled step, else the eager one. Under ``attention="auto"`` a
        Triton attention step that fails first gives way to "matmul", compiled: nvkit's kernels were
        measured on an H200 only, and the eager Triton step would be slower than compiled matmul."""
        import torch
        try:
            return self._capture_with(b, key, keep_logits, self._step_fn(b))
        except Exception as e:  # noqa: BLE001 - compile problems fall back, as said above
            retry_matmul = self._attention_asked == "auto" and self.attention != "matmul"
            if not retry_matmul and (not self.compile or self.compile_error):
                raise
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # what the failed warm-up queued ends before the retry
            if retry_matmul:
                self._attention_failed(b, e)
                return self._captured(b, key, keep_logits)
            self.compile_error = error_summary(e)
            self.compile_detail = str(e)
            events.record("compile", f"fast decode: torch.compile failed ({self.compile_error}); capturing the eager forward")
            return self._capture_with(b, key, keep_logits, b.step)

    def _attention_failed(self, b: _Bucket, e: Exception) -> None:
        """attention="auto" settles on "matmul" for this decoder: ``b`` gets the matmul step, and the
        other buckets (captured with the Triton step) are dropped so that every length runs one path."""
        self.attention_why = (f"attention={self.attention!r} failed on this GPU ({error_summary(e)}); "
                              "nvkit uses 'matmul' here")
        events.record("compile", f"fast decode: {self.attention_why}")
        self.attention = "matmul"
        for length in [n for n, other in self._buckets.items() if other is not b]:
            del self._buckets[length]
        b.graphs.clear()
        b.cache.reset()
        b.step = self._fused_step_for(b)

    def _inductor_options(self, compiling: bool):
        """Coordinate-descent tuning also makes inductor turn the batch-1 matmuls (matrix x vector)
        into its own reduction kernels, tuned to the memory bandwidth and fused with their
        neighbours, instead of one cuBLAS call each (the trick gpt-fast relies on)."""
        import contextlib
        if not compiling or not (self.tune or self.pdl or self.inductor):
            return contextlib.nullcontext()
        import torch._inductor.config as inductor_config
        patch = {"coordinate_descent_tuning": True} if self.tune else {}
        if self.pdl:
            patch["triton.enable_pdl"] = True
        patch.update(self.inductor)
        return inductor_config.patch(patch)

    def _capture_with(self, b: _Bucket, key: tuple, keep_logits: bool, fn):
        import torch
        body = self._body(b, key, fn, keep_logits)
        b.cache.reset()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), self._inductor_options(fn is not b.step):
            for _ in range(3):  # compile + autotune, then settle the allocator before capture
                b.cache.reset()
                b.pos.zero_()
                body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        b.cache.reset()
        b.pos.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        torch.cuda.synchronize(self.device)
        return graph

    def _positions(self, prompt_len: int, sampling: Sampling) -> int:
        """Cache positions a request needs: the prompt, the new tokens, and the up to K-1 steps a
        replay computes past the last one (+1 of slack)."""
        return prompt_len + sampling.max_new_tokens + self.k

    def ready(self, prompt_len: int, sampling: Sampling) -> bool:
        """True when a request of this size and sampling mode runs without capturing anything first."""
        b = self._buckets.get(_bucket_len(self._positions(prompt_len, sampling)))
        return (b is not None and (sampling.key, False) in b.graphs
                and (self._fused is None or self._fused.valid()))

    def prepare(self, prompt_len: int, sampling: Sampling, keep_logits: bool = False) -> float:
        """Capture what a request of this size needs now; returns the seconds it took (0 when cached)."""
        with self._lock:
            t = time.perf_counter()
            self._check_fused()
            b = self._bucket(self._positions(prompt_len, sampling))
            self._capture(b, sampling.key, keep_logits)
            return time.perf_counter() - t

    # --- decoding ------------------------------------------------------------------------------
    def generate(self, input_ids, sampling: Sampling, on_tokens: Callable[[list[int]], None] | None = None,
                 stop_event: threading.Event | None = None, keep_logits: bool = False) -> list[int]:
        """Decode up to ``sampling.max_new_tokens`` ids after ``input_ids`` ((1, n) on the model's device).

        ``on_tokens`` gets each chunk of new ids as soon as it is known (the first one right after
        the prefill). Returns the new ids, EOS included when reached. With ``keep_logits`` the
        float logits of each step are kept in ``self.last_logits`` (list of (vocab,) tensors)."""
        with self._lock:
            n = int(input_ids.shape[-1])
            self._check_fused()
            b = self._bucket(self._positions(n, sampling))
            replay = self._capture(b, sampling.key, keep_logits)
            b.cache.reset()
            b.temperature.fill_(max(sampling.temperature, 1e-5))
            b.top_p.fill_(sampling.top_p)
            eos = set(sampling.eos)
            kept: list = []
            out = self.model(input_ids=input_ids, past_key_values=b.cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :].float()
            first = _pick(logits, b, sampling.key)
            b.tok.copy_(first.view(1, 1))
            b.pos.fill_(n)
            if keep_logits:
                kept.append(logits[0].clone())
            # Pipelined: the next replay is queued before the host reads the ids of the one before,
            # so the GPU is not idle while the host checks EOS and runs the callbacks (streamed text,
            # progress). On the H200 that host work took ~1.2 ms per replay through Session.generate,
            # about a seventh of the decode time at K=8. At most two replays are in flight; the one
            # queued past an EOS or a Stop is wasted work (the next request resets the cache).
            pending: collections.deque = collections.deque()
            planned = 1  # tokens covered by the replays queued so far, if no EOS comes

            def queue_next() -> None:
                nonlocal planned
                if planned >= sampling.max_new_tokens or (stop_event is not None and stop_event.is_set()):
                    return
                replay()
                pending.append(self._readout(b, (planned - 1) // self.k, keep_logits))
                planned += self.k

            queue_next()  # before the first token's sync: the GPU goes on while the host streams it
            tokens = [int(first.item())]
            if on_tokens:
                on_tokens(tokens[:])
            if tokens[0] in eos:
                self._drain(pending)
                self.last_logits = kept
                return tokens
            while pending:
                queue_next()
                chunk, logits_k = self._collect(pending.popleft())
                kept.extend(logits_k)
                chunk = chunk[:sampling.max_new_tokens - len(tokens)]
                for i, t in enumerate(chunk):
                    if t in eos:
                        chunk = chunk[:i + 1]
                        break
                tokens.extend(chunk)
                if on_tokens and chunk:
                    on_tokens(chunk)
                if chunk and chunk[-1] in eos:
                    break
            self._drain(pending)
            self.last_logits = kept[:len(tokens)]
            return tokens

    def _readout(self, b: _Bucket, slot: int, keep_logits: bool) -> tuple:
        """Queue the copy of one replay's ids (and logits) to where the host reads them, ahead of
        the next replay overwriting them; ``_collect`` waits for it. On CUDA the ids go to one of
        two pinned buffers (two replays in flight at most) with an event to wait on."""
        import torch
        logits = [b.logits[i].clone() for i in range(self.k)] if keep_logits else []
        if b.out.device.type != "cuda":
            return b.out.clone(), None, logits
        if b.host is None:
            b.host = [(torch.empty(self.k, dtype=torch.long, pin_memory=True), torch.cuda.Event()) for _ in range(2)]
        host, done = b.host[slot % 2]
        host.copy_(b.out, non_blocking=True)  # on b.out's device's current stream, after the replay
        done.record(torch.cuda.current_stream(b.out.device))  # that stream, not the current device's
        return host, done, logits

    @classmethod
    def _drain(cls, pending: collections.deque) -> None:
        """Wait for the replays queued past an EOS: nothing of this request runs on the GPU after
        it returns (a bucket dropped next must not free a graph that is still replaying)."""
        while pending:
            cls._collect(pending.popleft())

    @staticmethod
    def _collect(item: tuple) -> tuple[list[int], list]:
        host, done, logits = item
        if done is not None:
            done.synchronize()
        return host.tolist(), logits

    def release(self) -> None:
        """Drop every captured graph and cache, and the compiled step (memory back to the allocator)."""
        with self._lock:
            codes = {b.step.__code__ for b in self._buckets.values() if b.step is not None}
            self._buckets.clear()
            if codes and self.compile and self.graphs:
                # dynamo keeps compiled entries (and what their guards hold: the model) on the code object
                try:
                    import torch._dynamo
                    for code in codes:
                        torch._dynamo.reset_code(code)
                except Exception:  # noqa: BLE001 - an older torch: the entries only cost memory
                    pass


# --- the session-facing side ----------------------------------------------------------------------

_ATTR = "_nvkit_fast_decoder"


def decoder(session, k_steps: int | None = None, compile: bool | None = None, head: str | None = None,
            attention: str | None = None, pdl: bool | None = None, inductor: dict | None = None) -> FastDecoder:
    """The session's decoder (created on first use; kept on the model so unloading frees it too).

    ``k_steps`` / ``compile`` / ``head`` / ``attention`` / ``pdl`` / ``inductor`` replace it with one built that way (its
    captures are paid again)."""
    model = session.model
    d = getattr(model, _ATTR, None)
    asked = {name: value for name, value in dict(k_steps=k_steps, compile=compile, head=head, attention=attention,
                                                   pdl=pdl, inductor=inductor).items() if value is not None}
    if d is not None and all(d.settings[name] == value for name, value in asked.items()):
        return d
    settings = d.settings if d is not None else {"compile": env_flag("NVKIT_FAST_COMPILE", True)}
    if d is not None:
        d.release()  # its graphs and caches go before the new one captures
    d = FastDecoder(model, **{**settings, **asked})
    swap(session, d)
    return d


def swap(session, d: FastDecoder | None) -> FastDecoder | None:
    """Make ``d`` the session's decoder and return the one it replaces, without releasing either
    (the decode benchmark keeps several captured side by side to time them in alternation). The
    caller owns the returned decoder: ``release()`` it, or swap it back."""
    model = session.model
    old = getattr(model, _ATTR, None)
    if d is None:
        if old is not None:
            object.__delattr__(model, _ATTR)
    else:
        if d.model is not model:
            raise NvkitError("This decoder was built for another model; nvkit.generate.fast.decoder(session) builds one for it.")
        # A plain attribute on the nn.Module (not a submodule): unload drops the model and this with it.
        object.__setattr__(model, _ATTR, d)
    return old


def forget(model) -> None:
    """Release the decoder kept on ``model`` (``Session.unload`` calls this before dropping it)."""
    d = getattr(model, _ATTR, None) if model is not None else None
    if d is not None:
        compiled = d.compiled
        d.release()
        if compiled:
            # Measured on the H200: resetting only the step's code entries still left the weights
            # referenced by dynamo/inductor state; the model is going away, so clear all of it.
            try:
                import torch._dynamo
                torch._dynamo.reset()
            except Exception:  # noqa: BLE001
                pass
        try:
            object.__delattr__(model, _ATTR)
        except AttributeError:
            pass


def worth_capturing(session, text: str, gen: dict) -> str | None:
    """For ``fast=None``: None when the fast path should run this request now, else why plain
    ``generate`` is the quicker answer (nothing captured for it yet, and too short to pay for that)."""
    if int(gen["max_new_tokens"]) >= AUTO_MIN_TOKENS:
        return None
    d = getattr(session.model, _ATTR, None)
    sampling, _ = resolve(session.model, gen)
    if d is not None and sampling is not None:
        n = len(session.tokenizer(text)["input_ids"])
        if d.ready(n, sampling):
            return None
    return (f"nothing is captured yet for this length and sampling mode, and {gen['max_new_tokens']} new tokens "
            f"(< {AUTO_MIN_TOKENS}) would not pay the one-time capture; fast=True (or a request of "
            f"≥ {AUTO_MIN_TOKENS} tokens) captures it once per session")
