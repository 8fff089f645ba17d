import torch
from torch import nn

# Incremented by every forward call, so a test can tell the kernel ran (not the original layer).
CALLS = [0]


class RMSNorm(nn.Module):
    """Replaces the forward of a module holding ``weight`` and ``variance_epsilon`` (Llama/Qwen
    RMSNorm). Kernel layers must not define __init__ or members: kernels swaps only ``forward``."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        CALLS[0] += 1
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)
