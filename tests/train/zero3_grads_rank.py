"""Run by tests/train/test_strategy_needs.py in a process of its own (one gloo rank on the CPU):
one forward and backward pass of a LoRA model under DeepSpeed ZeRO-3, with DeepSpeed's default
hooking ("plain": every module hooked) or nvkit's ZeRO-3 settings and the model preparation the
worker does for them ("nvkit": the decoder layer a leaf module), with gradient checkpointing
("+checkpointing") or without. Saves every LoRA gradient and the
number of module hooks ZeRO-3 installed, so the test can check that nvkit's settings give the
same gradients with far fewer hooks.

usage: python tests/train/zero3_grads_rank.py MODEL OUT_FILE plain|nvkit[+checkpointing]
"""

import os
import socket
import sys

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(model_path: str, out: str, variant: str) -> None:
    variant, _, checkpointing = variant.partition("+")
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_free_port()))
    import deepspeed
    from deepspeed.utils import safe_get_full_grad
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nvkit.train.lora import DEFAULT_LORA, prepare_lora_model
    from nvkit.train.strategies import deepspeed_config, zero3_settings
    from nvkit.train.worker import decoder_layer, strategy_ready

    deepspeed.init_distributed(dist_backend="gloo")
    layer = decoder_layer(model_path)
    tuning = zero3_settings(layer.name, layer.params, layer.widest * DEFAULT_LORA["r"]) if variant == "nvkit" else None
    config = deepspeed_config("zero3", None, cuda=False, zero3=tuning)
    # every weight of the demo model is below the persistence threshold, so ZeRO-3 would never
    # release one; at 0 it releases and gathers each, as it does the weights of a real model
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    config.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1, train_batch_size=2,
                  gradient_clipping=0.0, bf16={"enabled": False}, fp16={"enabled": False})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    model, _, _ = prepare_lora_model(model, {**DEFAULT_LORA, "dropout": 0.0}, checkpointing == "checkpointing")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # lora_B starts at zero, which would leave every lora_A gradient zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    strategy_ready(model, "zero3", layer if variant == "nvkit" else None)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW([p for _, p in trainable], lr=1e-3),
                                      config=config)
    tok = AutoTokenizer.from_pretrained(model_path)
    text = "NVIDIA GPUs are fast at matrix multiplication, which is most of the work."
    ids = torch.tensor([tok(text)["input_ids"]] * 2)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    grads = {n: safe_get_full_grad(p).detach().clone().float() for n, p in trainable}
    offload = engine.optimizer.parameter_offload
    # DeepSpeed swaps torch's F.linear for its own autograd function unless memory_efficient_linear is off
    swapped = "deepspeed" in (getattr(torch.nn.functional.linear, "__module__", "") or "")
    torch.save({"loss": float(loss), "grads": grads, "hooks": len(offload.forward_hooks), "linear_swapped": swapped,
                "leaves": sum(1 for m in model.modules() if getattr(m, "_z3_leaf", False))}, out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
