"""nvkit.memory on the CPU: ring buffers, the sampler, events, the report, verified unload, OOM text."""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from nvkit.benchmarks import sampler as sampler_bench
import nvkit
from nvkit import events, memory
from nvkit.errors import NvkitError

from tests import demo_model
from tests.memory_fixtures import fake_gpus, no_gpus  # noqa: F401 (pytest fixtures)


@pytest.fixture(scope="module")
def tiny_dir():
    """The shipped demo checkpoint: small enough that load/unload numbers come fast on a CPU."""
    return demo_model.path()


# --- ring buffer --------------------------------------------------------------------------------

def test_ring_buffer_keeps_the_newest_values_in_order():
    rb = memory.RingBuffer(4)
    assert len(rb) == 0 and rb.values().dtype == np.float64 and rb.values().size == 0
    for v in range(3):
        rb.append(v)
    assert rb.values().tolist() == [0, 1, 2]
    for v in range(3, 11):
        rb.append(v)
    assert len(rb) == 4
    assert rb.values().tolist() == [7, 8, 9, 10]
    rb.clear()
    assert len(rb) == 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", None])
def test_ring_buffer_rejects_bad_capacity(bad):
    with pytest.raises(NvkitError, match="capacity"):
        memory.RingBuffer(bad)


def test_sampler_buffers_are_bounded(no_gpus):
    s = memory.Sampler(rate_hz=20, window_s=1)
    assert s.capacity == 21
    for _ in range(100):
        s.sample()
    t, y = s.series("rss")
    assert len(t) == len(y) == 21
    assert np.all(np.diff(t) >= 0) and np.all(y > 0)


# --- sampler ---------------------------------------------------------------------------------------

def test_sampler_on_cpu_samples_rss_and_stops(no_gpus):
    s = memory.Sampler(rate_hz=20, window_s=10)
    assert s.devices == []
    s.start()
    try:
        time.sleep(0.6)
        assert s.running
    finally:
        s.stop()
    assert not s.running
    n = len(s)
    assert 4 <= n <= 20, n
    time.sleep(0.2)
    assert len(s) == n  # stopped means stopped
    t, y = s.series("rss")
    assert t.dtype == np.float64 and y.dtype == np.float64
    assert y.min() > 10 * 2**20  # a Python process with numpy holds more than 10 MiB
    assert s.peak("rss") == pytest.approx(y.max())
    with pytest.raises(NvkitError, match="no 'nvml_used' series"):
        s.series("nvml_used", 0)


def test_sampler_with_fake_gpus_samples_each_gpu(fake_gpus):
    s = memory.Sampler(rate_hz=5)
    assert [d.cuda_index for d in s.devices] == [0, 1]
    for _ in range(3):
        s.sample()
    for i in (0, 1):
        t, used = s.series("nvml_used", i)
        assert len(used) == 3 and np.all(used >= 512 * 2**20)
        _, alloc = s.series("torch_allocated", i)
        assert np.all(alloc == 0)  # no CUDA context in this process
    only = memory.Sampler(devices=[1])
    assert [d.cuda_index for d in only.devices] == [1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(rate_hz=0), "rate_hz"), (dict(rate_hz=21), "rate_hz"), (dict(rate_hz="5"), "rate_hz"),
    (dict(window_s=0), "window_s"), (dict(devices=[7]), "No cuda:7"), (dict(devices="0"), "devices"),
])
def test_sampler_rejects_bad_arguments(fake_gpus, kwargs, match):
    with pytest.raises(NvkitError, match=match):
        memory.Sampler(**kwargs)


def test_set_rate_validates(no_gpus):
    s = memory.Sampler()
    s.set_rate(20)
    assert s.rate_hz == 20
    with pytest.raises(NvkitError):
        s.set_rate(100)


def test_shared_sampler_is_one_thread(no_gpus):
    a = memory.sampler(rate_hz=10)
    b = memory.sampler()
    assert a is b and a.running and a.rate_hz == 10
    c = memory.sampler(window_s=600)  # a longer window replaces it
    assert c is not a and c.window_s == 600 and not a.running


# --- events ----------------------------------------------------------------------------------------

def test_events_and_marks_are_recorded_in_order():
    t0 = events.now()
    nvkit.mark("before LoRA")
    events.record("train-step", "step 1")
    evs = events.events(since=t0)
    assert [(e.kind, e.text) for e in evs][-2:] == [("mark", "before LoRA"), ("train-step", "step 1")]
    assert evs[-1].t >= evs[-2].t >= t0
    for bad in ("", "   ", None, 3):
        with pytest.raises(NvkitError):
            nvkit.mark(bad)


def test_start_and_end_events_record_a_comparison(no_gpus):
    est = nvkit.estimate("qwen3-tiny", device="cpu")
    memory.expect(est)
    try:
        events.record("generate-start", "test")
        assert memory.open_since() is not None
        blob = np.ones(8 * 2**20)  # 64 MiB, touched: the process grows while the "generation" runs
        events.record("generate-end", "test")
        c = memory.last_comparison()
        assert c.what == "generate" and c.device == "cpu"
        assert c.predicted == est.total and c.measured >= 32 * 2**20 and c.error is not None  # the growth, not all RSS
        del blob
        df = memory.comparisons()
        assert list(df.columns)[:7] == ["what", "device", "t_start", "t_end", "predicted", "measured", "error"]
        assert memory.open_since() is None
    finally:
        memory.expect(None)
    with pytest.raises(NvkitError, match="Estimate"):
        memory.expect(123)


def test_cpu_training_window_counts_from_where_the_work_starts(no_gpus):
    """A CPU run's measurement starts where its work does (``cpu_work_starts``, called by the
    fine-tune's worker before the training loop): what the process took on before (imports, the
    trainer) is not counted, and a peak freed before the run ends still is (the kernel's record)."""
    from nvkit.memory import peaks, usage
    if not usage.reset_rss_peak():
        pytest.skip("no resettable peak-RSS record (/proc/self/clear_refs) on this system")
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()  # a loaded model's weights would be added to the growth
    MiB = 2**20
    events.record("train-start", "test")
    setup = np.ones(8 * MiB)       # 64 MiB taken before the work starts: not the run's
    peaks.cpu_work_starts("train")
    work = np.ones(4 * MiB)        # 32 MiB, touched, then freed before the run ends
    del work
    events.record("train-end", "test")
    c = memory.last_comparison()
    assert c.what == "train" and c.device == "cpu"
    assert 30 * MiB <= c.measured < 60 * MiB, c.measured / MiB
    del setup


# --- report ----------------------------------------------------------------------------------------

def test_report_columns_on_fake_gpus(fake_gpus):
    df = nvkit.memory_report()
    assert list(df.index) == ["cuda:0", "cuda:1"]
    assert list(df.columns) == memory.REPORT_COLUMNS
    row = df.loc["cuda:0"]
    assert row["source"] == "NVML" and row["used"] >= 512 * 2**20
    assert row["rest"] == row["used"] - row["torch_reserved"]
    assert row["total"] == 143771 * 2**20
    mib = nvkit.memory_report(unit="MiB")
    assert mib.loc["cuda:0", "total"] == 143771
    assert list(nvkit.memory_report(devices=[1]).index) == ["cuda:1"]
    with pytest.raises(NvkitError, match="unit"):
        nvkit.memory_report(unit="KB")
    with pytest.raises(NvkitError, match="cuda:5"):
        nvkit.memory_report(devices=[5])
    text = memory.format_report(df)
    assert "cuda:1" in text and "rest = used" in text


def test_report_on_cpu_is_one_process_row(no_gpus):
    df = nvkit.memory_report()
    assert list(df.index) == ["cpu"]
    assert df.loc["cpu", "source"] == "RSS" and df.loc["cpu", "used"] > 0


def test_memory_magic_prints_the_report(fake_gpus, capsys):
    from nvkit.magics import run_line
    run_line("memory")
    assert "cuda:0" in capsys.readouterr().out
    run_line("mark checkpoint one")
    assert events.events()[-1].text == "checkpoint one"
    with pytest.raises(NvkitError):
        run_line("memory --unit parsecs")
    with pytest.raises(NvkitError):
        run_line("mark")


# --- verified unload -------------------------------------------------------------------------------

def test_unload_reports_the_drop_and_keeps_the_int(tiny_dir, no_gpus):
    s = nvkit.load(tiny_dir, device_map="cpu")
    assert s.generate("NVIDIA GPUs are", max_new_tokens=3)
    c = memory.last_comparison()
    assert c.what == "generate" and c.predicted is not None  # nvkit predicted this generation itself
    freed = s.unload()
    assert isinstance(freed, int) and freed >= 0
    rep = s.unload_report
    assert rep.freed == freed and rep.device == "cpu"
    assert rep.after.rss <= rep.before.rss + 64 * 2**20
    assert "Unloaded" in str(rep) and "process RSS" in str(rep)
    assert events.events()[-1].kind == "unload"
    assert s.unload() == 0  # twice is harmless


def test_a_loaded_session_is_kept_out_of_the_collectors_passes_and_still_freed(tiny_dir, no_gpus):
    """``usage.settle`` at the end of a load: the loaded session's objects are frozen (a full pass
    of the garbage collector walks only what came after them); the model is still freed by its
    unload, a reference cycle among frozen objects by the next ``release``, and the live-tensor scan
    still sees frozen tensors (and leaves them frozen)."""
    import gc
    import weakref

    import torch

    from nvkit.memory.usage import release, settle
    s = nvkit.load(tiny_dir, device_map="cpu")
    assert gc.get_freeze_count() > 50_000 and len(gc.get_objects()) < gc.get_freeze_count() // 10

    class Holder:
        pass
    cycle = Holder()
    cycle.me, cycle.t = cycle, torch.zeros(1021, 1039)
    held = weakref.ref(cycle)
    big = torch.zeros(1031, 1019)
    settle()
    frozen = gc.get_freeze_count()
    mine = [h for h in memory.live_tensors("cpu", limit=100_000, namespace={"big": big}) if "big" in h.owners]
    assert len(mine) == 1 and mine[0].nbytes == 1031 * 1019 * 4
    assert gc.get_freeze_count() >= frozen
    del cycle
    gc.collect()
    assert held() is not None  # a frozen cycle waits for the next release...
    release()
    assert held() is None      # ...which looks at every object again
    model = weakref.ref(s.model)
    s.unload()
    assert model() is None and gc.get_freeze_count() > 0


def test_live_tensors_names_their_owners():
    import torch
    # odd sizes and a generous limit: earlier tests in the same process leave tensors behind, and a
    # leftover of the same byte count must not stand in for these (CI once failed that way)
    big = torch.zeros(1024, 1031)       # ~4 MiB
    lin = torch.nn.Linear(509, 509)     # ~1 MiB weight
    ns = {"big": big, "model": lin, "Out": {3: big}}
    held = memory.live_tensors("cpu", limit=100_000, namespace=ns)
    mine = [h for h in held if "big" in h.owners]
    assert len(mine) == 1 and mine[0].nbytes == 1024 * 1031 * 4
    assert any("IPython output history" in o for o in mine[0].owners)
    weight = [h for h in held if "model.weight" in h.owners]
    assert len(weight) == 1 and weight[0].nbytes == 509 * 509 * 4
    assert "4.03 MiB float32[1024, 1031]" in str(mine[0])


def test_oom_error_says_asked_free_and_next_steps():
    import torch
    e = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
                               "139.80 GiB of which 1.50 GiB is free. Of the allocated memory ...")
    err = memory.oom_error(e, "generate")
    msg = str(err)
    assert isinstance(err, NvkitError)
    assert "Asked for 20.00 GiB while 1.50 GiB was free" in msg
    assert "still usable" in msg and "smaller batch" in msg and "nvkit.estimate" in msg
    assert events.events()[-1].kind == "oom"
    assert "gradient_checkpointing" in str(memory.oom_error(e, "fine-tune"))
    assert "quantization='nf4'" in str(memory.oom_error(e, "load"))


def test_overhead_benchmark_runs_on_the_default_path(no_gpus):
    """The benchmark behind the <1 % sampler target: its fields, on CPU with the demo model (the
    figure itself is measured on the H200, not asserted here)."""
    r = sampler_bench.overhead_benchmark("demo", new_tokens=6, rounds=1, rate_hz=20)
    assert r["path"] == "generate"  # CPU: plain generate; on CUDA this is "fast"
    assert r["tokens"] == 6  # every round decodes exactly what it asked for, whatever the model's EOS
    assert r["tok_s_without"] > 0 and r["tok_s_with"] > 0
    assert r["noise"] == 0.0  # one round: no spread
    assert {"difference", "seconds_per_sample", "core_share"} <= set(r)
    assert nvkit.session(required=False) is None  # it unloads what it loaded


def test_cpu_comparison_counts_growth_and_weights_not_the_whole_process(no_gpus):
    """On CPU the whole RSS (Python, torch, every import: about a gigabyte) would dwarf any model
    estimate; the comparison uses the growth during the call plus the resident weights."""
    s = nvkit.load("demo")
    try:
        s.generate("NVIDIA GPUs are", max_new_tokens=8)  # first call: lazy allocations
        s.generate("NVIDIA GPUs are", max_new_tokens=8)
        c = memory.last_comparison()
        assert c.what == "generate" and c.device == "cpu"
        weights = s.info["footprint_bytes"]
        assert weights <= c.measured < weights + 64 * 2**20 < memory.rss_bytes()
        assert c.error is not None and abs(c.error) < 0.5, str(c)
        assert "RSS growth + resident weights" in str(c)
    finally:
        s.unload()


def test_live_tensors_skips_tracing_tensors_quietly():
    """A FakeTensor left alive by torch.compile has no memory: not listed, and the scan warns nothing
    (the H200 run printed data_ptr and deprecation warnings from this scan)."""
    import warnings

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.empty(2048, 2048)  # 16 MiB, if it were real
    real = torch.ones(300, 1000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        held = memory.live_tensors("cpu", limit=500, namespace={"fake": fake, "real": real})
    assert not seen, [str(w.message) for w in seen]
    assert not any(h.nbytes == 2048 * 2048 * 4 for h in held)
    assert any("real" in h.owners for h in held)
