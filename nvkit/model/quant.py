"""Quantization methods: which ones work here and why not, and the transformers config for a choice.

bitsandbytes 0.50 runs its 4-bit (nf4/fp4) and 8-bit paths on the CPU as well as on CUDA, so the
same choices load the demo model in CI. torchao int4 weight-only and optimum-quanto are listed
with the reason they are off: nvkit does not install them (not verified with transformers 5.22
here); a ready ``TorchAoConfig`` / ``QuantoConfig`` can still be passed through as ``quantization``.
"""

from __future__ import annotations

from .backends import Choice, ChoiceList, existing_device, package_version, version_tuple
from ..errors import NvkitError
from .precision import resolve_dtype

BNB_MIN = (0, 50)          # first bitsandbytes whose nf4/int8 also run on the CPU
METHODS = ("nf4", "fp4", "int8")
OPTIONS_4BIT = ("double_quant", "compute_dtype", "quant_storage")


def quantization_methods(device=None) -> ChoiceList:
    """nf4 / fp4 / int8 (bitsandbytes) and the methods nvkit knows but does not ship, each with
    ``.name``, ``.available``, ``.reason``, ``.source`` (same shape as ``attention_backends``)."""
    device_type, _ = existing_device(device)
    out = ChoiceList()
    bnb = package_version("bitsandbytes")
    notes = {"nf4": "4-bit NormalFloat (QLoRA's choice), double quant on by default",
             "fp4": "4-bit float, double quant on by default",
             "int8": "LLM.int8() with outlier handling"}
    for m in METHODS:
        if bnb is None:
            out.append(Choice(m, False, "bitsandbytes is not installed (pip install 'bitsandbytes>=0.50')", "-"))
        elif device_type == "cpu" and version_tuple(bnb)[:2] < BNB_MIN:
            out.append(Choice(m, False, f"bitsandbytes {bnb} has no CPU path; 0.50 and newer run on the CPU "
                                        "(pip install -U bitsandbytes)", f"package bitsandbytes {bnb}"))
        else:
            note = notes[m] + ("; on the CPU it is slow: a memory saver, not a speed-up" if device_type == "cpu" else "")
            out.append(Choice(m, True, note, f"package bitsandbytes {bnb}"))
    # Methods transformers supports but nvkit has not verified here: listed, with how to use them.
    out.append(_unverified("torchao-int4", "torchao", "transformers.TorchAoConfig('int4_weight_only')"))
    out.append(_unverified("quanto-int8", "optimum-quanto", "transformers.QuantoConfig(weights='int8')"))
    return out


def _unverified(name: str, package: str, config: str) -> "Choice":
    version = package_version(package)
    if version:
        reason = (f"{package} {version} is installed but nvkit has not verified it with transformers 5.22; "
                  f"pass {config} as quantization= to use it anyway")
    else:
        reason = (f"{package} is not installed (nvkit does not ship it); pip install {package}, then pass "
                  f"{config} as quantization=")
    return Choice(name, False, reason, f"package {package} {version}" if version else "-")


def quantization_config(quantization, compute_dtype, device=None, **options):
    """A transformers quantization config for ``quantization``: None, "nf4", "fp4", "int8", or a
    ready transformers config object (passed through). ``options`` for 4-bit: ``double_quant``
    (default True), ``compute_dtype`` (default: the load dtype), ``quant_storage``."""
    if isinstance(quantization, dict):
        # {"method": "nf4", "double_quant": False, "compute_dtype": "bfloat16"}: the panel's and
        # the magic's form of a method with options.
        opts = dict(quantization)
        if "method" not in opts:
            raise NvkitError("A quantization dict needs a 'method' ('nf4', 'fp4' or 'int8'), e.g. "
                             "{'method': 'nf4', 'double_quant': False}.")
        method = opts.pop("method")
        cdt = opts.pop("compute_dtype", None)
        return quantization_config(method, cdt if cdt is not None else compute_dtype, device, **{**opts, **options})
    if quantization is None:
        if options:
            raise NvkitError(f"Quantization options {sorted(options)} given without a quantization method.")
        return None
    if not isinstance(quantization, str):
        from transformers.utils.quantization_config import QuantizationConfigMixin
        if isinstance(quantization, QuantizationConfigMixin):
            return quantization
        raise NvkitError(f"quantization must be 'nf4', 'fp4', 'int8' or a transformers quantization config, "
                         f"not {type(quantization).__name__}.")
    q = quantization.strip().lower()
    if q not in METHODS:
        known = quantization_methods(device if device is not None else "cpu")
        others = ", ".join(f"{c.name} ({c.reason})" for c in known if c.name not in METHODS)
        raise NvkitError(f"Unknown quantization {quantization!r}: use 'nf4', 'fp4' or 'int8' (bitsandbytes), or pass "
                         f"a transformers quantization config. Known but not shipped: {others}.")
    choice = quantization_methods(device if device is not None else "cpu")[q]
    if not choice.available:
        raise NvkitError(f"Quantization {q!r} can't be used here: {choice.reason}.")
    from transformers import BitsAndBytesConfig
    if q == "int8":
        if options:
            raise NvkitError(f"int8 takes no options (got {sorted(options)}); they are for nf4/fp4.")
        return BitsAndBytesConfig(load_in_8bit=True)
    bad = set(options) - set(OPTIONS_4BIT)
    if bad:
        raise NvkitError(f"Unknown 4-bit option(s) {sorted(bad)}: use {', '.join(OPTIONS_4BIT)}.")
    double = options.get("double_quant", True)
    if not isinstance(double, bool):
        raise NvkitError(f"double_quant must be True or False, not {double!r}.")
    cdt = options.get("compute_dtype") or compute_dtype
    storage = options.get("quant_storage")
    import torch
    if isinstance(cdt, str):
        cdt = resolve_dtype(cdt, "cpu")
    if cdt is not None and cdt not in (torch.float32, torch.float16, torch.bfloat16):
        raise NvkitError(f"compute_dtype must be float32, float16 or bfloat16, not {cdt}.")
    kw = dict(load_in_4bit=True, bnb_4bit_quant_type=q, bnb_4bit_use_double_quant=double, bnb_4bit_compute_dtype=cdt)
    if storage is not None:
        if isinstance(storage, str):
            storage = resolve_dtype(storage, "cpu")
        kw["bnb_4bit_quant_storage"] = storage
    return BitsAndBytesConfig(**kw)
