"""What the step tests share: a batch-1 cache at a position, and a decode step run greedily from
the token in its cache."""


def cache_at(model, fw, length: int = 32, pos: int = 3, tok: int = 5):
    """A batch-1 static cache of ``length`` positions for ``model`` (its ``FusedWeights`` ``fw``,
    the rotary tables filled) at position ``pos`` with ``tok`` as the next input, on the CPU."""
    import torch

    from nvkit.generate.fast.static_cache import new_cache
    c = new_cache(model, fw, length, 1, torch.device("cpu"))
    fw.rotary_for(c, length)
    c.tok.fill_(tok)
    c.pos.fill_(pos)
    return c


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
