"""LoRA adapters on the session's model: load one from disk, merge it into the weights, remove it.

``Session.load_adapter/merge_adapter/unload_adapter`` call these. The session's ``.model`` becomes
the PEFT model while an adapter is on (generation goes through it unchanged), and the plain
transformers model again after a merge or an unload.
"""

from __future__ import annotations

import json
import os

from .. import events
from ..errors import NvkitError, require
from ..quiet import routed


def _check_adapter_dir(adapter_dir) -> str:
    require(isinstance(adapter_dir, (str, os.PathLike)) and str(adapter_dir).strip(),
            f"adapter_dir must be a directory path, not {adapter_dir!r}.")
    d = os.path.abspath(os.path.expanduser(os.fspath(adapter_dir)))
    if not os.path.isdir(d):
        raise NvkitError(f"No adapter directory at {d}. Give the directory a fine-tune wrote (run.adapter_dir) "
                         "or one holding adapter_config.json.")
    cfg = os.path.join(d, "adapter_config.json")
    if not os.path.isfile(cfg):
        raise NvkitError(f"{d} holds no adapter_config.json: it is not a PEFT adapter directory.")
    try:
        with open(cfg, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError) as e:
        raise NvkitError(f"{cfg} is unreadable ({e}); the adapter directory is damaged.") from e
    if not any(os.path.isfile(os.path.join(d, n)) for n in ("adapter_model.safetensors", "adapter_model.bin")):
        raise NvkitError(f"{d} has adapter_config.json but no adapter weights (adapter_model.safetensors).")
    return d


def _require_idle(session):
    if session.busy:
        raise NvkitError("A generation is running in this session: wait for it or call s.stop() first.")
    ft = session.training
    if ft is not None and not ft.done:
        raise NvkitError("A fine-tune is running in this session: run.stop() it or wait for it first.")


def load_adapter(session, adapter_dir, name: str | None = None):
    """Put the adapter in ``adapter_dir`` on the session's model (as ``name``, default 'default'
    for the first one) and make it the active one. Returns the adapter name."""
    with routed():  # peft's first import brings in bitsandbytes (see nvkit.quiet)
        from peft import PeftModel
    _require_idle(session)
    d = _check_adapter_dir(adapter_dir)
    require(name is None or (isinstance(name, str) and name.strip() and "." not in name),
            f"name must be a short identifier without dots, not {name!r}.")
    model = session.model
    try:
        if isinstance(model, PeftModel):
            name = name or os.path.basename(os.path.normpath(d)) or "adapter"
            if name in model.peft_config:
                raise NvkitError(f"An adapter named {name!r} is already on the model: pass another name=, or "
                                 "s.unload_adapter() first.")
            model.load_adapter(d, adapter_name=name)
            model.set_adapter(name)
        else:
            name = name or "default"
            model = PeftModel.from_pretrained(model, d, adapter_name=name, is_trainable=False)
    except NvkitError:
        raise
    except (ValueError, KeyError, RuntimeError, OSError) as e:
        raise NvkitError(f"Could not load the adapter from {d} onto {session.model_id}: {str(e).splitlines()[0]}. "
                         "An adapter only fits the model (shape) it was trained on.") from e
    model.eval()
    session.model = model
    events.record("adapter", f"adapter {name} loaded from {d}")
    return name


def merge_adapter(session):
    """Fold the active adapter into the base weights (faster generation, no PEFT wrapper). Returns
    the plain model. A 4-bit model cannot be merged in place: load it in bf16 and merge there."""
    from peft import PeftModel
    _require_idle(session)
    model = session.model
    if not isinstance(model, PeftModel):
        raise NvkitError("The model has no adapter to merge: fine-tune or s.load_adapter(dir) first.")
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        raise NvkitError("Merging into a 4/8-bit model would dequantize and round the weights. Load the model "
                         "unquantized (nvkit.load(..., quantization=None)), load the adapter, then merge.")
    try:
        merged = model.merge_and_unload()
    except (ValueError, RuntimeError) as e:
        raise NvkitError(f"Merging the adapter failed: {str(e).splitlines()[0]}") from e
    merged.eval()
    session.model = merged
    events.record("adapter", "adapter merged into the weights")
    return merged


def unload_adapter(session):
    """Remove every adapter (unmerged) and go back to the base model. Returns the plain model."""
    from peft import PeftModel
    _require_idle(session)
    model = session.model
    if not isinstance(model, PeftModel):
        raise NvkitError("The model has no adapter to unload.")
    base = model.unload()
    base.eval()
    session.model = base
    events.record("adapter", "adapters removed")
    return base
