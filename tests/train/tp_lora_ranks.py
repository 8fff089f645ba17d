"""Run by tests/train/test_strategies.py under torchrun (2 gloo ranks on the CPU): the worker's
tensor-parallel model preparation — its load (the rank's slice), LoRA on every linear layer and the
fix for row-wise layers — trains a few steps and saves a whole adapter. Trainer itself runs a
tensor-parallel model only on CUDA (accelerate refuses the CPU), so the steps are a plain loop.

usage: python -m torch.distributed.run --nproc_per_node=2 tests/train/tp_lora_ranks.py MODEL OUT_DIR
"""

import json
import os
import sys

import torch

from nvkit.train.lora import DEFAULT_LORA, prepare_lora_model
from nvkit.train.worker import fix_tp_lora, load_model, rowwise_lora_a, tp_optimizer


def main(model_path: str, out: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    cfg = {"model": model_path, "attn_implementation": "sdpa"}
    model = load_model(cfg, "tp", torch.float32, "cpu", int(os.environ["LOCAL_RANK"]), world)
    model, _, _ = prepare_lora_model(model, {**DEFAULT_LORA, "dropout": 0.0}, False)
    fixed = fix_tp_lora(model)  # none where PEFT gave the row-wise A its global width itself (0.22 on)
    rowwise = rowwise_lora_a(model)
    mismatched = sum(getattr(a, "in_features", a.weight.shape[1]) != a.weight.shape[1] for a in rowwise)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_path)
    ids = torch.tensor([tok("NVIDIA GPUs are fast at matrix multiplication, which is most of the work.")["input_ids"]] * 4)
    opt = tp_optimizer(model, 5e-3)  # what the worker hands Trainer under TP
    losses = []
    model.train()
    from accelerate import Accelerator
    for _ in range(6):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        # Trainer clips through accelerate, which takes sharded and whole gradients together
        clip = getattr(Accelerator, "_clip_grad_norm_dtensor_aware", None)
        if clip is not None:
            clip(None, [p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    model.save_pretrained(os.path.join(out, f"adapter-{rank}"))  # gathers the slices: every rank takes part
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump({"losses": losses, "fixed": fixed, "rowwise": len(rowwise), "mismatched": mismatched,
                   "foreach": opt.defaults["foreach"],
                   "sharded": type(model.get_base_model().model.layers[0].self_attn.o_proj.base_layer.weight).__name__},
                  f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
