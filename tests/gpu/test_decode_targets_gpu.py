"""Issue 38's batch-1 decode targets as assertions: ``nvkit.benchmarks.decode.run`` on each shape,
the median of 3 alternating rounds in one process, as ``nvkit bench shape:NAME --decode`` reports
it, of the step a session keeps: the faster of the compiled ("fast") and the uncompiled
("fast+eager") step, which the compile policy measures against each other. The targets are the H200's (4.8 TB/s); another GPU is held to them scaled by its HBM bandwidth
(``benchmarks.families.bandwidth``), the same share of its roofline. They fail until the step
reaches them: `bash scripts/gpu_session.sh targets38` runs this file alone."""

import pytest

from tests import demo_model

H200_BANDWIDTH = 4.8e12
# (shape, prompt tokens, tok/s on the H200): issue 38's table
TARGETS = [("qwen3-0.6b", 64, 2400), ("llama-3.2-1b", 64, 1400), ("qwen3-4b", 64, 450), ("qwen3-0.6b", 8192, 1250)]
ADAPTER_SHARE = 0.9  # a LoRA adapter against the same shape's base step


def _scaled(target: float) -> float:
    import torch

    from nvkit.benchmarks.families import bandwidth
    bw = bandwidth(torch.device("cuda", torch.cuda.current_device()))
    assert bw, f"no bandwidth known for {torch.cuda.get_device_name()}: add it to families.NOMINAL_BANDWIDTH"
    return target * bw / H200_BANDWIDTH


def _rates(shape: str, prompt_len: int, paths: list[str]) -> dict:
    from nvkit.benchmarks import decode as bench_decode
    df = bench_decode.run(model=demo_model.shaped(shape), prompt_len=prompt_len, paths=paths, repeats=3)
    rates = {r["path"]: r["tokens_per_s"] for _, r in df.iterrows() if r["path"] in paths}
    assert set(rates) == set(paths) and all(v and v > 0 for v in rates.values()), df.to_string()
    return rates


@pytest.mark.parametrize("shape,prompt_len,target", TARGETS, ids=[f"{s}-{p}" for s, p, _ in TARGETS])
def test_batch1_decode_reaches_its_share_of_the_roofline(shape, prompt_len, target):
    rate = max(_rates(shape, prompt_len, ["fast", "fast+eager"]).values())
    want = _scaled(target)
    print(f"\n{shape}, {prompt_len}-token prompt: {rate:,.1f} tok/s (target {want:,.0f}; {target:,} on an H200)")
    assert rate >= want, (shape, prompt_len, rate, want)


@pytest.mark.parametrize("merged", [False, True], ids=["apart", "merged"])
def test_an_adapter_keeps_ninety_percent_of_the_base_rate(merged):
    """Unmerged (its products apart from the weights, issue 38's target) and merged into a copy
    (the batch-1 default where the copy fits, issue 39's)."""
    how = "" if merged else "+apart"
    rates = _rates("qwen3-0.6b", 64, ["fast", "fast+eager", f"fast lora{how}", f"fast lora+eager{how}"])
    base, tuned = max(rates["fast"], rates["fast+eager"]), max(rates[f"fast lora{how}"], rates[f"fast lora+eager{how}"])
    print(f"\nQwen3-0.6B with a LoRA r16 {'merged' if merged else 'unmerged'}: {tuned:,.1f} against {base:,.1f} "
          f"tok/s ({tuned / base:.0%})")
    assert tuned >= ADAPTER_SHARE * base, rates
