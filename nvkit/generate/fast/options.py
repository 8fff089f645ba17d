"""How the fast path is built: one frozen ``FastOptions``, read from the ``NVKIT_FAST_*``
environment variables once per process (``default_options``) and overridable per decoder.

Each variable maps to one field; a value nvkit cannot read is an ``NvkitError`` that names the
variable, raised when the fast path is first used rather than silently replaced by a default.
These are what a user may need to set; how the step is compiled (by layer or whole, tuning, PDL,
inductor settings) is fixed for users and varied only by the decode benchmark, through
``runner.StepVariant``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ...checks import env_flag, env_int, env_number, env_set, number
from ...errors import NvkitError

#: the fused step's attention kinds ("auto": triton-fused where it fits, see ``FastDecoder``)
ATTENTION_KINDS = ("matmul", "triton-split", "triton-fused")
DEFAULT_ATTENTION = "auto"
#: the smallest KV-cache size class, in tokens: one capture serves every request that fits in it
DEFAULT_CACHE_TOKENS = 4096
#: with ``lora_fold``: the adapter rank per projection the fused weights keep spare rows for
#: (nvkit.finetune's default rank; a larger one runs its products apart)
FOLD_RANK = 16



@dataclass(frozen=True)
class FastOptions:
    """The fast path's settings.

    - ``k_steps``: decode steps per CUDA-graph replay. More steps mean fewer host wake-ups; the
      host reads a chunk of K ids at a time, so streaming moves in chunks of K tokens.
    - ``compile``: fuse the decode step with inductor (the uncompiled step is captured when
      compiling fails); when, ``compile_after`` says.
    - ``compile_after``: seconds a decoder decodes on its uncompiled step (nvkit's Triton kernels
      for the norms, the activation and the adapters' products, captured in seconds) before a request of ``min_tokens``
      or more compiles it. A cold compile costs more than a notebook's first few answers take on
      the uncompiled step, and the compiled one decodes faster only by a fraction, so the compile
      waits until the decoding it speeds up has shown it will pay. 0: compile at the first
      request. ``fast.prepare`` compiles at once.
    - ``llama_step``: nvkit's own decode step for the Llama family (None: where the model fits it).
    - ``attention``: the fused step's attention, one of ``ATTENTION_KINDS`` or "auto".
    - ``min_tokens``: with ``fast=None`` and nothing captured yet, requests of at least this many
      new tokens pay the one-time capture themselves; a shorter one runs plain ``generate`` unless
      the capture is expected to answer it sooner (``first_request``).
    - ``cache_tokens``: the smallest KV-cache size class; a request that needs more doubles it.
    - ``disk_cache``: keep compile artifacts under nvkit's cache folder so a new process captures
      in seconds.
    - ``lora_fold``: the fused weights keep spare rows for adapters up to ``FOLD_RANK`` per
      projection, and the batch-1 step computes each group's base product and its adapters' first
      product in one reduction (one kernel fewer per group of projections with an adapter on),
      which on the GPU decodes faster with an adapter than the products apart
      (docs/benchmarks.md). False keeps them apart.
    - ``prefill_after``: seconds of host time the batched path's prompt prefill runs eagerly in a
      decoder before it is compiled (0: compiled at the first list). A list's first call already
      compiles the rows' decode step; compiling the prefill with it would make that wait much
      longer to save tenths of a second per list, so it waits until the eager prefill has cost
      about what the compile costs (then the eager calls never cost more than compiling at the
      first list would have). Compile artifacts on disk are read when it compiles; they shorten
      the compile by a part only (the layer is still traced and its kernels loaded), so they do
      not bring it forward: a new session's first list would wait for it.
    """
    k_steps: int = 8
    compile: bool = True
    fused: bool | None = None
    attention: str = DEFAULT_ATTENTION
    min_tokens: int = 128
    cache_tokens: int = DEFAULT_CACHE_TOKENS
    disk_cache: bool = True
    lora_fold: bool = True
    prefill_after: float = 10.0
    compile_after: float = 30.0

    def __post_init__(self):
        def whole(name, lo, hi=None):
            v = getattr(self, name)
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
            if not ok:
                raise NvkitError(f"{name} must be a whole number from {lo}{f' to {hi}' if hi else ' up'}, not {v!r}.")
        whole("k_steps", 1, 64)
        whole("min_tokens", 0)
        whole("cache_tokens", 16)
        if self.cache_tokens & (self.cache_tokens - 1):
            raise NvkitError(f"cache_tokens must be a power of two (the size classes double), not {self.cache_tokens}.")
        for name in ("compile", "disk_cache", "lora_fold"):
            if not isinstance(getattr(self, name), bool):
                raise NvkitError(f"{name} must be True or False, not {getattr(self, name)!r}.")
        object.__setattr__(self, "prefill_after", number("prefill_after", self.prefill_after, 0))
        object.__setattr__(self, "compile_after", number("compile_after", self.compile_after, 0))
        if self.fused not in (None, True, False):
            raise NvkitError(f"fused must be True, False or None (where it fits), not {self.fused!r}.")
        if self.attention == "triton":
            raise NvkitError("attention='triton' named two kernels; say which: 'triton-fused' (the one 'auto' picks "
                             "at batch 1) or 'triton-split' (the split-cache kernel, kept for comparisons). Lists "
                             "run the paged kernel with either.")
        if self.attention not in ATTENTION_KINDS + ("auto",):
            raise NvkitError(f"attention must be one of {', '.join(map(repr, ATTENTION_KINDS + ('auto',)))}, "
                             f"not {self.attention!r}.")

    def replace(self, **changes) -> "FastOptions":
        """A copy with ``changes`` (None values are left out: "keep what it is")."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise NvkitError(f"Unknown fast-path option(s) {unknown}: use {', '.join(f.name for f in dataclasses.fields(self))}.")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "FastOptions":
        """The options the ``NVKIT_FAST_*`` variables of ``environ`` (default: this process's) ask for;
        a value nvkit cannot read is an NvkitError naming its variable."""
        kw: dict[str, Any] = {var_name: parse(var, environ) for var, (var_name, parse) in _VARIABLES.items()
                              if env_set(var, environ)}
        try:
            return cls(**kw)
        except NvkitError as e:
            names = {name: var for var, (name, _) in _VARIABLES.items()}
            bad = next((names[k] for k in kw if str(e).startswith(k)), "an NVKIT_FAST_* variable")
            raise NvkitError(f"{bad}: {e} Unset it or fix it, then restart the kernel.") from None


def _whole(lo: int, hi: int | None = None):
    return lambda var, environ: env_int(var, lo, lo, hi, environ=environ)


def _number(lo: float):
    # read only when the variable is set, so no default is needed here
    return lambda var, environ: env_number(var, lo, lo, environ=environ)


def _flag(var: str, environ) -> bool:
    return env_flag(var, True, environ=environ)


def _flag_or_auto(var: str, environ) -> bool | None:
    # "1" keeps the default (on where it fits); only "0" forces it off
    return None if _flag(var, environ) else False


def _text(var: str, environ) -> str:
    return (os.environ if environ is None else environ)[var].strip()


_VARIABLES = {
    "NVKIT_FAST_K": ("k_steps", _whole(1, 64)),
    "NVKIT_FAST_COMPILE": ("compile", _flag),
    "NVKIT_FAST_FUSED": ("fused", _flag_or_auto),
    "NVKIT_FAST_ATTENTION": ("attention", _text),
    "NVKIT_FAST_MIN_TOKENS": ("min_tokens", _whole(0)),
    "NVKIT_FAST_CACHE_TOKENS": ("cache_tokens", _whole(1)),
    "NVKIT_FAST_DISK_CACHE": ("disk_cache", _flag),
    "NVKIT_FAST_LORA_FOLD": ("lora_fold", _flag),
    "NVKIT_FAST_PREFILL_AFTER": ("prefill_after", _number(0)),
    "NVKIT_FAST_COMPILE_AFTER": ("compile_after", _number(0)),
}
ENVIRONMENT_VARIABLES = tuple(_VARIABLES)

_lock = threading.Lock()
_default: FastOptions | None = None


def default_options() -> FastOptions:
    """The process's options, read from the environment on first use and kept (a change of the
    variables afterwards takes effect in a new kernel)."""
    global _default
    with _lock:
        if _default is None:
            _default = FastOptions.from_env()
        return _default
