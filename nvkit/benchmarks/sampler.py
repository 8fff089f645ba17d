"""The memory sampler's cost: decode tokens/s with and without it, alternating rounds in one process
(``python -m nvkit.benchmarks.sampler``; on a GPU machine)."""

from __future__ import annotations

import sys

import numpy as np

from ..memory.sampling import DEFAULT_RATE_HZ, Sampler


def overhead_benchmark(model: str = "qwen3-0.6b", new_tokens: int = 256, rounds: int = 5,
                       rate_hz: float = DEFAULT_RATE_HZ) -> dict:
    """Decode tokens/s of ``model`` (a shape name or anything ``nvkit.load`` takes) with and
    without the sampler running at ``rate_hz``, alternating rounds so drift hits both alike.

    Decoding goes through the path users get by default (the fast path on CUDA, which honours
    ``min_new_tokens`` as plain ``generate`` does), so every round decodes exactly ``new_tokens``
    (``tokens``: the fewest any round produced). The rates are decode rates (the tokens after the
    first, over the time after it). ``noise`` is the spread of the rounds without the sampler
    ((max - min) / median): a ``difference`` inside it is not one the sampler caused."""
    from ..demo import SHAPES
    from ..errors import require
    from ..model.session import load
    require(isinstance(new_tokens, int) and not isinstance(new_tokens, bool) and new_tokens >= 2,
            f"new_tokens must be a whole number ≥ 2 (a decode rate needs a token after the first), not {new_tokens!r}.")
    from .shapes import shape_folder
    s = load(shape_folder(model) if model.lower() in SHAPES else model)
    prompt = "NVIDIA GPUs are " * 16
    exact = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    s.generate(prompt, **exact)  # warm-up: capture, kernels, allocator
    smp = Sampler(rate_hz=rate_hz)
    off, on, produced = [], [], []
    path = how = None
    for _ in range(rounds):
        for with_sampler in (False, True):
            if with_sampler:
                smp.start()
            s.generate(prompt, **exact)
            if with_sampler:
                smp.stop()
            st = s.last_stats
            (on if with_sampler else off).append(st.decode_tokens_per_second or float("nan"))
            produced.append(st.new_tokens)
            path, how = st.path, st.how
    s.unload()
    a, b = float(np.median(off)), float(np.median(on))
    return {"model": model, "rate_hz": rate_hz, "path": path, "how": how, "tokens": min(produced), "tok_s_without": a, "tok_s_with": b,
            "difference": (a - b) / a if a else float("nan"),
            "noise": (max(off) - min(off)) / a if a else float("nan"), **smp.overhead()}


def _main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m nvkit.benchmarks.sampler", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE_HZ)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    r = overhead_benchmark(a.model, a.tokens, a.rounds, a.rate)
    print(f"{r['model']}: {r['tok_s_without']:.1f} tok/s decode without the sampler, {r['tok_s_with']:.1f} with it at "
          f"{r['rate_hz']:g} Hz, {r['tokens']} tokens per round, on {r['how']}: {r['difference']:+.2%} (rounds spread {r['noise']:.2%}; "
          f"{r['seconds_per_sample'] * 1e6:.0f} µs per sample, {r['core_share']:.3%} of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())

