"""The batched path's compiled prefill (``RowsPrefill``) on the CPU, where inductor compiles it
as it does on a GPU: the compiled prefill writes the keys and values and returns the logits the
eager one does, for groups of several rows and of one (which runs with an empty second row whose
keys land in the scratch page only); one compile serves other group shapes; a compile that fails
gives way to the eager prefill with the reason kept. The GPU run is tests/gpu/test_batched_gpu.py."""

import pytest
import torch

import nvkit
import nvkit.generate.fast as fast
from nvkit import events
from nvkit.generate.fast.rows import BatchedDecoder
from nvkit.generate.fast.llama_rows_step import RowsPrefillStep, paged_positions, prefill_rows_step
from nvkit.generate.fast.cuda_graphs import Timings
from nvkit.generate.fast.prefill_rows import RowsPrefill
from tests import demo_model

PAGE, SCRATCH, PAGES = 16, 0, 40


@pytest.fixture(scope="module")
def fw():
    s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    bd = BatchedDecoder(fast.FastDecoder(s.model, k_steps=4, graphs=False), max_rows=8)
    weights, _ = bd.single.weights()
    yield weights
    s.unload()


def _inputs(fw, rows, length, seed):
    """As ``BatchedDecoder`` makes them: the pool and rotary tables outside inference mode (the
    arena's), the group's ids and positions inside it (the worker's)."""
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        table = (torch.randperm(PAGES - 1, generator=g)[:rows * 4] + 1).view(rows, 4).to(torch.int32)  # not page 0
        where = paged_positions(table, PAGE, length)
        ids = torch.randint(0, 100, (rows, length), generator=g)
        last = torch.randint(0, length, (rows,), generator=g)
    ang = torch.randn(256, fw.hd // 2, generator=g).repeat(1, 2)
    keys = [torch.randn(PAGES * PAGE, fw.nkv, fw.hd, generator=g) for _ in fw.layers]
    values = [torch.randn(PAGES * PAGE, fw.nkv, fw.hd, generator=g) for _ in fw.layers]
    return ids, last, where, ang.cos(), ang.sin(), keys, values


def _copy(args):
    ids, last, where, cos, sin, keys, values = args
    return ids, last, where, cos, sin, [k.clone() for k in keys], [v.clone() for v in values]


def test_the_compiled_prefill_computes_what_the_eager_one_does(fw):
    eager = prefill_rows_step(fw)
    timings = Timings()
    restored = []
    pre = RowsPrefill(eager, compile=True, page=PAGE, scratch=SCRATCH, timings=timings,
                      restore=lambda: restored.append(1))
    from torch._dynamo.utils import counters
    graphs_before = counters["stats"]["unique_graphs"]
    for rows, length, seed in ((3, 32, 0), (1, 48, 1), (5, 64, 2)):
        ref_args = _inputs(fw, rows, length, seed)
        got_args = _copy(ref_args)
        with torch.inference_mode():
            ref = eager(*ref_args)
            got = pre(*got_args)
        assert pre.compiled and pre.error is None
        assert got.shape == ref.shape == (rows, fw.lm_head.shape[0])
        assert torch.allclose(got, ref, atol=1e-4), (rows, (got - ref).abs().max())
        scratch = torch.zeros(PAGES * PAGE, dtype=torch.bool)
        scratch[SCRATCH * PAGE:(SCRATCH + 1) * PAGE] = True
        for k_ref, k_got, v_ref, v_got in zip(ref_args[5], got_args[5], ref_args[6], got_args[6]):
            # the rows' own positions as the eager prefill wrote them; outside the scratch page
            # nothing else changed (the empty row of a one-prompt group writes there only)
            assert torch.allclose(k_got[~scratch], k_ref[~scratch], atol=1e-4)
            assert torch.allclose(v_got[~scratch], v_ref[~scratch], atol=1e-4)
    assert restored == [1] and timings["compile prefill"] > 0  # the artifacts asked for once, the compile timed
    assert counters["stats"]["unique_graphs"] - graphs_before == 1  # one compile for the three group shapes


def test_a_compile_that_fails_gives_way_to_the_eager_prefill(fw):
    eager = prefill_rows_step(fw)

    def breaks(*args):  # fullgraph refuses a graph break: the compile fails at its first call
        torch._dynamo.graph_break()
        return eager.eager_layer(*args)

    since = events.now()
    pre = RowsPrefill(RowsPrefillStep(fw, None, breaks), compile=True, page=PAGE, scratch=SCRATCH)
    args = _inputs(fw, 2, 32, 3)
    with torch.inference_mode():
        ref = eager(*_copy(args))
        got = pre(*_copy(args))
        again = pre(*_copy(args))
    assert torch.equal(got, ref) and torch.equal(again, ref)
    assert not pre.compiled and pre.error
    assert any("compiled prefill failed" in e.text for e in events.events(since))


def test_nvkits_kernels_failing_in_the_eager_prefill_give_way_to_torchs_operations(fw):
    """A list's prefill runs before its step is captured, where the step's own fallback from
    nvkit's kernels would catch a kernel that does not build here: the prefill falls back itself,
    writes every key again with torch's operations, says why once, and stays on them; a prefill of
    torch's operations that fails raises (nothing to fall back to)."""
    ref_step = prefill_rows_step(fw)
    step = prefill_rows_step(fw)
    calls = []

    def kernels_fail(*args):  # as nvkit's kernels on a GPU they cannot build for, part way in
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("PTX .version 9.9 does not support .target sm_200")
        return step.traced_layer(*args)
    step.eager_layer = step.layer = kernels_fail  # what prefill_rows_step(fw, kernels=True) holds
    since = events.now()
    args = _inputs(fw, 3, 32, 4)
    ref_args, got_args = _copy(args), _copy(args)
    with torch.inference_mode():
        ref = ref_step(*ref_args)
        got = step(*got_args)
        again = step(*_copy(args))
    assert torch.equal(got, ref) and torch.equal(again, ref) and len(calls) == 2  # never again
    assert all(torch.equal(a, b) for a, b in zip(got_args[5] + got_args[6], ref_args[5] + ref_args[6]))
    assert step.kernel_error and "PTX" in step.kernel_error and step.layer is step.traced_layer
    said = [e.text for e in events.events(since) if "prompt prefill" in e.text]
    assert len(said) == 1 and "nvkit's kernels failed" in said[0] and "torch's operations" in said[0]
    plain = prefill_rows_step(fw)

    def torch_fails(*args):
        raise RuntimeError("out of memory")
    plain.eager_layer = plain.traced_layer = plain.layer = torch_fails
    with torch.inference_mode(), pytest.raises(RuntimeError, match="out of memory"):
        plain(*_copy(args))
    assert plain.kernel_error is None


def test_without_compile_it_is_the_eager_prefill(fw):
    eager = prefill_rows_step(fw)
    pre = RowsPrefill(eager, compile=False, page=PAGE, scratch=SCRATCH)
    args = _inputs(fw, 1, 16, 4)
    with torch.inference_mode():
        assert torch.equal(pre(*_copy(args)), eager(*_copy(args)))
    assert not pre.compiled and pre.error is None


class _Ticks:
    """A clock whose reads around each timed call give that call ``costs[i]`` seconds, in turn."""

    def __init__(self, costs):
        self.t, self.costs, self.reads = 0.0, list(costs), 0

    def __call__(self):
        self.reads += 1
        if self.reads % 2 == 0:  # the read after the call
            self.t += self.costs[(self.reads // 2 - 1) % len(self.costs)]
        return self.t


@pytest.mark.parametrize("eager_s, compiled_s", [(1.0, 2.0), (2.0, 1.0)])
def test_the_call_that_compiles_keeps_the_faster_prefill(fw, eager_s, compiled_s):
    """Right after the compile the same call times eager and compiled in alternation; the slower
    is dropped, and the first tokens (and keys) are the kept kind's."""
    eager = prefill_rows_step(fw)
    since = events.now()
    timings = Timings()
    pre = RowsPrefill(eager, compile=True, page=PAGE, scratch=SCRATCH, timings=timings, clock=_Ticks([eager_s, compiled_s]))
    pre.measure = True  # on the CPU too (None measures on CUDA only)
    args = _inputs(fw, 3, 32, 5)
    with torch.inference_mode():
        ref = eager(*_copy(args))
        got = pre(*_copy(args))
        again = pre(*_copy(args))
    assert torch.allclose(got, ref, atol=1e-4) and torch.allclose(again, ref, atol=1e-4)
    assert timings["measure"] > 0
    if eager_s < compiled_s:
        assert not pre.compiled and pre.declined.startswith("measured ") and pre.error is None
        assert any("compiled prefill is slower" in e.text for e in events.events(since))
        assert torch.equal(again, eager(*_copy(args)))  # the eager prefill runs from now on
    else:
        assert pre.compiled and pre.declined is None


class _Clock:
    """A clock each eager prefill call advances by ``step`` seconds."""

    def __init__(self, step):
        self.t, self.step, self.reads = 0.0, step, 0

    def __call__(self):
        self.reads += 1
        if self.reads % 2 == 0:  # the read after the call
            self.t += self.step
        return self.t


def test_the_compile_waits_until_the_eager_prefill_has_cost_compile_after(fw):
    eager = prefill_rows_step(fw)
    stored, timings = [], Timings()
    pre = RowsPrefill(eager, compile=True, page=PAGE, scratch=SCRATCH, timings=timings, compile_after=1.0,
                      clock=_Clock(0.4), restore=lambda: False, store=lambda: stored.append(1))
    for i, (rows, length) in enumerate(((2, 32), (3, 16), (1, 48), (2, 32), (4, 16))):
        args = _inputs(fw, rows, length, 10 + i)
        with torch.inference_mode():
            ref = eager(*_copy(args))
            got = pre(*_copy(args))
        assert torch.allclose(got, ref, atol=1e-4)
        if i < 3:  # 0.4, 0.8, 1.2 s of eager prefill: the compile is due after the third call
            assert pre.waiting and not pre.compiled and timings["compile prefill"] == 0 and not stored
    assert pre.compiled and not pre.waiting and stored == [1] and timings["compile prefill"] > 0
    assert pre.eager_seconds == pytest.approx(1.2)


def test_compile_next_makes_it_compile_at_once_and_artifacts_on_disk_do_not(fw):
    """Artifacts of an earlier compile shorten the compile by a part only: a new session's first
    lists still prefill eagerly, and the disk is read when the compile runs, once."""
    eager = prefill_rows_step(fw)
    args = _inputs(fw, 2, 32, 20)
    asked = []
    pre = RowsPrefill(eager, compile=True, page=PAGE, scratch=SCRATCH, compile_after=1e9,
                      restore=lambda: asked.append(1) or True)
    with torch.inference_mode():
        pre(*_copy(args))
        pre(*_copy(args))
        assert pre.waiting and not pre.compiled and asked == []
        pre.compile_next()
        pre(*_copy(args))
        pre(*_copy(args))
    assert pre.compiled and asked == [1]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True, None])
def test_compile_after_must_be_seconds(fw, bad):
    with pytest.raises(nvkit.NvkitError, match="compile_after"):
        RowsPrefill(prefill_rows_step(fw), compile=True, page=PAGE, scratch=SCRATCH, compile_after=bad)


def test_the_eager_calls_before_the_compile_do_not_import_the_compiler():
    """The first lists of a session prefill eagerly while the compile waits; they must not pay
    for what ``torch.compile`` imports when it wraps a function (functorch's compile, networkx: some
    380 modules, over a second in a fresh process on the GPU machine): the compiled layer is made
    when the compile is due. A fresh interpreter, as a user's kernel is at its first list."""
    import subprocess
    import sys
    code = """
import sys, torch, nvkit
import nvkit.generate.fast as fast
from nvkit.generate.fast.rows import BatchedDecoder
from nvkit.generate.fast.llama_rows_step import prefill_rows_step, paged_positions
from nvkit.generate.fast.prefill_rows import RowsPrefill
from tests import demo_model
s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
fw, _ = BatchedDecoder(fast.FastDecoder(s.model, k_steps=4, graphs=False), max_rows=8).single.weights()
assert "functorch.compile" not in sys.modules, "imported before the prefill"
pre = RowsPrefill(prefill_rows_step(fw), compile=True, page=16, scratch=0, compile_after=1e9, restore=lambda: False)
table = torch.arange(1, 9, dtype=torch.int32).view(2, 4)
keys = [torch.zeros(40 * 16, fw.nkv, fw.hd) for _ in fw.layers]
values = [torch.zeros(40 * 16, fw.nkv, fw.hd) for _ in fw.layers]
cos, sin = fw.rotary(64)
with torch.inference_mode():
    out = pre(torch.ones((2, 16), dtype=torch.long), torch.tensor([15, 3]), paged_positions(table, 16, 16), cos, sin,
              keys, values)
assert out.shape[0] == 2 and pre.waiting
print("compiler imported:", "functorch.compile" in sys.modules)
"""
    root = str(demo_model.__file__).rsplit("/tests/", 1)[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                       env={**__import__("os").environ, "PYTHONPATH": root})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "compiler imported: False" in r.stdout, r.stdout
