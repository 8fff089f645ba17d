"""GPU memory, measured and predicted: the driver's view (NVML, whole device) beside this
process's PyTorch allocator, live (``sampler``), after the fact (``report``, ``unload``, ``oom``)
and before (``estimate``), each prediction shown beside the peak it predicted (``peaks``)."""

from ..lazy import lazy_names

_NAMES = {
    "release": "usage", "rss_bytes": "usage", "torch_allocated": "usage", "torch_reserved": "usage",
    "cuda_in_use": "usage", "visible_gpus": "usage", "Device": "usage", "pick_devices": "usage",
    "Sampler": "sampling", "sampler": "sampling", "RingBuffer": "sampling", "SERIES": "sampling",
    "DEFAULT_RATE_HZ": "sampling",
    "Comparison": "peaks", "comparisons": "peaks", "expect": "peaks", "expectation": "peaks",
    "reset_peak": "peaks", "record_peak": "peaks", "last_comparison": "peaks", "open_since": "peaks",
    "expect_finetune": "peaks",
    "memory_report": "report", "format_report": "report", "REPORT_COLUMNS": "report",
    "live_tensors": "unload", "usage_snapshot": "unload", "verified_release": "unload", "UnloadReport": "unload",
    "oom_error": "oom",
}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
