"""``ModelRowsDecoder``: lists on the rows path for the families nvkit's fused step does not cover
(Starcoder2, Cohere 2, GPT-2, the mixtures of experts, any model with ``fused=False``): the model's own
forward as the rows step, over the same paged KV pool, ladder of graphs, scheduler, refill and
sampling as ``rows.BatchedDecoder``. A mixture of experts' step runs every expert on every row
from a few rows up (``experts``), where transformers' gathered experts would copy weights per row,
or its experts on nvkit's grouped kernel where the step runs nvkit's kernels (``StepVariant.experts``).

Why: without it such a list runs padded ``generate``, a forward per token issued op by op, at
about the speed of one prompt per step. The rows path's gain is in what surrounds the step (one
graph replay per K steps, every row at its own position, finished rows refilled at once), so the
model's forward can be the step as it is, the way the batch-1 path runs these families.

How the forward reads the pool: for the decode step the model's attention function is set to
``paged_rows_attention`` (registered with transformers' attention functions), which hands the
query and the new key and value the forward made to nvkit's paged kernel (identity rotary tables:
the forward has rotated them): it writes the key and value through the row's page table and each
row reads its own positions only, as the fused rows step's "paged" attention does. Where that
kernel does not fit (``paged_rows_why``: attention sinks, a head size not a power of two, no GPU)
or ``attention="matmul"``, ``PagedRows``, a transformers ``Cache``, writes each new key and value
at the row's pool index and hands the attention each row's positions gathered through its page
table, masked per row at its position (and to the window on a sliding layer). A prompt group is prefilled left-aligned to its last
column, so that the logits the step keeps (the last position's) are every row's own last token's.
LoRA adapters run in PEFT's own layers inside the forward, as on the batch-1 path: a graph bakes
in the adapters' state (``lora.forward_state``), so each state has graphs of its own, and a new
state drops the older one's. The step starts uncompiled and compiles under the rows path's rule
(once the session has decoded a while, each rung measured and kept compiled only where faster):
the forward compiled whole, once for every rung and pool. The prompts' prefill stays eager.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from ...errors import NvkitError
from ...memory.estimate import attention_dims
from . import lora as lora_mod, prefill_rows
from .compile_policy import compile_fullgraph
from .llama_rows_step import paged_positions
from .paged_cache import PAGE
from .fused_fit import layer_kinds
from .rows import BatchedDecoder
from .runner import triton_cannot_run_on
from .schedule import SCRATCH
from .single import FastDecoder
from .static_cache import experts_for_graphs, kind_masks


class PoolShape:
    """What the pool, its buffers and the prefill's budget read of a model without fused weights
    (as of ``FusedWeights``: ``paged_cache.new_arena``, ``BatchedDecoder.prefill_tokens_for``): the
    heads, head size, dtype, embedding, MLP width and a layer count; the rotary tables are the
    model's own business (its forward computes them from the positions), so the arena's are a
    placeholder."""

    def __init__(self, model):
        cfg = model.config.get_text_config()
        self.nh, self.nkv, self.hd = attention_dims(cfg)
        self.dtype = model.dtype
        self.embed = model.get_input_embeddings().weight
        self.layers = range(int(cfg.num_hidden_layers))
        self.intermediate = int(getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size)

    def rotary(self, length: int):
        import torch
        z = torch.zeros((1, self.hd), dtype=self.dtype, device=self.embed.device)
        return z, z

    def rotary_for(self, holder, longest_prompt: int) -> None:
        """Nothing: the model's forward rotates by its own positions (``FusedWeights.rotary_for``
        picks a LongRoPE model's tables for the fused step)."""


def _paged_rows(layers: int):
    """A transformers ``Cache`` of ``layers`` layers over the pool named by its ``at`` (``_Where``),
    set before each forward and cleared after it, so that the cache holds no pool between calls
    (a replaced pool is freed before its successor is allocated)."""
    from transformers.cache_utils import Cache

    class PagedRowsLayer:
        """One layer's keys and values in the pool: ``update`` writes the new ones at ``at.here``
        (decode: (rows,) pool indices) or ``at.where`` (prefill: (rows, length)), and returns what
        the attention reads: each row's positions gathered through its table (decode), or the
        prompt's own keys and values (prefill: a prompt starts at position 0). With the paged
        attention (``at.paged``) a decode step's new keys and values pass through unwritten: the
        kernel writes them and reads the pool itself (``paged_rows_attention``). transformers'
        ``CacheLayerMixin`` in what the forward calls, not by inheritance: torch.compile cannot
        build an instance of that abstract class inside the step it compiles."""

        is_compileable = False
        is_sliding = False
        is_initialized = True

        def __init__(self, idx: int, at: "_Where"):
            self.idx, self.at = idx, at

        def update(self, key_states, value_states, *args, **kwargs):
            at, i = self.at, self.idx
            keys, values = at.keys[i], at.values[i]
            rows, nkv, length, hd = key_states.shape
            if at.decode and at.paged:  # the paged kernel writes them and reads the pool itself
                return key_states, value_states
            if at.decode:
                keys.index_copy_(0, at.here, key_states[:, :, 0])
                values.index_copy_(0, at.here, value_states[:, :, 0])
                return keys[at.where].transpose(1, 2), values[at.where].transpose(1, 2)
            flat = at.where.reshape(-1)
            keys.index_copy_(0, flat, key_states.transpose(1, 2).reshape(-1, nkv, hd))
            values.index_copy_(0, flat, value_states.transpose(1, 2).reshape(-1, nkv, hd))
            return key_states, value_states

        def get_seq_length(self) -> int:
            return 0

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return query_length, 0

        def get_max_length(self) -> int:
            return -1

    class PagedRows(Cache):
        def __init__(self):
            self.at = _Where()
            super().__init__(layers=[PagedRowsLayer(i, self.at) for i in range(layers)])

    return PagedRows()


class _Where:
    """Where the layers of one forward write and read: the pool's tensors and each row's indices
    (``where``/``here``), or, for the paged attention (``paged``), each row's position and page
    table, identity rotary tables (the model's forward has rotated q and k) and each layer's window."""
    decode = True
    paged = False
    keys = values = where = here = pos = table = cos = sin = None
    windows: list = []

    @contextlib.contextmanager
    def pool(self, keys, values, where, here=None, decode: bool = True, paged: tuple | None = None):
        """``paged``: (pos, table, cos, sin) for the paged attention's decode step."""
        self.keys, self.values, self.where, self.here, self.decode = keys, values, where, here, decode
        self.paged = paged is not None
        if paged is not None:
            self.pos, self.table, self.cos, self.sin = paged
        try:
            yield
        finally:
            self.keys = self.values = self.where = self.here = self.pos = self.table = self.cos = self.sin = None
            self.paged = False


ATTENTION = "nvkit_paged_rows"
_registered: list[bool] = []


def paged_rows_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                         nvkit_rows: _Where | None = None, **kwargs):
    """transformers' attention-function signature (registered as ``ATTENTION``), for the rows
    decode step's one new token per row: ``query`` (rows, heads, 1, head_dim) and the new ``key``
    and ``value`` (rows, KV heads, 1, head_dim), already normed and rotated by the model's forward,
    go to nvkit's paged kernel with identity rotary tables, which writes the new key and value
    through each row's page table and attends over the row's own positions only (its window on a
    sliding layer). Returns (rows, 1, heads, head_dim) as transformers' attention functions do."""
    import torch
    from ..kernels.paged_attention import paged_decode_attention
    at = nvkit_rows
    if at is None or not at.paged or query.shape[2] != 1:
        raise NvkitError(f"{ATTENTION} runs only inside nvkit's rows decode step (one new token per row).")
    if kwargs.get("s_aux") is not None or (dropout and module.training):
        raise NvkitError(f"{ATTENTION} has no attention sinks and no dropout (paged_rows_why refuses such models).")
    rows, nh, _, hd = query.shape
    qkv = torch.cat((query[:, :, 0], key[:, :, 0], value[:, :, 0]), dim=1)
    i = module.layer_idx
    scale = float(scaling) if scaling is not None else hd ** -0.5
    o = paged_decode_attention(qkv, None, None, at.cos, at.sin, at.keys[i], at.values[i], at.pos, at.table, PAGE,
                               scale, 0.0, 0, at.windows[i], float(softcap or 0.0))
    return o.view(rows, 1, nh, hd), None


def paged_rows_why(model) -> str | None:
    """Why the rows step over this model's forward cannot attend through nvkit's paged kernel
    (None: it can): transformers must let the model's attention function be set (``ATTENTION``),
    every attention module must know its layer, and the kernel takes power-of-two heads, no
    attention sinks (gpt-oss) and no other score terms."""
    from ..kernels.common import next_pow2
    _, _, hd = attention_dims(model.config.get_text_config())
    if next_pow2(hd) != hd:
        return f"its head_dim ({hd}) is not a power of two"
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is None or not can_set():
        return "transformers cannot set its attention function"
    attns = [m for name, m in model.named_modules() if name.endswith("self_attn")]
    if not attns or any(getattr(m, "layer_idx", None) is None for m in attns):
        return "its attention modules do not say their layer"
    if any(getattr(m, "sinks", None) is not None for m in attns):
        return "its attention has sinks"
    return None if _register() else "this transformers has no attention registry"


def _register() -> bool:
    """Register ``ATTENTION`` with transformers' attention functions (once); False where this
    transformers has no such registry."""
    if not _registered:
        try:
            from transformers import AttentionInterface
            AttentionInterface.register(ATTENTION, paged_rows_attention)
            _registered.append(True)
        except (ImportError, AttributeError):
            _registered.append(False)
    return _registered[0]


@contextlib.contextmanager
def attention_for_rows(model, paged: bool):
    """The model's attention function set to ``ATTENTION`` for the call (``paged``), its own put
    back after: only the rows decode step runs it, the prompts' prefill keeps the model's own."""
    if not paged or not _register():
        yield
        return
    own = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation(own)


def model_rows_step(model, compiler: Callable | None = None, grouped: bool = False, paged: bool = False) -> Callable:
    """``step(tok, pos, table, cos, sin, keys, values)`` -> (rows, vocab) float logits, as
    ``llama_rows_step.decode_rows_step``, through the model's own forward (``cos``/``sin`` unused).

    ``compiler``: applied to the forward (``torch.compile``); the step around it makes each row's
    pool indices and masks and points the cache at the pool, outside what is compiled (torch's
    compiler cannot build the cache objects inside the function it traces, and the step is captured
    in a graph anyway). The sizes that change from one rung or pool to the next are marked dynamic,
    so one compile serves them all (a row count of 1 is still specialised). ``grouped``: a mixture
    of experts' experts on nvkit's grouped kernel (``experts.implementation_for``). ``paged``: the
    attention through nvkit's paged kernel (``paged_rows_attention``: each row reads its own
    positions) instead of each row's positions gathered up to the table's width."""
    import torch
    cfg = model.config.get_text_config()
    cache = _paged_rows(int(cfg.num_hidden_layers))
    window = int(getattr(cfg, "sliding_window", None) or 0)
    cache.at.windows = [window if kind == "sliding_attention" else 0 for kind in layer_kinds(cfg)]
    identity: dict = {}  # (positions, dtype) -> rotary tables that rotate nothing (made before capture)

    def forward(tok, pos, mask, cache):
        extra = {"nvkit_rows": cache.at} if paged else {}
        out = model(input_ids=tok.unsqueeze(1), position_ids=pos.unsqueeze(1), attention_mask=mask,
                    past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
        return out.logits[:, -1].float()
    run = forward if compiler is None else compiler(forward)

    def step(tok, pos, table, cos, sin, keys, values):
        length = table.shape[1] * PAGE
        distance = (pos.unsqueeze(1) - torch.arange(length, device=pos.device)).view(-1, 1, 1, length)
        mask = kind_masks(model, distance >= 0, distance)
        where = here = tables = None
        if paged:
            k = (length, keys[0].dtype)
            if k not in identity:
                identity.clear()
                identity[k] = (torch.ones((length, 2), dtype=k[1], device=pos.device),
                               torch.zeros((length, 2), dtype=k[1], device=pos.device))
            tables = (pos, table, *identity[k])
        else:
            where = paged_positions(table, PAGE, length)              # (rows, length) pool indices
            here = where.gather(1, pos.unsqueeze(1)).squeeze(1)       # (rows,) each row's new position
        if compiler is not None:
            mark = torch._dynamo.maybe_mark_dynamic
            for t in (tok, pos, here, *keys, *values, *(tables[2:] if paged else ())):
                if t is not None:
                    mark(t, 0)
            for t in (where, table if paged else None, *(mask.values() if isinstance(mask, dict) else [mask])):
                if t is not None:
                    mark(t, 0)
                    mark(t, t.dim() - 1)
        with experts_for_graphs(model, rows=int(tok.shape[0]), grouped=grouped), attention_for_rows(model, paged), \
                cache.at.pool(keys, values, where, here, paged=tables):
            return run(tok, pos, mask, cache)
    return step


def model_rows_prefill(model) -> Callable:
    """``prefill(ids, last, where, cos, sin, keys, values)`` -> (rows, vocab) float logits of each
    row's last prompt token, as ``llama_rows_step.prefill_rows_step`` takes its arguments (each
    prompt padded at its end). The forward runs each row shifted right so its prompt ends in the
    last column (the padding first, masked out, its keys into the row's own later positions or the
    scratch page), so that one logits row per prompt is computed."""
    import torch
    cache = _paged_rows(int(model.config.get_text_config().num_hidden_layers))

    def prefill(ids, last, where, cos, sin, keys, values):
        rows, length = ids.shape
        cols = torch.arange(length, device=ids.device)
        shift = (length - 1 - last).unsqueeze(1)                       # (rows, 1) padding before the prompt
        src = (cols.unsqueeze(0) - shift) % length                     # column j holds the prompt's j - shift
        position = (cols.unsqueeze(0) - shift).clamp(min=0)
        real = cols.unsqueeze(0) >= shift                              # (rows, length): a prompt column
        distance = (cols.view(-1, 1) - cols.view(1, -1)).view(1, 1, length, length)  # query column - key column
        seen = (distance >= 0) & real.view(rows, 1, 1, length) | (distance == 0)  # padding sees itself
        mask = kind_masks(model, seen, distance)
        with cache.at.pool(keys, values, where.gather(1, src), decode=False):
            out = model(input_ids=ids.gather(1, src), position_ids=position, attention_mask=mask,
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float()
    return prefill


class ModelRowsDecoder(BatchedDecoder):
    """``BatchedDecoder`` with the model's own forward as its step (see the module docstring)."""

    def _fits(self, single: FastDecoder) -> None:
        if single.fused:
            raise NvkitError("ModelRowsDecoder is for models without nvkit's fused step: use BatchedDecoder.")

    def _choose_attention(self, asked: str) -> tuple[str, str | None]:
        """("paged" | "matmul", why "auto" did not take the kernel): the paged kernel where it
        fits (``paged_rows_why``), else each row's positions gathered up to the table's width
        (``asked``: "auto" or "matmul", as the batch-1 decoder over a model's forward takes them)."""
        if asked == "matmul":
            return "matmul", None
        why = triton_cannot_run_on(self.device) or paged_rows_why(self.model)
        return ("paged", None) if why is None else ("matmul", why)

    def describe(self) -> str:
        cls = (self._last, max(self.last_batches)) if self.last_batches and self._fw is not None else None
        how = (self._how(False, kind=cls, tokens_per_replay=self.k * cls[1]) if cls in self._kept
               else self._how(False))
        parts = ["model forward over rows, " + how, f"{self.attention} attention"]
        if self._fw is not None and self._adapters:
            parts.append("LoRA in PEFT's own layers")
        if self.last_batches:
            parts.append("batch " + "/".join(str(b) for b in sorted(self.last_batches, reverse=True)))
        parts.append(f"{self.k} steps per replay")
        return ", ".join(parts)

    def _adopt(self) -> int:
        """The pool's shape, and the adapters' state as a small key (0: no adapter changes the
        output), its graphs kept apart from every other state's."""
        if self._fw is None:
            self._fw = PoolShape(self.model)
            self._states: dict = {(): 0}
        state = lora_mod.forward_state(self.model)
        if state not in self._states:
            for old in [v for v in self._states.values() if v]:  # the older adapters' graphs never replay again
                self._forget_steps(old)
            self._states = {(): 0, state: max(self._states.values()) + 1}
        self._adapters = bool(state)  # the stats line says what the last request ran
        self._last = self._states[state]
        return self._last

    def _compiled_step(self, lora_on: int):
        """The forward compiled whole (inductor fuses the model's small kernels), for every rung and
        pool at once; kept per rung only where it measures faster (``BatchedDecoder._graph``)."""
        if lora_on not in self._compiled:
            self._compiled[lora_on] = model_rows_step(self.model, compile_fullgraph, paged=self.attention == "paged")
        return self._compiled[lora_on], True

    def _disk_key(self, lora_on: int, part: str = "step") -> str | None:
        return self.disk_key(None, batched=True, page=PAGE, forward="model", adapters=bool(lora_on), part=part)

    def _step(self, lora_on: bool) -> Callable:
        if lora_on not in self._steps:
            self._steps[lora_on] = model_rows_step(self.model, grouped=self.kernels, paged=self.attention == "paged")
        return self._steps[lora_on]

    def _prefill_fn(self, lora_on: bool) -> Callable:
        if lora_on not in self._prefills:
            self._prefills[lora_on] = prefill_rows.RowsPrefill(model_rows_prefill(self.model), compile=False, page=PAGE,
                                                               scratch=SCRATCH, timings=self.timings)
        return self._prefills[lora_on]
