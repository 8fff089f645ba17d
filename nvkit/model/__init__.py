"""The loaded model: ``session`` (``nvkit.load`` → ``Session``), and the choices it is loaded with:
``precision`` (dtype), ``backends`` (attention), ``quant`` (quantization), ``kernels`` (Hub and
local kernels), ``adapters`` (LoRA adapters on a loaded model)."""
