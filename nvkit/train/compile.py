"""Compiling the decoder layers of a fine-tune: regional ``torch.compile`` under an
activation-memory budget.

Each decoder layer's forward is compiled; the layers share code, so dynamo compiles it once per
shape and every layer reuses it. With an activation-memory budget (``ACTIVATION_BUDGET``) torch's
partitioner keeps only part of what the backward needs and recomputes the cheapest rest:
selective checkpointing chosen by the compiler, most of full checkpointing's memory saving at a
few per cent of its cost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os

from .. import cache
from .loss import causal_lm

_log = logging.getLogger("nvkit.compile")

#: Share of the saved activations the compiled layers may keep (torch's AOT partitioner
#: recomputes the cheapest rest in the backward); ``nvkit bench --lora`` measures the trade.
ACTIVATION_BUDGET = 0.5


def activation_budget(enabled: bool):
    """Context in which compiled layers are partitioned under ``ACTIVATION_BUDGET`` (compilation
    happens at the first step, inside ``trainer.train()``, so the whole call is wrapped)."""
    if not enabled:
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config
    return functorch_config.patch(activation_memory_budget=ACTIVATION_BUDGET)


def decoder_layers(model) -> list:
    dec = causal_lm(model).get_decoder()
    layers = getattr(dec, "layers", None)
    return list(layers) if layers is not None else []


def compile_layers(model) -> int:
    """Regional compilation of every decoder layer; returns how many."""
    import torch
    layers = decoder_layers(model)
    # identical layers differ only in parameters; with one graph per layer the cache would overflow
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 2 * len(layers) + 8)
    for layer in layers:
        layer.compile(dynamic=False)
    return len(layers)


def uncompile_layers(model) -> None:
    for layer in decoder_layers(model):
        if getattr(layer, "_compiled_call_impl", None) is not None:
            layer._compiled_call_impl = None


def eager():
    """Context in which compiled code runs eagerly (evaluation passes mid-run: a no-grad forward
    would otherwise compile a second graph for a few batches)."""
    import torch
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


# --- when to compile -------------------------------------------------------------------------------

#: Compiling costs a fixed time at the first step (dynamo traces one layer, inductor generates and
#: builds its kernels) and then makes every step faster; it pays back only after enough steps. A
#: warm cache (the artifacts a previous run of the same shape saved, see CompileCache) skips most of
#: the code generation, so it pays back sooner. The short-run rows of ``nvkit bench --lora``
#: (``nvkit.benchmarks.lora.short_runs``) measure both break-even points on a GPU.
COMPILE_MIN_STEPS_COLD = 300
COMPILE_MIN_STEPS_WARM = 60


def compile_decision(compile, device_type: str, total_steps: int, cache_warm: bool) -> tuple[bool, str]:
    """(compile the decoder layers?, why) for ``compile`` = True/False/'auto'."""
    if compile is True:
        return True, "on (compile=True)"
    if compile is False:
        return False, "off (compile=False)"
    if device_type != "cuda":
        return False, "off: the model is on the CPU (compiled layers pay back on CUDA GPUs)"
    if total_steps >= COMPILE_MIN_STEPS_COLD:
        return True, (f"on: {total_steps} steps ≥ {COMPILE_MIN_STEPS_COLD}, enough to pay back compiling"
                      + (" (compile cache warm)" if cache_warm else ""))
    if cache_warm and total_steps >= COMPILE_MIN_STEPS_WARM:
        return True, (f"on: the compile cache is warm for this model and settings and {total_steps} steps ≥ "
                      f"{COMPILE_MIN_STEPS_WARM} pay back loading it")
    need = COMPILE_MIN_STEPS_WARM if cache_warm else COMPILE_MIN_STEPS_COLD
    return False, (f"off: a short run ({total_steps} steps) ends sooner uncompiled; compiling pays back from {need} "
                   f"steps ({'the cache is warm' if cache_warm else f'{COMPILE_MIN_STEPS_WARM} once the cache is warm'}). "
                   "compile=True compiles anyway (less activation memory).")


# --- the compile cache -----------------------------------------------------------------------------

_WHAT = "compile caches"
_LIMIT = 1 << 34   # far above any real blob; only a planted giant is refused


def _cache_root() -> str:
    return str(cache.root() / "compile")


class CompileCache:
    """The compiled layers' artifacts of one model shape and training setup, kept under nvkit's
    cache folder (``$NVKIT_CACHE/compile``, default ``~/.cache/nvkit/compile``) with
    ``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts`` (inductor's FX graph and
    AOTAutograd caches in one blob). The key holds everything that changes the compiled code:
    the model config, dtype, LoRA settings, batch shape, activation budget, GPU capability and the
    torch/transformers/peft versions. The folder is 0700 and the files 0600, written through a
    temporary file and renamed. The artifacts hold pickles, so a file is loaded only under
    :mod:`nvkit.cache`'s rule (a folder and a file of this user that no one else can write,
    never through a link); anything else, or an unreadable file, is a cold compile."""

    def __init__(self, facts: dict, root: str | None = None):
        blob = json.dumps(facts, sort_keys=True, default=str).encode()
        self.key = hashlib.sha256(blob).hexdigest()[:24]
        self._own = root is None   # nvkit's own folder under NVKIT_CACHE, else one the caller named
        self.root = root or _cache_root()
        self.path = os.path.join(self.root, f"lora-{self.key}.bin")

    @staticmethod
    def facts(model, *, dtype, lora: dict, batch_size: int, seq_len: int, gradient_checkpointing: bool,
              kbit: bool, capability) -> dict:
        import peft
        import torch
        import transformers
        cfg = causal_lm(model).config.to_dict()
        cfg.pop("_name_or_path", None)
        return {"config": cfg, "dtype": str(dtype), "lora": lora, "batch_size": batch_size, "seq_len": seq_len,
                "gradient_checkpointing": gradient_checkpointing, "kbit": kbit, "capability": capability,
                "budget": ACTIVATION_BUDGET, "torch": torch.__version__, "transformers": transformers.__version__,
                "peft": peft.__version__}

    def _usable_root(self) -> bool:
        try:
            if self._own:
                cache.own_dir("compile")
            else:
                os.makedirs(os.path.dirname(os.path.abspath(self.root)), exist_ok=True)
                cache.private_dir(self.root)
        except OSError:
            return False
        return True

    @property
    def warm(self) -> bool:
        return cache.trusted_file(self.path, _WHAT) is not None

    def load(self) -> str:
        """Load the artifacts into this process's compile caches; returns what happened."""
        blob = cache.read_trusted_bytes(self.path, _WHAT, limit=_LIMIT)
        if blob is None:  # none, or not one this user wrote (nvkit.cache said why)
            return "cold (no saved artifacts)"
        import torch
        # torch logs a corrupt blob with a traceback; nvkit says it in one line of its own instead
        torch_log = logging.getLogger("torch.compiler._cache")
        level = torch_log.level
        torch_log.setLevel(logging.CRITICAL)
        try:
            loaded = torch.compiler.load_cache_artifacts(blob)
        except Exception as e:  # noqa: BLE001 - a bad cache file costs a cold compile, never the run
            loaded, why = None, f"{type(e).__name__}: {e}"
        else:
            why = "not artifacts of this torch"
        finally:
            torch_log.setLevel(level)
        if loaded is None:
            _log.warning("nvkit: ignoring the unreadable compile cache %s (%s)", self.path, why)
            return "cold (the saved artifacts could not be loaded)"
        return f"warm (loaded {len(blob) / 2**20:.1f} MiB of compiled artifacts)"

    def save(self) -> str:
        """Save this process's compile artifacts under the key; returns what happened."""
        import torch
        try:
            got = torch.compiler.save_cache_artifacts()
        except Exception as e:  # noqa: BLE001 - see load
            return f"not saved ({type(e).__name__}: {e})"
        if not got or not got[0]:
            return "not saved (nothing was compiled)"
        if not self._usable_root():
            return f"not saved ({self.root} is not a folder nvkit can write)"
        blob = got[0]
        try:
            cache.write_atomic(self.path, blob)
        except OSError as e:
            return f"not saved ({e})"
        return f"saved ({len(blob) / 2**20:.1f} MiB) for the next run"
