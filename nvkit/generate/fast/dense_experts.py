"""A mixture of experts' experts applied to every row at once (``dense_experts_forward``),
registered with transformers as the experts implementation ``"nvkit_dense"`` for the rows decode
step over a model's own forward (``static_cache.experts_for_graphs``).

Why: a captured step cannot run transformers' default experts ("grouped_mm" reads its offsets
through the host), and its "batched_mm" gathers a copy of each row's experts' weights: rows ×
top-k copies of an expert's weights per layer and step, gigabytes at a list's row counts. Here
each expert's weights are read once per step and applied to every row in one batched product
over the experts, and the routing weights (zero for an expert a row did not pick) sum the rows'
outputs: every expert's bytes once per step, and every expert's products for every row. The
copies of "batched_mm" move as many bytes from about ``num_experts / (2 × top_k)`` rows up, so
from there the step runs dense, and below it keeps "batched_mm" (``implementation_for``).

The outputs are the same sums as "batched_mm"'s in another order (the zero terms add nothing);
transformers' reference is in tests/generate/test_dense_experts.py.
"""

from __future__ import annotations

NAME = "nvkit_dense"
_registered: list[bool] = []


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts forward signature: ``hidden_states`` (tokens, hidden), each token's
    ``top_k_index`` and ``top_k_weights`` (tokens, top_k) -> (tokens, hidden)."""
    import torch
    if getattr(self, "_is_expert_parallel", False):  # experts spread over devices: transformers' own way
        from transformers.integrations.moe import batched_mm_experts_forward
        return batched_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    tokens, hidden = hidden_states.shape
    experts = self.num_experts
    x = hidden_states.unsqueeze(0).expand(experts, tokens, hidden)
    up = self.gate_up_proj if self.has_gate else self.up_proj
    h = torch.bmm(x, up if self.is_transposed else up.transpose(1, 2))          # (experts, tokens, 2I or I)
    if self.has_bias:
        h = h + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias).unsqueeze(1)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    out = torch.bmm(h, self.down_proj if self.is_transposed else self.down_proj.transpose(1, 2))  # (experts, tokens, hidden)
    if self.has_bias:
        out = out + self.down_proj_bias.unsqueeze(1)
    if getattr(self, "has_post_expert_norm", False):  # an older transformers' experts have no such norm
        out = self.post_expert_norm(out)
    route = torch.zeros(tokens, experts, dtype=top_k_weights.dtype, device=hidden_states.device)
    route = route.scatter_add(1, top_k_index, top_k_weights)                   # (tokens, experts)
    return (out * route.t().unsqueeze(-1)).sum(0).to(hidden_states.dtype)


def register() -> bool:
    """Register ``NAME`` with transformers' experts implementations (once); False where this
    transformers has no such registry (its models then keep "batched_mm" in the rows step)."""
    if not _registered:
        try:
            from transformers.integrations.moe import ExpertsInterface
            ExpertsInterface.register(NAME, dense_experts_forward)
            _registered.append(True)
        except (ImportError, AttributeError):
            _registered.append(False)
    return _registered[0]


def implementation_for(cfg, rows: int | None) -> str:
    """The experts implementation a captured decode step of ``rows`` rows runs (``cfg``: the text
    config): dense from ``num_experts / (2 × top_k)`` rows up (see the module docstring), else,
    and for the batch-1 step (``rows`` None), transformers' "batched_mm"."""
    experts = int(getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0)
    top_k = int(getattr(cfg, "num_experts_per_tok", None) or 1)
    if rows is None or experts == 0 or 2 * rows * top_k < experts or not register():
        return "batched_mm"
    return NAME
