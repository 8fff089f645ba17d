"""Quantization: bitsandbytes nf4 / int8 really load and generate on the CPU (0.50+), the
footprint is reported and measured, and bad choices leave the session usable."""

import io
from contextlib import redirect_stdout

import pytest

import nvkit
from nvkit import NvkitError
from nvkit.model.quant import quantization_config
from nvkit.model.session import load, session
from tests import demo_model  # noqa: E402


def test_methods_table():
    t = nvkit.quantization_methods("cpu")
    assert [c.name for c in t][:3] == ["nf4", "fp4", "int8"]
    assert all(t[m].available and "bitsandbytes" in t[m].source for m in ("nf4", "fp4", "int8"))
    assert not t["torchao-int4"].available and "torchao" in t["torchao-int4"].reason
    assert not t["quanto-int8"].available and "QuantoConfig" in t["quanto-int8"].reason


def test_config_options():
    import torch
    c = quantization_config("nf4", torch.bfloat16)
    assert c.load_in_4bit and c.bnb_4bit_quant_type == "nf4" and c.bnb_4bit_use_double_quant
    assert c.bnb_4bit_compute_dtype == torch.bfloat16
    c = quantization_config({"method": "fp4", "double_quant": False, "compute_dtype": "float16"}, torch.float32)
    assert c.bnb_4bit_quant_type == "fp4" and not c.bnb_4bit_use_double_quant and c.bnb_4bit_compute_dtype == torch.float16
    assert quantization_config("INT8", torch.float32).load_in_8bit
    assert quantization_config(c, torch.float32) is c  # a transformers config passes through


@pytest.mark.parametrize("bad, match", [
    ("nf3", "Unknown quantization 'nf3'"),
    ("torchao-int4", "Known but not shipped: torchao-int4"),
    ({"double_quant": False}, "needs a 'method'"),
    ({"method": "nf4", "colour": 1}, "Unknown 4-bit option"),
    ({"method": "int8", "double_quant": False}, "int8 takes no options"),
    ({"method": "nf4", "double_quant": "yes"}, "double_quant must be True or False"),
    ({"method": "nf4", "compute_dtype": "int8"}, "Unknown dtype"),
    (42, "quantization must be"),
])
def test_bad_values(bad, match):
    import torch
    with pytest.raises(NvkitError, match=match):
        quantization_config(bad, torch.float32)


@pytest.fixture(scope="module")
def base():
    s = load(demo_model.path())
    info = s.info
    out = s.generate("NVIDIA GPUs are", max_new_tokens=8)
    s.unload()
    return info, out


@pytest.mark.parametrize("method, layer", [("nf4", "Linear4bit"), ("int8", "Linear8bitLt")])
def test_bnb_loads_and_generates_on_cpu(base, method, layer):
    info0, _ = base
    s = load(demo_model.path(), quantization=method)
    try:
        info = s.info
        assert info["quantization"] == method
        assert type(s.model.model.layers[0].mlp.up_proj).__name__ == layer
        assert info["footprint_bytes"] < info0["footprint_bytes"]
        assert info["measured_bytes"] is not None and info["measured_bytes"] >= 0
        out = s.generate("NVIDIA GPUs are", max_new_tokens=8)
        assert isinstance(out, str) and s.last_stats.new_tokens == 8
    finally:
        s.unload()


def test_bad_quant_leaves_session_usable():
    s = load(demo_model.path())
    try:
        with pytest.raises(NvkitError, match="Unknown quantization"):
            load(demo_model.path(), quantization="q2")
        assert session() is s and s.generate("NVIDIA", max_new_tokens=3)
    finally:
        s.unload()


def test_magic_load_with_quant():
    from nvkit.magics import run_line
    buf = io.StringIO()
    with redirect_stdout(buf):
        run_line(f"load {demo_model.path()} --quant nf4 --attn eager --device-map cpu")
    s = session()
    try:
        assert s.info["quantization"] == "nf4" and s.info["attention"] == "eager" and "nf4" in buf.getvalue()
    finally:
        s.unload()


def test_auto_dtype_is_float16_for_int8_on_a_gpu_and_a_named_dtype_is_kept():
    import torch
    from transformers import BitsAndBytesConfig

    from nvkit.model.precision import load_dtype
    h200 = (9, 0)
    assert load_dtype("auto", "cuda", h200) == torch.bfloat16
    for int8 in ("int8", {"method": "int8"}, BitsAndBytesConfig(load_in_8bit=True)):
        assert load_dtype("auto", "cuda", h200, int8) == torch.float16  # LLM.int8() multiplies in fp16
        assert load_dtype("bfloat16", "cuda", h200, int8) == torch.bfloat16  # as the user named it
        assert load_dtype("auto", "cpu", None, int8) == torch.float32
    assert load_dtype("auto", "cuda", h200, "nf4") == torch.bfloat16
    with pytest.raises(NvkitError, match="dtype"):
        load_dtype("int8", "cuda", h200, "int8")
