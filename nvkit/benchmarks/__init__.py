"""Side-by-side measurements, each comparing in one process: attention backends and quantization
(``backends``, ``nvkit.bench``), the decode paths (``decode``), LoRA training (``lora``) and the
memory sampler's cost (``sampler``)."""

from ..lazy import lazy_names

_NAMES = {"bench": "backends", "bench_chart": "backends", "cli_main": "backends"}
__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
