"""Attention backends: the reasons are specific, nothing falls back silently, a bad choice leaves
the current session usable."""

import io
import json
import os
from contextlib import redirect_stdout

import pytest

import nvkit
from nvkit import NvkitError
from nvkit.model import backends as B
from nvkit.model.session import load, session
from tests import demo_model  # noqa: E402


def fake_gpu(monkeypatch, capability, name="Fake GPU"):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", json.dumps([{"capability": list(capability), "name": name}]))


def test_cpu_table_is_honest():
    t = nvkit.attention_backends("cpu")
    assert [c.name for c in t] == list(B.NAMES)
    assert t["eager"].available and t["sdpa"].available and t["sdpa"].source == "built-in"
    for fa in ("flash_attention_2", "flash_attention_3", "flash_attention_4"):
        assert not t[fa].available and "needs a CUDA GPU" in t[fa].reason
    # flex_attention really runs on the CPU (compiled); the reason says it is slow there
    assert "CPU" in t["flex_attention"].reason
    assert "flash_attention_2" in str(t) and "<table" in t._repr_html_()


def test_old_gpu_is_named_with_its_capability(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    t = nvkit.attention_backends("cuda")
    assert "Ampere" in t["flash_attention_2"].reason and "7.5" in t["flash_attention_2"].reason
    assert "Tesla T4" in t["flash_attention_3"].reason
    assert "Hopper" in t["flash_attention_4"].reason and "9.0" in t["flash_attention_4"].reason


def test_hopper_offline_without_cache_names_the_hub_repo(monkeypatch, tmp_path):
    fake_gpu(monkeypatch, (9, 0), "H200")
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    t = nvkit.attention_backends(0)
    c = t["flash_attention_2"]
    assert not c.available and c.source == "Hub kernel kernels-community/flash-attn2"
    assert "flash-attn is not installed" in c.reason and "HF_HUB_OFFLINE" in c.reason and "LOCAL_KERNELS" in c.reason
    assert "kernels-community/vllm-flash-attn3" in t["flash_attention_3"].reason
    assert "nvkit[fa4]" in t["flash_attention_4"].reason


def test_cached_and_local_kernels_make_fa_available(monkeypatch, tmp_path):
    fake_gpu(monkeypatch, (9, 0))
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    repo = tmp_path / "kernels--kernels-community--flash-attn2"
    (repo / "refs").mkdir(parents=True)
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs" / "v4").write_text("abc123")
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path))
    c = nvkit.attention_backends("cuda:0")["flash_attention_2"]
    assert c.available and "(cached)" in c.source
    # the wrong major version in the cache does not count
    (repo / "refs" / "v4").rename(repo / "refs" / "v3")
    assert not nvkit.attention_backends("cuda:0")["flash_attention_2"].available
    kdir = tmp_path / "fa3"
    kdir.mkdir()
    monkeypatch.setenv("LOCAL_KERNELS", f"kernels-community/vllm-flash-attn3={kdir}")
    c3 = nvkit.attention_backends("cuda:0")["flash_attention_3"]
    assert c3.available and str(kdir) in c3.source
    assert B.resolve_attention("flash_attention_3", "cuda") == "flash_attention_3"
    # sdpa measured fastest on the H200 (see nvkit.backends), so "auto" takes it even with FA3 here;
    # without it the FlashAttention backends follow in their order, and what is unavailable is passed over
    assert B.resolve_attention("auto", "cuda") == "sdpa"
    monkeypatch.setattr(B, "AUTO_ORDER", tuple(n for n in B.AUTO_ORDER if n != "sdpa"))
    assert B.resolve_attention("auto", "cuda") == "flash_attention_3"


def test_kernels_outside_transformers_range_is_said(monkeypatch):
    fake_gpu(monkeypatch, (9, 0))
    real = B.package_version
    monkeypatch.setattr(B, "package_version", lambda d: "0.18.1" if d == "kernels" else real(d))
    r = nvkit.attention_backends("cuda")["flash_attention_2"].reason
    assert "0.18.1" in r and "silently disables" in r
    monkeypatch.setattr(B, "package_version", lambda d: None if d == "kernels" else real(d))
    assert "`kernels` package is not installed" in nvkit.attention_backends("cuda")["flash_attention_2"].reason


def test_cuda_index_beyond_the_visible_gpus(monkeypatch):
    fake_gpu(monkeypatch, (9, 0))
    with pytest.raises(NvkitError, match="cuda:3 does not exist"):
        nvkit.attention_backends("cuda:3")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", True, 1.5])
def test_bad_device(bad):
    with pytest.raises(NvkitError, match="device must be"):
        nvkit.attention_backends(bad)


def test_resolve_no_silent_fallback():
    assert B.resolve_attention("auto", "cpu") == "sdpa"
    assert B.resolve_attention("eager", "cpu") == "eager"
    with pytest.raises(NvkitError) as e:
        B.resolve_attention("flash_attention_2", "cpu")
    assert "needs a CUDA GPU" in str(e.value) and "Backends that work here: eager, sdpa" in str(e.value)
    with pytest.raises(NvkitError, match="Unknown attention backend 'flash'"):
        B.resolve_attention("flash", "cpu")
    with pytest.raises(NvkitError, match="paged"):
        B.resolve_attention("paged|sdpa", "cpu")
    with pytest.raises(NvkitError, match="needs a CUDA GPU"):
        B.resolve_attention("kernels-community/flash-attn2", "cpu")
    for bad in (None, "", 3):
        with pytest.raises(NvkitError, match="attn_implementation must be"):
            B.resolve_attention(bad, "cpu")


@pytest.fixture(scope="module")
def s():
    sess = load(demo_model.path())
    yield sess
    sess.unload()


def test_load_with_unavailable_backend_keeps_session(s):
    before = s.generate("NVIDIA GPUs are", max_new_tokens=5)
    with pytest.raises(NvkitError, match="Backends that work here"):
        load(demo_model.path(), attn_implementation="flash_attention_4")
    assert session() is s and s.loaded
    assert s.generate("NVIDIA GPUs are", max_new_tokens=5) == before


def test_set_attention_switches_and_refuses(s):
    ref = s.generate("NVIDIA GPUs are", max_new_tokens=6)
    assert s.set_attention("eager") == "eager" and s.info["attention"] == "eager"
    assert s.generate("NVIDIA GPUs are", max_new_tokens=6) == ref
    with pytest.raises(NvkitError, match="can't be used here"):
        s.set_attention("flash_attention_3")
    assert s.info["attention"] == "eager"
    assert s.set_attention("auto") == "sdpa" and s.info["attention"] == "sdpa"


def test_load_auto_and_eager():
    s2 = load(demo_model.path(), attn_implementation="auto")
    try:
        assert s2.info["attention"] == "sdpa"
    finally:
        s2.unload()


def test_magic_backends_prints_both_tables():
    from nvkit.magics import run_line
    buf = io.StringIO()
    with redirect_stdout(buf):
        run_line("backends --device cpu")
    out = buf.getvalue()
    assert "flash_attention_4" in out and "needs a CUDA GPU" in out and "nf4" in out
    with pytest.raises(NvkitError, match="device must be"):
        run_line("backends --device tpu")
