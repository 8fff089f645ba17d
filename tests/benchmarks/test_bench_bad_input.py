"""``nvkit.bench`` (and its decode and LoRA forms) with wrong arguments: NvkitError before the bench
unloads anything, so the demo session loaded for this file still generates."""

import os

import pytest

import nvkit
from tests.refusals import refused

NOT_A_CHECKPOINT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "kernels")


CASES = [
    (dict(backends=[]), ["backends must be a non-empty list"]),
    (dict(backends=[5]), ["backends: each entry must be a name"]),
    (dict(quantizations=[5]), ["quantizations: each entry must be a name or None"]),
    (dict(prompt_len=0), ["prompt_len must be a whole number ≥ 1"]),
    (dict(new_tokens=True), ["new_tokens must be a whole number"]),
    (dict(batch_size=-1), ["batch_size must be a whole number ≥ 1"]),
    (dict(repeats=0), ["repeats must be a whole number ≥ 1"]),
    (dict(seed="x"), ["seed must be a whole number"]),
    (dict(seed=True), ["seed must be a whole number"]),
    (dict(seed=-1), ["seed must be a whole number from 0"]),
    (dict(model=5), ["model must be 'demo'"]),
    (dict(model="no-such-org/no-such-model"), ["nvkit.bench could not read the config of 'no-such-org/no-such-model'"]),
    (dict(model=NOT_A_CHECKPOINT), ["holds no config.json"]),
    (dict(dtype="x"), ["Unknown dtype 'x'"]),
    (dict(device_map="x"), ["Unknown device_map 'x'"]),
    (dict(decode="x"), ["decode and lora must be True or False"]),
    (dict(decode=True, lora=True), ["Choose one"]),
    (dict(bogus=1), ["Unknown bench option bogus"]),
    (dict(decode=True, paths=[5]), ["paths must be a non-empty list of benchmark path names"]),
    (dict(decode=True, paths=[]), ["paths must be a non-empty list"]),
    (dict(decode=True, paths=["warp-speed"]), ["Unknown benchmark path(s) ['warp-speed']"]),
    (dict(decode=True, new_tokens=1), ["new_tokens must be a whole number ≥ 2"]),
    (dict(decode=True, k_steps=0), ["k_steps must be a whole number from 1 to 64"]),
    (dict(decode=True, seed=-3), ["seed must be a whole number from 0"]),
]


@pytest.mark.parametrize("kwargs, words", CASES, ids=[str(k) for k, _ in CASES])
def test_bench_refuses(survivor, kwargs, words):
    refused(lambda: nvkit.bench(**kwargs), *words, survivor=survivor)


LORA = [
    (dict(steps=0), ["steps must be a whole number ≥ 1"]),
    (dict(warmup=-1), ["warmup must be a whole number ≥ 0"]),
    (dict(warmup=True), ["warmup must be a whole number"]),
    (dict(variants=[5]), ["variants must be a list of variant names"]),
    (dict(variants=["turbo"]), ["Unknown variant(s) ['turbo']"]),
    (dict(device="tpu"), ["device must be 'cuda' or 'cpu'"]),
    (dict(model=5), ["model must be a shape name"]),
]


@pytest.mark.parametrize("kwargs, words", LORA, ids=[str(k) for k, _ in LORA])
def test_lora_bench_refuses(survivor, kwargs, words):
    from nvkit.benchmarks import lora
    refused(lambda: lora.run(**kwargs), *words, survivor=survivor)


def test_a_fast_path_variant_names_its_options_and_a_typo_is_refused():
    """``--paths "fast,fast+forward"`` compares the fused step with the model's own forward in one
    process (the family table's ≥ 15 % rule); an unknown option is refused, not measured as the default."""
    from nvkit.benchmarks.decode import fast_options
    from nvkit.errors import NvkitError
    assert fast_options("fast+forward")["fused"] is False and "fused" not in fast_options("fast")
    assert fast_options("fast+forward+eager")["compile"] is False
    with pytest.raises(NvkitError, match="Unknown fast-path option 'foward'"):
        fast_options("fast+foward")
