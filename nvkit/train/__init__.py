"""Training: ``finetune`` (LoRA / QLoRA in the kernel, its ``run`` and callback), the pieces it
shares with the launch worker (``lora``, ``trainer``, ``loss``, ``compile``, ``data``), held-out
evaluation (``evaluate``), resumable checkpoints (``checkpoints``), the data preview (``data.preview``
→ ``preview``), and ``launch`` (the same run over several GPUs with torchrun, running ``worker``)."""
