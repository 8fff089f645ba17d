"""The KV cache of one size class and every device buffer the fast path's graphs read and write.

A size class is a power of two of tokens (``FastOptions.cache_tokens`` at least): every request
whose prompt, new tokens and replay slack fit in it runs on the same graphs, because the steps
read the position from ``pos`` on the device. A request that needs more doubles the class.
Prompts are padded to a prefill class (powers of two from ``MIN_PREFILL`` up to
``MAX_PREFILL``), one prefill graph each; longer prompts run their prefill eagerly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from . import experts as experts_mod
from .cuda_graphs import drop
from .fused_fit import layer_kinds

if TYPE_CHECKING:
    from torch import Tensor

MIN_PREFILL = 16
MAX_PREFILL = 2048


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def size_class(needed: int, smallest: int, max_positions: int) -> int:
    """The cache length for a request of ``needed`` positions: ``smallest`` doubled until it fits,
    never longer than the power of two that holds the model's whole context."""
    return min(max(smallest, next_pow2(needed)), max(next_pow2(max_positions), next_pow2(needed)))


def prefill_class(n: int, length: int) -> int | None:
    """The padded length a prompt of ``n`` tokens is prefilled at (None: too long for a class)."""
    if n > min(MAX_PREFILL, length):
        return None
    return max(MIN_PREFILL, next_pow2(n))


class GraphKey(NamedTuple):
    """What a batch-1 graph is captured for: the sampling mode (``Sampling.key``), whether the
    adapters run, whether the graph copies its logits out (``FastDecoder.trace``)."""
    sampling: tuple
    lora: bool
    logits: bool = False


@dataclass
class Cache:
    """One size class: the KV cache, the request's device buffers, and the graphs captured on them."""
    length: int
    k: int                 # decode steps per replay
    keys: list[Tensor] = field(default_factory=list)    # fused step: per layer (kv heads, length, head_dim)
    values: list[Tensor] = field(default_factory=list)
    kv: Any = None         # model-forward step: a transformers StaticCache
    tok: Tensor | None = None        # (1, 1) int64: the next step's input id
    out: Tensor | None = None        # (K,) int64: the ids picked by one replay
    pos: Tensor | None = None        # 0-dim int64: the position the next token takes
    arange: Tensor | None = None     # (length,) int64
    cos: Tensor | None = None        # (kinds × length, rotary width) rotary tables (fused step, FusedWeights.rotary)
    sin: Tensor | None = None
    prompt: Tensor | None = None     # (1, prefill capacity) int64: the padded prompt a prefill graph reads
    last: Tensor | None = None       # 0-dim int64: the prompt's last position
    first_logits: Tensor | None = None  # (1, vocab) float32: what the prefill returns
    temperature: Tensor | None = None   # 0-dim float32
    top_p: Tensor | None = None         # 0-dim float32
    penalty: Tensor | None = None       # 0-dim float32: repetition penalty (1: none)
    min_pos: Tensor | None = None       # 0-dim int64: the first position an EOS may take
    eos_mask: Tensor | None = None      # (1, vocab) bool
    seen: Tensor | None = None          # (1, vocab) bool: ids in the prompt and the text so far
    logits: Tensor | None = None        # (K, vocab) float32 when a graph copies its logits out (FastDecoder.trace)
    # "lora on?" below: a bool on the fused step; on the model's own forward, its adapters' state
    # (lora.forward_state, () when off)
    rope_long: bool = False  # LongRoPE: the tables hold the long factors' (FusedWeights.rotary_for)
    steps: dict = field(default_factory=dict)     # lora on? -> the eager decode step
    compiled: dict = field(default_factory=dict)  # lora on? -> its torch.compile wrapper
    graphs: dict = field(default_factory=dict)    # GraphKey -> replay
    uncompiled: set = field(default_factory=set)  # lora on? values whose graphs run the uncompiled step
    prefills: dict = field(default_factory=dict)  # (padded length, lora on?) -> replay
    #: (padded length, lora on?) of the prompts prefilled eagerly so far: a class's graph is
    #: captured the second time a prompt of it comes (single.FastDecoder._prefill)
    prefills_seen: set = field(default_factory=set)
    pool: Any = None       # the memory pool the prefill graphs share (they never run at once)
    host: list | None = None       # two (pinned K-id buffer, CUDA event) pairs the host reads replays through

    def forget_steps(self) -> None:
        """Drop every step and graph built on this cache (the attention they run changes)."""
        self.steps.clear()
        self.compiled.clear()
        self.graphs.clear()
        self.uncompiled.clear()

    def forget_lora(self) -> None:
        """Drop what was built for the adapters (their buffers are being replaced, or, on the
        model's own forward, their state changed): every entry whose adapter key is not off."""
        for built in (self.steps, self.compiled):
            for key in [k for k in built if k]:
                del built[key]
        for key in [k for k in self.graphs if k.lora]:
            del self.graphs[key]
        self.uncompiled = {k for k in self.uncompiled if not k}
        self.pool = drop(self.prefills, self.pool, lambda k: k[1])  # the pool goes with the last prefill graph


def new_cache(model, fw, length: int, k: int, device) -> Cache:
    """A cache of ``length`` positions with its buffers; ``fw`` (FusedWeights) for the fused step,
    None for the model's own forward over a transformers StaticCache."""
    import torch
    vocab = int(model.config.get_text_config().vocab_size)
    f32 = dict(dtype=torch.float32, device=device)
    i64 = dict(dtype=torch.long, device=device)
    c = Cache(length=length, k=k, tok=torch.zeros((1, 1), **i64), out=torch.zeros((k,), **i64),
              pos=torch.zeros((), **i64), arange=torch.arange(length, device=device),
              prompt=torch.zeros((1, min(MAX_PREFILL, length)), **i64), last=torch.zeros((), **i64),
              first_logits=torch.zeros((1, vocab), **f32), temperature=torch.ones((), **f32),
              top_p=torch.ones((), **f32), penalty=torch.ones((), **f32), min_pos=torch.zeros((), **i64),
              eos_mask=torch.zeros((1, vocab), dtype=torch.bool, device=device),
              seen=torch.zeros((1, vocab), dtype=torch.bool, device=device))
    with torch.inference_mode(False):
        if fw is not None:
            c.keys = [torch.zeros((fw.nkv, length, fw.hd), dtype=fw.dtype, device=device) for _ in fw.layers]
            c.values = [torch.zeros((fw.nkv, length, fw.hd), dtype=fw.dtype, device=device) for _ in fw.layers]
            c.cos, c.sin = fw.rotary(length)
    if fw is None:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer
        c.kv = StaticCache(config=model.config, max_cache_len=length)
        # A sliding-window layer keeps every position too, and its mask keeps it to the window
        # (model_masks): transformers' own sliding layer rolls its window on a count kept on the
        # host, which a captured step replayed at other positions cannot follow.
        c.kv.layers = [StaticLayer(max_cache_len=length) if getattr(layer, "is_sliding", False) else layer
                       for layer in c.kv.layers]
        # Allocate it now: lazy allocation inside a traced or captured region would move it.
        with experts_for_graphs(model):
            model(input_ids=c.tok, attention_mask=model_masks(model, c.arange, c.pos.view(1)),
                  position_ids=c.pos.view(1, 1), past_key_values=c.kv, use_cache=True, logits_to_keep=1)
        c.kv.reset()
    return c


def model_masks(model, arange, positions):
    """The additive attention masks of queries at ``positions`` ((q,) on the device) over a cache
    of ``arange`` positions, for the model's own forward: one (1, 1, q, length) mask, or a mask per
    layer type (``kind_masks``)."""
    keys, queries = arange.view(1, -1), positions.view(-1, 1)
    seen = keys <= queries
    return kind_masks(model, seen.view(1, 1, *seen.shape), (queries - keys).view(1, 1, *seen.shape))


def kind_masks(model, seen, distance):
    """The model's additive attention masks (in its dtype: sdpa takes them as they are) from
    ``seen`` (bool: a query may attend to a key) and ``distance`` (the query's position minus the
    key's), both (rows, 1, queries, keys): one mask, or a mask per layer type ({"full_attention":
    …, "sliding_attention": …}, as transformers' hybrid models take them) when the model has
    layers of both kinds, a sliding layer's keys kept to its window."""
    import torch
    cfg = model.config.get_text_config()
    window = cfg.sliding_window if "sliding_attention" in layer_kinds(cfg) else None
    types = sorted(set(getattr(cfg, "layer_types", None) or layer_kinds(cfg)))
    zero = torch.zeros((), dtype=model.dtype, device=seen.device)
    neg = torch.full((), torch.finfo(model.dtype).min, dtype=model.dtype, device=seen.device)
    masks = {t: torch.where(seen & (distance < window) if t == "sliding_attention" and window else seen, zero, neg)
             for t in types}
    return masks if len(masks) > 1 else masks[types[0]]


def set_request(c: Cache, prompt_ids, sampling, vocab: int) -> None:
    """Write one request's values into the buffers its graphs read."""
    n = int(prompt_ids.shape[-1])
    c.temperature.fill_(max(sampling.temperature, 1e-5))
    c.top_p.fill_(sampling.top_p)
    c.penalty.fill_(sampling.repetition_penalty)
    c.min_pos.fill_(sampling.eos_allowed_from(n))
    c.eos_mask.zero_()
    eos = [e for e in sampling.eos if 0 <= e < vocab]
    if eos:
        c.eos_mask[0, eos] = True
    c.seen.zero_()
    if sampling.repetition_penalty != 1.0:
        c.seen[0].index_fill_(0, prompt_ids.view(-1), True)
    c.pos.fill_(n)


def model_prefill(model, c: Cache, input_ids):
    """The prompt ((1, n) ids) through the model's own forward into the cache's ``StaticCache``
    from position 0, with the decode step's masks; returns its last position's (1, vocab) float logits."""
    at = c.arange[:input_ids.shape[-1]]
    out = model(input_ids=input_ids, attention_mask=model_masks(model, c.arange, at), position_ids=at.view(1, -1),
                past_key_values=c.kv, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :].float()


def model_step(model, c: Cache, device, grouped: bool = False, compiler: Callable | None = None) -> Callable:
    """The model's own forward over the cache's ``StaticCache`` as the decode step (architectures
    the fused step does not cover): ``step(tok)`` → the (1, vocab) float logits. ``grouped``: a
    mixture of experts' experts on nvkit's grouped kernel (``experts``). ``compiler``: applied to
    the forward alone (``torch.compile``); the switch of a mixture's experts implementation stays
    outside what is compiled, as in ``model_rows.model_rows_step`` (transformers' switch walks the
    model's modules and compares config classes, which Dynamo failed to trace on a GPU)."""
    layer0 = c.kv.layers[0]

    def forward(tok):
        # The position lives on the device (the cache's own counter), so the graph needs no host input.
        pos = layer0.cumulative_length
        out = model(input_ids=tok, attention_mask=model_masks(model, c.arange, pos.view(1)),
                    position_ids=pos.view(1, 1), past_key_values=c.kv, use_cache=True, logits_to_keep=1)
        c.pos.add_(1)
        return out.logits[:, -1, :].float()
    run = forward if compiler is None else compiler(forward)

    def step(tok):
        with experts_for_graphs(model, grouped=grouped):
            return run(tok)
    return step


@contextlib.contextmanager
def experts_for_graphs(model, rows: int | None = None, grouped: bool = False):
    """A mixture-of-experts model's experts on the implementation a captured decode step runs
    (``experts.implementation_for``: ``rows`` its row count, None for the batch-1 step; ``grouped``
    where it runs nvkit's kernels) for the call, its own setting put back after. Its default,
    "grouped_mm", copies between host and device (a CUDA graph capture refuses that copy). Only
    for the one-token decode steps: "batched_mm" gathers the experts' weights per token, which a
    prompt of many tokens could not afford (the prefill keeps the model's own setting)."""
    cfg = model.config
    current = getattr(cfg, "_experts_implementation", None)
    can_set = getattr(type(model), "_can_set_experts_implementation", None)
    if current != "grouped_mm" or can_set is None or not can_set():
        yield
        return
    try:
        model.set_experts_implementation(experts_mod.implementation_for(cfg.get_text_config(), rows, grouped))
    except (ValueError, ImportError):  # a transformers without it: the capture says why it failed
        yield
        return
    try:
        yield
    finally:
        model.set_experts_implementation(current)
