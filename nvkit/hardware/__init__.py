"""The GPUs: what NVML sees (``inventory``, never a CUDA context) and which of them this process
uses and in what order (``selection``: CUDA_VISIBLE_DEVICES, kept across a kernel restart)."""

from ..lazy import lazy_names

_NAMES = {
    "GPU": "inventory", "GPUProcess": "inventory", "gpus": "inventory", "nvml_status": "inventory",
    "format_table": "inventory", "memory_used": "inventory",
    "Selection": "selection", "select_gpus": "selection", "selection": "selection", "plan": "selection",
    "launch_command": "selection", "cuda_initialized": "selection",
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
