"""Hub kernels (``use_kernels=True`` / ``KernelConfig``) and local kernel directories, checked
before anything is loaded or unloaded.

Transformers 5.22 + kernels 0.17.2 leave three traps that nvkit closes:

- offline, a kernel that is not cached raises a ``ValueError`` deep inside ``from_pretrained`` (the
  fallback only catches ``FileNotFoundError``), after the previous model is gone. nvkit plans the
  kernels first: each layer's repo must be in ``LOCAL_KERNELS``, the local cache, or on a
  reachable Hub, else ``NvkitError`` names the repo and how to bring it in; nothing is touched.
- ``LOCAL_KERNELS`` does not help a versioned ``LayerRepository`` offline (kernels resolves the
  version on the Hub before it looks at the override). nvkit turns such repos into
  ``LocalLayerRepository`` objects for the directory, which need no Hub at all.
- ``KernelConfig`` only accepts GPU device keys; nvkit also takes a ``"cpu"`` key (the kernels
  library itself supports the CPU) so local kernels can be tried and tested without a GPU.

The plan is applied after the weights are loaded with transformers' own machinery
(``model.kernel_config`` + ``model.set_use_kernels(True)``), so ``model.train()`` /
``model.eval()`` switch kernels between ``Mode.TRAINING`` and ``Mode.INFERENCE`` as usual.

A kernel reference names a local directory only when it is path-like (``/``, ``./``, ``../``,
``~``) or the ``KernelConfig`` says ``use_local_kernel=True``; ``org/repo:Layer`` always goes to the
Hub repo through the kernels library (``LOCAL_KERNELS`` can still map it to a folder explicitly).

A kernel directory is in the Hub kernel layout: ``<dir>/build/<variant>/`` holding
``metadata.json`` and the Python package whose ``layers`` module defines the layer classes
(``torch-universal`` for pure PyTorch/Triton code). ``tests/data/kernels/nvkit-rmsnorm`` is one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .backends import how_to_bring_in, kernel_source, kernels_problem, local_kernels
from ..errors import NvkitError
from ..memory.estimate import meta_model

DEVICE_KEYS = ("cuda", "cpu", "rocm", "xpu", "npu", "neuron", "tpu", "mps")


class _DropNoMapping(logging.Filter):
    # kernelize warns once per layer of the model that has no kernel in the mapping (rotary,
    # SiLU, ...); nvkit reports what was replaced itself, so these lines are noise.
    def filter(self, record):
        return "No kernel mapping found" not in record.getMessage()


_filter_installed = False


def _quiet_kernels_logger():
    global _filter_installed
    if not _filter_installed:
        logging.getLogger("kernels.layer.layer").addFilter(_DropNoMapping())
        _filter_installed = True


@dataclass
class KernelPlan:
    """Which kernel each layer of the model gets on ``device_type``, and from where."""

    device_type: str
    mapping: dict = field(default_factory=dict)     # kernels format: layer -> {device: {Mode: repo}}
    sources: dict = field(default_factory=dict)     # layer -> where its kernel comes from
    skipped: dict = field(default_factory=dict)     # layer -> why it keeps its own forward
    model_layers: tuple = ()                        # kernel layer names the model declares
    # what was asked for, as plain data ({"use_kernels": True, "kernel_config": {...} or None}), so a
    # launched run can ask for the same kernels; None when the request held objects (a KernelConfig
    # with repository objects) that cannot be written down
    request: dict | None = None

    def describe(self) -> dict:
        return {"device": self.device_type, "layers": dict(self.sources), "unchanged": dict(self.skipped),
                "request": self.request}


def _plain_request(use_kernels: bool, kernel_config) -> dict | None:
    """The kernels request as JSON-able data, or None when it holds objects."""
    if kernel_config is None:
        return {"use_kernels": bool(use_kernels), "kernel_config": None}
    mapping = kernel_config if isinstance(kernel_config, dict) else getattr(kernel_config, "kernel_mapping", None)
    if not isinstance(mapping, dict):
        return None

    def plain(v):
        if isinstance(v, str):
            return v
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            out = {k: plain(x) for k, x in v.items()}
            return None if any(x is None for x in out.values()) else out
        return None

    out = {k: plain(v) for k, v in mapping.items() if isinstance(k, str)}
    if len(out) != len(mapping) or any(v is None for v in out.values()):
        return None
    return {"use_kernels": True, "kernel_config": out}


# --- the model's kernel layers -----------------------------------------------------------------

def model_kernel_layers(model_or_path, trust_remote_code: bool = False) -> tuple[str, ...]:
    """Layer names the model marks with ``@use_kernel_forward_from_hub`` (e.g. "RMSNorm"),
    read from a model or from a checkpoint's config (built on the meta device: no weights)."""
    import torch
    model = model_or_path
    if not isinstance(model_or_path, torch.nn.Module):
        from transformers import AutoConfig
        config = AutoConfig.from_pretrained(model_or_path, trust_remote_code=trust_remote_code)
        model = meta_model(config, trust_remote_code=trust_remote_code)
    names = []
    for m in model.modules():
        n = getattr(type(m), "kernel_layer_name", None)
        if n and n not in names:
            names.append(n)
        for k, fn in (getattr(m, "_kernel_funcs", None) or {}).items():
            n = getattr(fn, "kernel_layer_name", k)
            if n not in names:
                names.append(n)
    return tuple(names)


# --- normalising what the user gave ------------------------------------------------------------

def _modes():
    from kernels import Mode
    return Mode.INFERENCE, Mode.TRAINING


def _split_ref(ref: str, layer: str) -> tuple[str, str]:
    """"org/repo:Layer" or "/abs/path:Layer" → (repo or path, Layer)."""
    if not isinstance(ref, str) or ":" not in ref or "/" not in ref:
        raise NvkitError(f"Kernel for {layer!r} must be 'org/repo:LayerName' or '/path/to/kernel:LayerName', not {ref!r}.")
    where, name = ref.rsplit(":", 1)
    if not name:
        raise NvkitError(f"Kernel for {layer!r}: {ref!r} names no layer after the ':'.")
    return where, name


def _is_local(where: str) -> bool:
    # Only a path-like reference is a folder. "org/repo" always means the Hub repo (through the
    # kernels library and its publisher-trust check), even when a folder of that name happens to
    # exist under the working directory: such a folder is anyone's, and its code would run.
    return where.startswith(("/", "./", "../", "~"))


def _repo_for(layer: str, ref, local_flag: bool):
    """A kernels repository object (and a description) for one mapping value."""
    from kernels import LayerRepository, LocalLayerRepository
    meta = {}
    if isinstance(ref, tuple):
        if len(ref) != 2 or not isinstance(ref[1], dict):
            raise NvkitError(f"Kernel for {layer!r}: a tuple must be ('org/repo:Layer', {{'version': N}}), not {ref!r}.")
        ref, meta = ref
    where, name = _split_ref(ref, layer)
    if local_flag or _is_local(where):
        path = Path(os.path.expanduser(where)).resolve()
        if not path.is_dir():
            raise NvkitError(f"Local kernel directory {path} (for {layer!r}) does not exist. Point at a directory in "
                             "the Hub kernel layout (build/<variant>/metadata.json + the package).")
        return LocalLayerRepository(repo_path=path, layer_name=name), f"local kernel directory {path} ({name})"
    version, revision = meta.get("version"), meta.get("revision")
    if version is None and revision is None:
        version = 1
    try:
        return _hub_repo(layer, where, name, version, revision, bool(meta.get("trust_remote_code", False)))
    except NvkitError as e:
        if not os.path.isdir(where):
            raise
        raise NvkitError(f"{e} A folder {where!r} exists in the working directory, but a Hub-style name never "
                         f"means a local folder; to run that folder's code, name it as a path: './{where}:{name}'.") from e


def _hub_repo(layer, repo_id, name, version, revision, trust, func=False):
    from kernels import LayerRepository, LocalLayerRepository
    local = local_kernels().get(repo_id)
    if local is not None and local.is_dir():
        # A versioned LayerRepository asks the Hub for the version even when LOCAL_KERNELS has the repo.
        if func:
            from kernels import LocalFuncRepository
            return LocalFuncRepository(repo_path=local, func_name=name), f"LOCAL_KERNELS {repo_id} → {local} ({name})"
        return LocalLayerRepository(repo_path=local, layer_name=name), f"LOCAL_KERNELS {repo_id} → {local} ({name})"
    ok, source, why = kernel_source(repo_id, version)
    if not ok:
        raise NvkitError(f"The Hub kernel {repo_id} (for the model's {layer} layers) can't be loaded: {why}")
    kw = {"revision": revision} if revision is not None else {"version": version}
    if func:
        from kernels import FuncRepository
        return FuncRepository(repo_id, func_name=name, trust_remote_code=trust, **kw), f"{source} ({name})"
    return LayerRepository(repo_id, layer_name=name, trust_remote_code=trust, **kw), f"{source} ({name})"


def _user_mapping(kernel_config) -> tuple[dict, bool]:
    """(layer -> value, use_local_kernel) from a KernelConfig or a plain dict."""
    if isinstance(kernel_config, dict):
        return dict(kernel_config), False
    from transformers import KernelConfig
    if isinstance(kernel_config, KernelConfig):
        return dict(kernel_config.kernel_mapping), bool(kernel_config.use_local_kernel)
    raise NvkitError(f"kernel_config must be a transformers KernelConfig or a dict such as "
                     f"{{'RMSNorm': {{'cuda': 'org/repo:Layer'}}}}, not {type(kernel_config).__name__}.")


def _device_value(layer: str, value, device_type: str):
    """The mapping value for this device, or None when the user mapped other devices only."""
    if isinstance(value, (str, tuple)):
        return value
    if isinstance(value, dict):
        keys = [k if isinstance(k, str) else getattr(k, "type", None) for k in value]
        bad = [k for k in keys if k not in DEVICE_KEYS]
        if bad:
            raise NvkitError(f"Kernel for {layer!r}: unknown device key(s) {bad}; use {', '.join(DEVICE_KEYS)}.")
        for k, v in value.items():
            if (k if isinstance(k, str) else k.type) == device_type:
                return v
        return None
    raise NvkitError(f"Kernel for {layer!r} must be 'org/repo:Layer', ('org/repo:Layer', {{...}}) or "
                     f"{{'cuda': ...}}, not {value!r}.")


# --- planning ------------------------------------------------------------------------------------

def plan_kernels(model_or_path, device_type: str, use_kernels: bool = False, kernel_config=None,
                 trust_remote_code: bool = False) -> KernelPlan | None:
    """Check a kernels request without touching any loaded model: every kernel the model would
    use must be loadable here (and is imported now, so a broken one fails before the load)."""
    if not isinstance(use_kernels, bool):
        raise NvkitError(f"use_kernels must be True or False, not {use_kernels!r}.")
    if not use_kernels and kernel_config is None:
        return None
    problem = kernels_problem()
    if problem:
        raise NvkitError(f"Hub kernels were asked for, but {problem}.")
    _quiet_kernels_logger()
    layers = model_kernel_layers(model_or_path, trust_remote_code)
    plan = KernelPlan(device_type=device_type, model_layers=layers, request=_plain_request(use_kernels, kernel_config))
    inference, training = _modes()
    if kernel_config is not None:
        user, local_flag = _user_mapping(kernel_config)
        if not user:
            raise NvkitError("kernel_config maps no layers: give e.g. {'RMSNorm': {'cuda': 'org/repo:Layer'}}.")
        for layer, value in user.items():
            if layer not in layers:
                raise NvkitError(f"kernel_config maps {layer!r}, but this model has no such kernel layer. Its kernel "
                                 f"layers: {', '.join(layers) or '(none)'}.")
            v = _device_value(layer, value, device_type)
            if v is None:
                plan.skipped[layer] = f"kernel_config has no {device_type!r} entry for it"
                continue
            if isinstance(v, dict):  # already in kernels' format: {Mode: repo}
                plan.mapping[layer] = {device_type: v}
                plan.sources[layer] = ", ".join(str(r) for r in v.values())
                continue
            repo, desc = _repo_for(layer, v, local_flag)
            plan.mapping[layer] = {device_type: {inference: repo, training: repo}}
            plan.sources[layer] = desc
    else:
        from transformers.integrations.hub_kernels import get_kernel_mapping_transformers
        default = get_kernel_mapping_transformers()
        for layer in layers:
            entry = default.get(layer)
            if not entry:
                plan.skipped[layer] = "transformers maps no Hub kernel for it"
                continue
            per_device = [v for k, v in entry.items() if (k if isinstance(k, str) else k.type) == device_type]
            if not per_device:
                plan.skipped[layer] = f"transformers maps no Hub kernel for it on {device_type}"
                continue
            modes = per_device[0] if isinstance(per_device[0], dict) else {inference: per_device[0]}
            new, descs = {}, []
            for mode, r in modes.items():
                func = hasattr(r, "func_name") and not hasattr(r, "layer_name")
                name = r.func_name if func else r.layer_name
                repo, desc = _hub_repo(layer, r._repo_id, name, getattr(r, "_version", None),
                                       getattr(r, "_revision", None), getattr(r, "_trust_remote_code", False), func)
                new[mode] = repo
                if desc not in descs:
                    descs.append(desc)
            plan.mapping[layer] = {device_type: new}
            plan.sources[layer] = "; ".join(descs)
    # Import every kernel now: a broken or incompatible one fails here, before any model changes.
    seen = set()
    for layer, per_dev in plan.mapping.items():
        for repo in per_dev[device_type].values():
            if id(repo) in seen:
                continue
            seen.add(id(repo))
            try:
                repo.load()
            except Exception as e:  # noqa: BLE001 - any import/resolve failure becomes one clear error
                raise NvkitError(f"The kernel for {layer} ({repo}) could not be loaded: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return plan


def apply_kernels(model, plan: KernelPlan | None) -> dict | None:
    """Kernelize ``model`` with ``plan`` through transformers (``model.use_kernels`` becomes True,
    so train()/eval() switch modes); returns what was replaced, measured on the modules."""
    if plan is None:
        return None
    from transformers import KernelConfig
    # The plan is already in kernels' own format (and may hold a "cpu" key, which KernelConfig's
    # validator rejects), so it is set directly instead of through set_use_kernels(kernel_config=).
    model.kernel_config = KernelConfig(kernel_mapping=plan.mapping, inherit_mapping=False)
    try:
        model.set_use_kernels(True)
    except Exception as e:  # noqa: BLE001
        raise NvkitError(f"Kernelizing the model failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return kernel_report(model, plan)


def replaced_modules(model) -> dict[str, int]:
    """Kernel layer name -> how many modules of the model now run a kernel's forward."""
    out: dict[str, int] = {}
    for m in model.modules():
        name = getattr(type(m), "kernel_layer_name", None)
        if not name:
            continue
        fwd = getattr(m.__dict__.get("forward"), "__func__", None)
        if fwd is not None and fwd is not type(m).forward:
            out[name] = out.get(name, 0) + 1
    return out


def kernel_report(model, plan: KernelPlan) -> dict:
    d = plan.describe()
    d["replaced"] = replaced_modules(model)
    d["mode"] = "training" if model.training else "inference"
    return d


def enable_kernels(session, kernel_config=None) -> dict:
    """Kernelize the loaded model of ``session`` (planned first: on error it stays as it was)."""
    session._require_loaded()
    dev = session.device.type
    plan = plan_kernels(session.model, dev, True, kernel_config)
    info = apply_kernels(session.model, plan)
    session.kernels = info
    return info


def local_kernel_config(path, layers: dict[str, str] | None = None, device: str = "cuda"):
    """A ``KernelConfig(use_local_kernel=True)`` for a kernel directory: ``layers`` maps the
    model's kernel layer names to the directory's layer classes (default {"RMSNorm": "RMSNorm"}).
    For ``device="cpu"`` a plain dict is returned: KernelConfig accepts GPU keys only, nvkit.load
    takes both."""
    p = Path(os.path.expanduser(str(path))).resolve()
    if not p.is_dir():
        raise NvkitError(f"{p} is not a directory. Give a kernel directory in the Hub kernel layout.")
    if device not in DEVICE_KEYS:
        raise NvkitError(f"device must be one of {', '.join(DEVICE_KEYS)}, not {device!r}.")
    layers = layers or {"RMSNorm": "RMSNorm"}
    mapping = {layer: {device: f"{p}:{cls}"} for layer, cls in layers.items()}
    if device == "cpu":
        return mapping
    from transformers import KernelConfig
    return KernelConfig(kernel_mapping=mapping, use_local_kernel=True)


__all__ = ["KernelPlan", "plan_kernels", "apply_kernels", "enable_kernels", "local_kernel_config",
           "model_kernel_layers", "replaced_modules", "how_to_bring_in"]
