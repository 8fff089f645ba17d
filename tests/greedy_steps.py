"""What the step tests share: a decode step run greedily from the token in its cache."""


def greedy_logits(step, cache, steps: int):
    """``steps`` calls of ``step`` (a batch-1 decode step over ``cache``), each fed the argmax of
    the one before through ``cache.tok``: their logits, stacked (steps, vocab)."""
    import torch
    rows = []
    with torch.inference_mode():
        for _ in range(steps):
            out = step(cache.tok)
            rows.append(out.clone())
            cache.tok.copy_(out.argmax(-1).view(1, 1))
    return torch.cat(rows)
