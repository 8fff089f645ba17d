"""Where a first request's wait went (``nvkit.generate.fast.cuda_graphs.Timings``) and how the stats
line says it. The parts are timed around the CUDA-graph capture, so their figures come from the
GPU tests (tests/gpu/test_fast_session_gpu.py); here the bookkeeping and the wording."""

import time

import pytest

from nvkit.generate.fast.cuda_graphs import PARTS, Timings
from nvkit.generate.stats import GenerationStats


def test_parts_sum_their_seconds_even_when_the_work_fails():
    t = Timings()
    with t.part("capture"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError):
        with t.part("capture"):
            time.sleep(0.02)
            raise RuntimeError("the capture failed")
    assert t["capture"] >= 0.04 and set(t) == {"capture"}


def test_since_keeps_only_what_was_added():
    t = Timings({"compile and warm-up": 9.0, "capture": 0.5})
    before = dict(t)
    t["prefill graphs"] += 0.3
    t["capture"] += 0.2
    added = t.since(before)
    assert dict(added) == pytest.approx({"prefill graphs": 0.3, "capture": 0.2})
    assert not t.since(dict(t)) and t.since(dict(t)).describe() == ""


def test_describe_follows_the_order_a_preparation_meets_and_leaves_out_crumbs():
    t = Timings({"prefill graphs": 1.96, "capture": 0.61, "compile artifacts from disk": 0.84,
                 "compile and warm-up": 9.12, "compile artifacts to disk": 0.01})
    assert t.describe() == ("compile artifacts from disk 0.8 s, compile and warm-up 9.1 s, capture 0.6 s, "
                            "prefill graphs 2.0 s")
    assert t.describe(at_least=0.0).endswith("compile artifacts to disk 0.0 s")
    assert list(PARTS).index("compile artifacts from disk") < list(PARTS).index("compile and warm-up")
    assert Timings({"something new": 1.0, "capture": 1.0}).describe() == "capture 1.0 s, something new 1.0 s"


def test_the_stats_line_says_where_the_wait_went_only_when_there_was_one():
    st = GenerationStats(new_tokens=256, seconds=14.6, time_to_first_token=14.4, path="fast", detail="fused step",
                         prepared="compile and warm-up 9.1 s, capture 0.6 s")
    assert str(st).endswith("· fast (fused step) · prepared first: compile and warm-up 9.1 s, capture 0.6 s")
    assert "prepared" not in str(GenerationStats(new_tokens=256, seconds=0.25, time_to_first_token=0.02, path="fast"))


def test_a_new_decoder_times_its_set_up_and_a_run_without_graphs_prepares_nothing():
    import torch

    import nvkit
    from nvkit.generate import fast
    from tests import demo_model  # noqa: E402
    s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    try:
        d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
        assert d.timings["set-up"] > 0 and d.timings.describe(at_least=0).startswith("set-up ")
        fast.swap(s, d)
        before = dict(d.timings)
        sampling, _ = fast.resolve(s.model, dict(max_new_tokens=8, do_sample=False))
        with torch.inference_mode():
            d.generate(s.tokenizer("Hello", return_tensors="pt")["input_ids"], sampling)
        assert not d.timings.since(before)  # no graph was captured, so no part took time
    finally:
        fast.forget(s)
        s.unload()


def test_a_capture_clears_the_cached_blas_workspaces_before_and_after(monkeypatch):
    """``own_blas_workspace`` (tests/gpu/test_cuda_graphs_gpu.py shows why on a GPU): the capture
    inside it finds no cached cuBLAS workspace, and nothing after it finds the capture's, also
    when the capture fails."""
    import torch

    from nvkit.generate.fast import cuda_graphs
    calls = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("clear"), raising=False)
    with cuda_graphs.own_blas_workspace():
        calls.append("capture")
    assert calls == ["clear", "capture", "clear"]
    calls.clear()
    with pytest.raises(RuntimeError):
        with cuda_graphs.own_blas_workspace():
            raise RuntimeError("the capture failed")
    assert calls == ["clear", "clear"]
    monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces")  # a torch without it (a CPU build): nothing to clear
    with cuda_graphs.own_blas_workspace():
        pass
