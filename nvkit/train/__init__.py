"""Training: ``finetune`` (LoRA / QLoRA in the kernel), its ``loss`` and ``data``, and ``launch``
(the same run over several GPUs with torchrun)."""
