"""LoRA settings and the model preparation both ``nvkit.finetune`` (in the kernel) and the
processes ``nvkit.launch`` starts (``nvkit.train.worker``) use: the checked LoRA settings, PEFT
wrapping (QLoRA preparation on a 4/8-bit model), and Liger's kernels on one model instance."""

from __future__ import annotations

from ..errors import NvkitError, require
from .loss import causal_lm

DEFAULT_LORA = dict(r=16, alpha=32, dropout=0.05, target_modules="all-linear")
_LORA_KEYS = {"r", "alpha", "dropout", "target_modules", "bias", "use_rslora", "use_dora"}
_LIGER_TYPES = {"qwen2", "qwen3", "llama", "mistral", "phi3", "olmo2", "smollm3"}


def check_lora(lora) -> dict:
    """The LoRA settings with defaults filled in; NvkitError on anything PEFT would reject."""
    require(isinstance(lora, dict), f"lora must be a dict like {DEFAULT_LORA}, not {type(lora).__name__}.")
    unknown = set(lora) - _LORA_KEYS
    require(not unknown, f"Unknown LoRA setting(s) {sorted(unknown)}: use r, alpha, dropout, target_modules "
                         "(and optionally bias, use_rslora, use_dora).")
    cfg = {**DEFAULT_LORA, **lora}
    r = cfg["r"]
    require(isinstance(r, int) and not isinstance(r, bool) and r >= 1, f"lora r must be a whole number ≥ 1, not {r!r}.")
    a = cfg["alpha"]
    require(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0, f"lora alpha must be > 0, not {a!r}.")
    d = cfg["dropout"]
    require(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d < 1,
            f"lora dropout must be in [0, 1), not {d!r}.")
    tm = cfg["target_modules"]
    require(tm == "all-linear" or (isinstance(tm, (list, tuple)) and tm and all(isinstance(t, str) and t for t in tm)),
            f"lora target_modules must be 'all-linear' or a list of module names like ['q_proj', 'v_proj'], not {tm!r}.")
    if isinstance(tm, tuple):
        cfg["target_modules"] = list(tm)
    require(cfg.get("bias", "none") in ("none", "all", "lora_only"),
            f"lora bias must be 'none', 'all' or 'lora_only', not {cfg.get('bias')!r}.")
    for key in ("use_rslora", "use_dora"):
        require(isinstance(cfg.get(key, False), bool), f"lora {key} must be True or False, not {cfg.get(key)!r}.")
    return cfg


def liger_decision(liger, device_type: str, model_type: str) -> tuple[bool, str]:
    """(use Liger kernels?, why) for liger=True/False/'auto'."""
    require(liger is True or liger is False or liger == "auto", f"liger must be True, False or 'auto', not {liger!r}.")
    if liger is False:
        return False, "off (liger=False)"
    why_not = None
    if device_type != "cuda":
        why_not = "Liger's kernels are Triton (CUDA only) and the model is on the CPU"
    elif model_type not in _LIGER_TYPES:
        why_not = f"model type {model_type!r} is not one nvkit applies Liger to ({', '.join(sorted(_LIGER_TYPES))})"
    else:
        try:
            import liger_kernel  # noqa: F401
        except ImportError:
            why_not = "liger-kernel is not installed (pip install 'nvkit[cuda]' or pip install liger-kernel)"
    if why_not is None:
        return True, "on (RMSNorm, SwiGLU)"
    if liger is True:
        raise NvkitError(f"liger=True but {why_not}. Use liger='auto' to fall back silently, or liger=False.")
    return False, f"off: {why_not}"


def is_kbit(model) -> bool:
    """True for a model bitsandbytes loaded in 4 or 8 bits (QLoRA then)."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
                or getattr(getattr(model, "config", None), "quantization_config", None) is not None
                and getattr(model, "hf_quantizer", None) is not None)


def prepare_lora_model(model, lora: dict, gradient_checkpointing: bool):
    """Wrap ``model`` with fresh LoRA adapters (QLoRA preparation first when it is 4/8-bit); returns
    (peft model, is k-bit, notes). A model that already carries adapters gets them removed first
    (unmerged) so the new run trains one adapter; the old one stays on disk."""
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training
    notes = []
    if isinstance(model, PeftModel):
        model = model.unload()
        notes.append("removed the adapter the session had (it stays on disk; load it again with s.load_adapter)")
    kbit = is_kbit(model)
    if kbit:
        import inspect
        # peft 0.22 renamed the keyword (the old name warns, and goes in peft 1.2); older ones know only the old
        takes = inspect.signature(prepare_model_for_kbit_training).parameters
        kw = "activation_checkpointing_kwargs" if "activation_checkpointing_kwargs" in takes else \
            "gradient_checkpointing_kwargs"
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                                **{kw: {"use_reentrant": False}})
    elif gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tm = lora["target_modules"]
    cfg = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=float(lora["dropout"]),
                     target_modules=tm if tm == "all-linear" else list(tm),
                     bias=lora.get("bias", "none"), use_rslora=bool(lora.get("use_rslora", False)),
                     use_dora=bool(lora.get("use_dora", False)), task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(model, cfg)
    except ValueError as e:
        raise NvkitError(f"PEFT could not add LoRA adapters: {e}. Check lora['target_modules'] against the model's "
                         "module names (print(s.model) shows them).") from e
    return peft_model, kbit, notes


class ModuleSwap:
    """What ``swap_norms_and_mlps`` changed on one model, to put back with ``undo``: the modules it
    replaced (their weights copied back first, in case training changed them) and the MLP
    forwards it bound on instances."""

    def __init__(self):
        self.replaced: list = []   # (parent, attribute, original module, its replacement)
        self.forwards: list = []   # modules whose forward is bound on the instance

    @property
    def count(self) -> int:
        return len(self.replaced) + len(self.forwards)

    def undo(self) -> None:
        import torch
        for parent, child, original, new in reversed(self.replaced):
            if getattr(parent, child, None) is new:
                with torch.no_grad():
                    original.weight.copy_(new.weight)
                setattr(parent, child, original)
        for module in self.forwards:
            module.__dict__.pop("forward", None)
        self.replaced.clear()
        self.forwards.clear()


def swap_norms_and_mlps(model, norm, mlp_forward) -> ModuleSwap:
    """On this model instance only, every RMSNorm module replaced by ``norm(module)`` and every
    gate/up/down MLP's forward by ``mlp_forward`` (bound to the MLP); returns what to undo."""
    import types
    lm = causal_lm(model)
    swap = ModuleSwap()
    for name, module in list(lm.named_modules()):
        cls = type(module).__name__
        if cls.endswith("RMSNorm") and hasattr(module, "weight") and module.weight.dim() == 1:
            parent_name, _, child = name.rpartition(".")
            parent = lm.get_submodule(parent_name) if parent_name else lm
            new = norm(module)
            setattr(parent, child, new)
            swap.replaced.append((parent, child, module, new))
        elif cls.endswith("MLP") and all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj")):
            module.forward = types.MethodType(mlp_forward, module)
            swap.forwards.append(module)
    return swap


def apply_liger(model) -> ModuleSwap:
    """Swap RMSNorm modules and MLP forwards for Liger's Triton kernels on this model instance only
    (Liger's apply_liger_kernel_to_* patch classes process-wide, which would also change any other
    model in the kernel — e.g. the plain baseline of a benchmark). ``nvkit.finetune`` undoes the
    swap when its run ends: the session generates with the model as loaded (plus the adapter),
    and a later plain-PEFT run on the same model is plain."""
    import torch
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    def norm(module):
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
        new = LigerRMSNorm(module.weight.shape[0], eps=eps).to(device=module.weight.device, dtype=module.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(module.weight)
        new.weight.requires_grad_(module.weight.requires_grad)
        return new

    def forward(self, x):
        return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x)))

    return swap_norms_and_mlps(model, norm, forward)
