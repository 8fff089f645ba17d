"""The experts implementations a captured decode step over a model's own forward runs, registered
with transformers (``register``) and chosen per step (``implementation_for``):

- ``"batched_mm"`` (transformers'): each (token, expert) pair's expert weights copied out, then one
  batched product. The batch-1 step's and a few rows' (where those copies are few), unless:
- ``DENSE`` (``dense_experts_forward``): every expert applied to every row in one batched product
  over the experts, the routing weights (zero for an expert a row did not pick) summing the rows'
  outputs: every expert's bytes once per step, and every expert's products for every row. The
  copies of "batched_mm" move as many bytes from about ``num_experts / (2 × top_k)`` rows up, so
  from there the rows step runs dense.
- ``GROUPED`` (``grouped_experts_forward``, where the step runs nvkit's kernels: ``StepVariant.experts``
  on a GPU): the pairs sorted by expert and each pair's row multiplied by its expert's weight read
  in place (``kernels.grouped_experts``): each picked expert's bytes once per step, no copies, only
  the products of the experts each row picked, in a few launches, at any row count.

Why not transformers' default, "grouped_mm": a CUDA graph capture refuses the copy between host
and device that torch's grouped product makes. Each implementation's sums are "batched_mm"'s in
another order (the zero terms add nothing); transformers' reference is in tests/generate/test_experts.py.
"""

from __future__ import annotations

DENSE = "nvkit_dense"
GROUPED = "nvkit_grouped"
_registered: list[bool] = []


def _weights(self):
    """The experts' first and second weights and biases (None without), whatever their names."""
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    return up, up_bias, self.down_proj, self.down_proj_bias if self.has_bias else None


def _activate(self, h):
    return self._apply_gate(h) if self.has_gate else self.act_fn(h)


def _expert_parallel(self) -> bool:
    return getattr(self, "_is_expert_parallel", False)


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts forward signature: ``hidden_states`` (tokens, hidden), each token's
    ``top_k_index`` and ``top_k_weights`` (tokens, top_k) -> (tokens, hidden)."""
    import torch
    if _expert_parallel(self):  # experts spread over devices: transformers' own way
        from transformers.integrations.moe import batched_mm_experts_forward
        return batched_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    tokens, hidden = hidden_states.shape
    experts = self.num_experts
    up, up_bias, down, down_bias = _weights(self)
    x = hidden_states.unsqueeze(0).expand(experts, tokens, hidden)
    h = torch.bmm(x, up if self.is_transposed else up.transpose(1, 2))          # (experts, tokens, 2I or I)
    if up_bias is not None:
        h = h + up_bias.unsqueeze(1)
    h = _activate(self, h)
    out = torch.bmm(h, down if self.is_transposed else down.transpose(1, 2))  # (experts, tokens, hidden)
    if down_bias is not None:
        out = out + down_bias.unsqueeze(1)
    if getattr(self, "has_post_expert_norm", False):  # an older transformers' experts have no such norm
        out = self.post_expert_norm(out)
    route = torch.zeros(tokens, experts, dtype=top_k_weights.dtype, device=hidden_states.device)
    route = route.scatter_add(1, top_k_index, top_k_weights)                   # (tokens, experts)
    return (out * route.t().unsqueeze(-1)).sum(0).to(hidden_states.dtype)


def grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The same signature as ``dense_experts_forward``, on nvkit's grouped kernel: the first product
    per (token, expert) pair, the model's own gate between, the second product, then each token's
    pairs weighted and summed as transformers' "batched_mm" sums them."""
    from ..kernels.grouped_experts import align, grouped_matmul
    if _expert_parallel(self):
        from transformers.integrations.moe import batched_mm_experts_forward
        return batched_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    up, up_bias, down, down_bias = _weights(self)
    ids, blocks = align(top_k_index, self.num_experts)
    flat = top_k_index.reshape(-1)
    h = grouped_matmul(hidden_states.to(up.dtype), up, ids, blocks, top_k, self.is_transposed)  # (pairs, 2I or I)
    if up_bias is not None:
        h = h + up_bias[flat]
    h = _activate(self, h)
    out = grouped_matmul(h.to(down.dtype), down, ids, blocks, 1, self.is_transposed)          # (pairs, hidden)
    if down_bias is not None:
        out = out + down_bias[flat]
    if getattr(self, "has_post_expert_norm", False):
        out = self.post_expert_norm(out)
    weighted = out * top_k_weights.reshape(-1).unsqueeze(-1)
    return weighted.view(tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def register() -> bool:
    """Register ``DENSE`` and ``GROUPED`` with transformers' experts implementations (once); False
    where this transformers has no such registry (its models then keep "batched_mm" in the steps)."""
    if not _registered:
        try:
            from transformers.integrations.moe import ExpertsInterface
            ExpertsInterface.register(DENSE, dense_experts_forward)
            ExpertsInterface.register(GROUPED, grouped_experts_forward)
            _registered.append(True)
        except (ImportError, AttributeError):
            _registered.append(False)
    return _registered[0]


def expert_count(cfg) -> int:
    """A text config's experts per layer (0: not a mixture of experts)."""
    return int(getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0)


def is_mixture(cfg) -> bool:
    """Whether a text config is a mixture of experts'."""
    return expert_count(cfg) > 0


def implementation_for(cfg, rows: int | None, grouped: bool = False) -> str:
    """The experts implementation a captured decode step of ``rows`` rows runs (``cfg``: the text
    config; ``rows`` None: the batch-1 step): ``GROUPED`` at any row count where ``grouped`` (the
    step runs nvkit's kernels); else dense from ``num_experts / (2 × top_k)`` rows up (see the
    module docstring), and "batched_mm" below that and at batch 1."""
    experts = expert_count(cfg)
    top_k = int(getattr(cfg, "num_experts_per_tok", None) or 1)
    if experts == 0 or not register():
        return "batched_mm"
    if grouped:
        return GROUPED
    if rows is None or 2 * rows * top_k < experts:
        return "batched_mm"
    return DENSE
