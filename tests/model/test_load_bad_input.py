"""``nvkit.load`` with wrong arguments: each is refused with NvkitError before the current session
is unloaded, so the demo session loaded for this file is still current and still generates."""

import os

import pytest

import nvkit
from nvkit.model.session import check_max_memory, resolve_device_map
from tests.refusals import refused

NO_CUDA = not __import__("torch").cuda.is_available()
cpu_only = pytest.mark.skipif(not NO_CUDA, reason="the case is about a machine without CUDA")
NOT_A_CHECKPOINT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "kernels")


CASES = [
    # what to load
    (dict(model=5), ["model must be 'demo'"]),
    (dict(model=""), ["model must be 'demo'"]),
    (dict(model="./no/such/checkpoint"), ["is not a checkpoint directory"]),
    (dict(model=NOT_A_CHECKPOINT), ["holds no config.json"]),
    (dict(model="no-such-org/no-such-model"), ["not a local directory", "HF_HUB_OFFLINE"]),
    # precision and placement
    (dict(dtype=5), ["dtype must be"]),
    (dict(dtype="int3"), ["Unknown dtype 'int3'"]),
    (dict(device_map=5), ["device_map must be"]),
    (dict(device_map="gpu"), ["Unknown device_map 'gpu'"]),
    (dict(device_map="cuda:x"), ["Bad device 'cuda:x'"]),
    pytest.param(dict(device_map="cuda"), ["needs a CUDA GPU"], marks=cpu_only),
    (dict(device_map={}), ["device_map dict is empty"]),
    (dict(device_map={"": 5.5}), ["device_map['']", "5.5 is not a device"]),
    (dict(device_map={"": "tpu"}), ["'tpu' is not a device"]),
    (dict(device_map={0: "cpu"}), ["device_map keys are module names"]),
    pytest.param(dict(device_map={"": 0}), ["no CUDA GPU is visible"], marks=cpu_only),
    # backends, kernels, quantization
    (dict(attn_implementation=5), ["attn_implementation must be"]),
    (dict(attn_implementation="bogus"), ["Unknown attention backend 'bogus'", "sdpa"]),
    (dict(attn_implementation="paged|sdpa"), ["continuous batching"]),
    (dict(quantization=5), ["quantization must be"]),
    (dict(quantization="int3"), ["Unknown quantization 'int3'"]),
    (dict(quantization={"method": "nf4", "bogus": 1}), ["bogus"]),
    (dict(use_kernels="yes"), ["use_kernels must be True or False"]),
    (dict(kernel_config=5), ["kernel_config must be"]),
    (dict(kernel_config={}), ["maps no layers"]),
    (dict(trust_remote_code="yes"), ["trust_remote_code must be True or False"]),
    # max_memory: keys and sizes
    (dict(max_memory={0: "-1GB"}), ["max_memory[0]", "'-1GB'", "20GiB"]),
    (dict(max_memory={"cpu": "lots"}), ["max_memory['cpu']", "'lots'"]),
    (dict(max_memory={"cpu": "20TiB"}), ["max_memory['cpu']", "GiB, MiB"]),
    (dict(max_memory={"cpu": -5}), ["max_memory['cpu']", "bytes ≥ 0"]),
    (dict(max_memory={"gpu0": "1GiB"}), ["'gpu0' is not a device key"]),
    (dict(max_memory={"cuda:0": "1GiB"}), ["write the GPU number: 0"]),
    (dict(max_memory={-1: "1GiB"}), ["GPU -1 does not exist"]),
    (dict(max_memory="20GiB"), ["max_memory must be a dict"]),
    (dict(max_memory={}), ["max_memory must be a dict"]),
    # from_pretrained keywords
    (dict(bogus=1), ["load() does not take 'bogus'", "max_memory", "revision"]),
    (dict(torch_dtype="float32"), ["use dtype="]),
    (dict(quantization_config=None), ["use quantization="]),
    (dict(output_loading_info=True), ["returns a Session"]),
]


@pytest.mark.parametrize("kwargs, words", CASES, ids=[str(c[0]) if isinstance(c, tuple) else str(c.values[0])
                                                      for c in CASES])
def test_load_refuses(survivor, kwargs, words):
    kwargs = dict(kwargs)
    model = kwargs.pop("model", "demo")
    refused(lambda: nvkit.load(model, **kwargs), *words, survivor=survivor)


def test_good_values_of_the_checked_arguments_pass():
    assert check_max_memory({"cpu": "2GiB", 0: 10**9, "disk": "1.5GB"}, "cpu") == {"cpu": "2GiB", 0: 10**9, "disk": "1.5GB"}
    assert check_max_memory(None, "cpu") is None
    assert resolve_device_map({"": "cpu"}) == ({"": "cpu"}, "cpu")
    assert resolve_device_map("cpu") == ("cpu", "cpu")


def test_config_fields_may_still_be_overridden(survivor):
    # a config field is a legitimate extra keyword (transformers sets it on the config)
    s = nvkit.load("demo", use_cache=True)
    try:
        assert s.model.config.use_cache is True and s.generate("NVIDIA GPUs are", max_new_tokens=2)
    finally:
        s.unload()
    survivor.session = nvkit.load("demo")   # the file's session again, for the cases that follow
    survivor.check()
