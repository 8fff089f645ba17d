"""``nvkit.generate.kernels.grouped_experts``: the pairs' layout in blocks of one expert (``align``,
plain torch) and the grouped product against each pair's product in torch, run by Triton's
interpreter on the CPU (TRITON_INTERPRET=1 must be set before triton is imported: hence a child
process), in float32 (the interpreter gets a bf16 ``tl.dot`` wrong; bf16 runs on the GPU:
tests/gpu/test_families_gpu.py). The experts' forward on it against transformers' "batched_mm":
tests/generate/test_experts.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret  # noqa: E402


@pytest.mark.parametrize("tokens, top_k, experts, block", [(1, 8, 64, 16), (7, 2, 4, 16), (33, 2, 8, 4), (0, 2, 4, 16)])
def test_the_grouped_layout_puts_each_pair_once_in_a_block_of_its_own_expert(tokens, top_k, experts, block):
    from nvkit.generate.kernels.grouped_experts import align
    rng = torch.Generator().manual_seed(tokens)
    index = torch.stack([torch.randperm(experts, generator=rng)[:top_k] for _ in range(tokens)]) if tokens else \
        torch.zeros((0, top_k), dtype=torch.long)
    ids, blocks = align(index, experts, block)
    pairs = tokens * top_k
    # fixed sizes: every expert may need a padded block, whatever the routing (one token: a block a pair)
    slots = top_k * block if tokens == 1 else -(-(pairs + experts * (block - 1)) // block) * block
    assert ids.numel() == slots == blocks.numel() * block
    real = ids[ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs)) and (ids[ids >= pairs] == pairs).all()
    flat = index.reshape(-1)
    for b, e in enumerate(blocks.tolist()):
        rows = ids[b * block:(b + 1) * block]
        rows = rows[rows < pairs]
        if e < 0:
            assert rows.numel() == 0  # past the last block
        else:
            assert (flat[rows] == e).all() and rows.numel() > 0  # one expert's, never empty
            assert rows.tolist() == sorted(rows.tolist())  # a token's pairs in the order they come
    used = [e for e in blocks.tolist() if e >= 0]
    if tokens == 1:  # one token's pairs: a block each, in their order (no sort)
        assert used == flat.tolist() and blocks.numel() == top_k
    else:
        assert used == sorted(used) and set(used) == set(flat.tolist())


def test_the_grouped_product_is_each_pairs_row_times_its_experts_weight():
    """Both weight layouts, the first product (a token's row for each of its pairs) and the second
    (each pair's own row), one expert holding more rows than a block, outputs wider than a program's
    and inputs not a multiple of its step; wrong shapes refused."""
    out = interpret("""
        import torch
        from nvkit.generate.kernels.grouped_experts import align, grouped_matmul
        torch.manual_seed(0)
        for tokens, top_k, experts, n, k in ((1, 2, 8, 70, 40), (40, 2, 3, 130, 72), (5, 1, 4, 16, 16)):
            index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
            ids, blocks = align(index, experts)
            w = torch.randn(experts, n, k)
            for row_div in (top_k, 1):
                x = torch.randn(tokens * top_k // row_div, k)
                want = torch.stack([w[index[p // top_k, p % top_k]] @ x[p // row_div] for p in range(tokens * top_k)])
                for transposed in (False, True):
                    weight = w.transpose(1, 2).contiguous() if transposed else w
                    got = grouped_matmul(x, weight, ids, blocks, row_div, transposed)
                    assert got.shape == (tokens * top_k, n), got.shape
                    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (tokens, row_div, transposed)
        from tests.triton_interpreter import refused
        ids, blocks = align(torch.tensor([[0, 1]]), 4)
        refused(lambda: grouped_matmul(torch.ones(1, 5), torch.ones(4, 8, 6), ids, blocks, 2), "a wrong width")
        refused(lambda: grouped_matmul(torch.ones(1, 6), torch.ones(4, 8, 6, dtype=torch.float64), ids, blocks, 2),
                "mixed dtypes")
        refused(lambda: grouped_matmul(torch.ones(1, 6), torch.ones(4, 8, 6), ids[:-1], blocks, 2), "short ids")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 3, out
