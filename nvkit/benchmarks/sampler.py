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

    Decoding goes through the path users get by default (the fast path on CUDA); EOS is set to an
    id the model cannot produce, so every round decodes ``new_tokens``. ``noise`` is the spread of
    the rounds without the sampler ((max - min) / median): a ``difference`` inside it is not one
    the sampler caused. (A first H200 run forced plain ``generate`` with ``min_new_tokens``: 14.8
    against 14.5 tok/s, +1.97 %, on a path whose host loop is the bottleneck.)"""
    from ..demo import SHAPES, shaped
    from ..model.session import load
    s = load(shaped(model) if model.lower() in SHAPES else model)
    never = int(s.model.config.get_text_config().vocab_size)
    prompt = "NVIDIA GPUs are " * 16
    s.generate(prompt, max_new_tokens=new_tokens, eos_token_id=never)  # warm-up: capture, kernels, allocator
    smp = Sampler(rate_hz=rate_hz)
    off, on = [], []
    path = None
    for _ in range(rounds):
        for with_sampler in (False, True):
            if with_sampler:
                smp.start()
            s.generate(prompt, max_new_tokens=new_tokens, eos_token_id=never)
            if with_sampler:
                smp.stop()
            (on if with_sampler else off).append(s.last_stats.tokens_per_second)
            path = s.last_stats.path
    s.unload()
    a, b = float(np.median(off)), float(np.median(on))
    return {"model": model, "rate_hz": rate_hz, "path": path, "tok_s_without": a, "tok_s_with": b,
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
    print(f"{r['model']}: {r['tok_s_without']:.1f} tok/s without the sampler, {r['tok_s_with']:.1f} with it at "
          f"{r['rate_hz']:g} Hz on the {r['path']} path: {r['difference']:+.2%} (rounds spread {r['noise']:.2%}; "
          f"{r['seconds_per_sample'] * 1e6:.0f} µs per sample, {r['core_share']:.3%} of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
