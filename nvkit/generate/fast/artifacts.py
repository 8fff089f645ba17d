"""The fast path's compile artifacts on disk, so a new process (a restarted kernel, a second
notebook) compiles the decode step in seconds instead of paying the whole compile again.

torch's portable compile caches (``torch.compiler.save_cache_artifacts``: inductor's FX graph
cache, AOTAutograd's, the autotuning results) are written after a capture to
``$NVKIT_CACHE/fast-decode/<key>.bin`` (``~/.cache/nvkit`` without ``NVKIT_CACHE``) and loaded
before the next compile with the same key. The key holds everything the compiled code depends
on: the model's shape (its config without names), dtype, the fast path's options and cache size
class, the adapters' buffer rank, torch/transformers/triton/nvkit versions and the GPU. Weights
are not in it: the compiled step reads them as inputs, so a fine-tuned or random-weight model of
the same shape shares the artifacts.

Loading artifacts unpickles them, so a file is loaded only under :mod:`nvkit.cache`'s rule (a
folder and a file of this user that no one else can write, never through a link): under a shared
``NVKIT_CACHE`` another user's planted file is ignored and the compile runs in full.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ... import cache

log = logging.getLogger(__name__)

_LIMIT = 1 << 34   # far above any real blob; only a planted giant is refused
_NAMES = ("_name_or_path", "name_or_path", "_commit_hash", "transformers_version", "torch_dtype", "dtype")


def folder() -> Path:
    return cache.root() / "fast-decode"


def _versions() -> dict:
    import importlib.metadata as md
    out = {}
    for dist in ("torch", "transformers", "triton", "nvkit"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def _device(device) -> dict:
    import torch
    if getattr(device, "type", str(device)) == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"gpu": props.name, "capability": [props.major, props.minor], "cuda": torch.version.cuda}
    return {"device": str(getattr(device, "type", device))}


def key(model, options: dict, device) -> str:
    """The artifacts' file name for this model, these options and this GPU (a hex digest)."""
    cfg = model.config.get_text_config().to_dict()
    shape = {k: v for k, v in sorted(cfg.items()) if k not in _NAMES}
    blob = json.dumps({"model": shape, "class": type(model).__name__, "dtype": str(model.dtype),
                       "options": options, "versions": _versions(), "device": _device(device)},
                      sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def path(digest: str) -> Path:
    return folder() / f"{digest}.bin"


def restore(digest: str) -> bool:
    """Load the artifacts of ``digest`` into torch's compile caches; False when there are none,
    they are not this user's (see the module docstring) or they cannot be read (the compile then
    runs in full, as without them)."""
    p = path(digest)
    blob = cache.read_trusted_bytes(p, "fast-decode compile artifacts", limit=_LIMIT)
    if blob is None:
        return False
    try:
        import torch
        return torch.compiler.load_cache_artifacts(blob) is not None
    except Exception as e:  # noqa: BLE001 - a stale or damaged file only costs the compile it would save
        log.debug("nvkit fast decode: could not load compile artifacts %s: %s", p, e)
        return False


def store(digest: str) -> Path | None:
    """Write what torch compiled in this process as the artifacts of ``digest`` (atomically: a
    reader never sees half a file); None when torch had nothing to save or the folder is not writable."""
    try:
        import torch
        saved = torch.compiler.save_cache_artifacts()
    except Exception as e:  # noqa: BLE001
        log.debug("nvkit fast decode: no compile artifacts to save: %s", e)
        return None
    if not saved:
        return None
    data = saved[0]
    target = path(digest)
    try:
        cache.own_dir("fast-decode")   # made 0700 (the cache root too, when missing); refused if not ours
        cache.write_atomic(target, data)
    except OSError as e:
        log.debug("nvkit fast decode: could not write %s: %s", target, e)
        return None
    return target
