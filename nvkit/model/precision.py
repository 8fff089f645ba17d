"""Number formats: the dtype a model loads in and the precision it trains in, decided here once
for ``nvkit.load``, ``nvkit.finetune`` and the processes ``nvkit.launch`` starts."""

from __future__ import annotations

from ..errors import NvkitError, require

_DTYPES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}


def resolve_dtype(dtype, device_type: str, capability: tuple[int, int] | None = None):
    import torch
    if isinstance(dtype, torch.dtype):
        return dtype
    require(isinstance(dtype, str), f"dtype must be 'auto', 'bfloat16', 'float16' or 'float32', not {dtype!r}.")
    key = dtype.lower().replace("torch.", "")
    if key == "auto":
        if device_type == "cuda":
            # bf16 needs Ampere (8.0); is_bf16_supported() says True on older GPUs through emulation.
            return torch.bfloat16 if capability and capability >= (8, 0) else torch.float16
        return torch.float32
    require(key in _DTYPES, f"Unknown dtype {dtype!r}: use 'auto', 'bfloat16', 'float16' or 'float32'.")
    return getattr(torch, _DTYPES[key])


def load_dtype(dtype, device_type: str, capability: tuple[int, int] | None = None, quantization=None):
    """The dtype ``nvkit.load`` loads in: ``resolve_dtype``, except that ``"auto"`` with int8 on a
    GPU is float16. LLM.int8() multiplies in float16, so bitsandbytes casts every bfloat16 input
    to float16 and warns on stderr at each of its matmuls; loading the rest of the model in float16
    gives the same numbers without the cast. A dtype the user names is kept as named."""
    import torch
    chosen = resolve_dtype(dtype, device_type, capability)
    auto = isinstance(dtype, str) and dtype.lower() == "auto"
    if auto and device_type == "cuda" and _is_int8(quantization):
        return torch.float16
    return chosen


def _is_int8(quantization) -> bool:
    """The forms ``quant.quantization_config`` takes (a name, a dict with a method, a config),
    the name read the way it reads it."""
    if isinstance(quantization, dict):
        quantization = quantization.get("method")
    if isinstance(quantization, str):
        return quantization.strip().lower() == "int8"
    return bool(getattr(quantization, "load_in_8bit", False))  # a transformers BitsAndBytesConfig


PRECISIONS = ("bf16", "fp16", "fp32")


def precision(device_type: str, capability: tuple[int, int] | None, requested=None) -> str:
    """The precision a run trains in: ``requested`` ("bf16", "fp16", "fp32") when this device can
    train in it, else NvkitError; None (or "auto"): 'bf16' on CUDA with compute capability ≥ 8.0
    (Ampere+), 'fp16' on older CUDA GPUs, 'fp32' on CPU. ``torch.cuda.is_bf16_supported()`` says
    True on some pre-Ampere GPUs (emulated, slow), and ``TrainingArguments(bf16=True)`` raises on
    CPU, so the decision is made here."""
    if requested is not None and requested != "auto":
        require(requested in PRECISIONS, f"precision must be 'bf16', 'fp16', 'fp32' or None (automatic), not {requested!r}.")
        if requested != "fp32" and device_type != "cuda":
            raise NvkitError(f"precision={requested!r} is mixed precision on a CUDA GPU; this run is on the CPU, which "
                             "trains in fp32 here. Use precision='fp32' or None.")
        if requested == "bf16" and not (capability is not None and tuple(capability) >= (8, 0)):
            cc = f"{capability[0]}.{capability[1]}" if capability else "unknown"
            raise NvkitError(f"precision='bf16' needs an Ampere or newer GPU (compute capability ≥ 8.0); this one is "
                             f"{cc}. Use precision='fp16' (with loss scaling) or 'fp32'.")
        return requested
    if device_type != "cuda":
        return "fp32"
    return "bf16" if capability is not None and tuple(capability) >= (8, 0) else "fp16"
