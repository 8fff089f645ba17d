"""``nvkit.estimate`` with wrong arguments: NvkitError naming the argument and what it takes (the
estimate never downloads, so an unknown model is an error too); the demo session is untouched."""

import os

import pytest

import nvkit
from tests.refusals import refused

NOT_A_CHECKPOINT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "kernels")


CASES = [
    (dict(model=5), ["estimate needs a model", "'demo'"]),
    (dict(model=""), ["estimate needs a model"]),
    (dict(model="no-such-org/no-such-model"), ["No config for 'no-such-org/no-such-model'", "never downloads"]),
    (dict(model=NOT_A_CHECKPOINT), ["holds no config.json"]),
    (dict(dtype=5), ["dtype must be 'bfloat16', 'float16' or 'float32'"]),
    (dict(dtype="int3"), ["dtype must be"]),
    (dict(dtype=[]), ["dtype must be"]),
    (dict(quantization=5), ["quantization must be None, 'nf4', 'fp4' or 'int8'"]),
    (dict(quantization="int4"), ["quantization must be"]),
    (dict(quantization=[]), ["quantization must be"]),
    (dict(mode="train"), ["mode must be 'inference' or 'lora'"]),
    (dict(mode=[]), ["mode must be"]),
    (dict(batch_size=0), ["batch_size must be a whole number ≥ 1"]),
    (dict(batch_size=1.5), ["batch_size must be a whole number"]),
    (dict(seq_len=True), ["seq_len must be a whole number"]),
    (dict(mode="lora", lora_r=0), ["lora_r must be a whole number ≥ 1"]),
    (dict(gradient_checkpointing="yes"), ["gradient_checkpointing must be True or False"]),
    (dict(prompt_len=-1), ["prompt_len must be a whole number ≥ 1"]),
    (dict(prompt_len=2048, seq_len=1024), ["prompt_len (2048) cannot exceed seq_len (1024)"]),
    (dict(device="gpu"), ["device must be 'cuda' or 'cpu'"]),
    (dict(device=[]), ["device must be 'cuda' or 'cpu'"]),
    (dict(path="fast"), ["path must be 'plain' or 'nvkit'"]),
]


@pytest.mark.parametrize("kwargs, words", CASES, ids=[str(k) for k, _ in CASES])
def test_estimate_refuses(survivor, kwargs, words):
    refused(lambda: nvkit.estimate(**kwargs), *words, survivor=survivor)


def test_a_good_estimate_still_comes(survivor):
    e = nvkit.estimate("demo", dtype="float32", device="cpu")
    assert e.total > 0 and "weights" in e.parts
    assert nvkit.estimate(survivor.session, mode="lora", batch_size=2, seq_len=64).total > 0
