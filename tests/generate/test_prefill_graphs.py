"""The batch-invariant decoder's prefill graphs (nvkit.generate.fast.prefill_graphs): a graph per
padded length, kept only where its replay gives the eager forward's bits, one pool's graphs
dropped for another's. On the CPU a stand-in for ``cuda_graphs.capture`` replays the captured
body on the graph's own buffers, as a CUDA graph replays its kernels on the addresses it captured;
the GPU test (tests/gpu/test_batched_gpu.py -k deterministic) runs the real graphs."""

import pytest
import torch

from nvkit import events
from nvkit.generate.fast.prefill_graphs import PrefillGraphs


class Captures:
    """A ``cuda_graphs.capture`` stand-in that counts captures; ``skew`` makes a replay's output
    differ in its last bits, ``fail`` makes the capture raise."""

    def __init__(self, skew=0.0, fail=False):
        self.count, self.skew, self.fail, self.parts = 0, skew, fail, []

    def __call__(self, device, body, rewind, *, compiling, warmups, inductor, pool, timings, parts):
        assert not compiling and warmups == 1
        self.parts.append(parts)
        for _ in range(warmups):
            rewind()
            body()
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.count += 1
        cap = self

        class Graph:
            def replay(self):
                body()
                if cap.skew:  # the graph's output, held by the body's closure (PrefillGraphs' _Graph)
                    graph = next(c.cell_contents for c in body.__closure__ if hasattr(c.cell_contents, "out"))
                    graph.out["logits"] += cap.skew
        return Graph()


def eager(ids, last, where, cos, sin, keys, values):
    """A prefill's contract in miniature: keys written at ``where``, each row's logits from its
    prompt up to ``last``."""
    keys[0].view(-1)[where.reshape(-1)] = ids.reshape(-1).to(keys[0].dtype) * cos[0]
    values[0].view(-1)[where.reshape(-1)] = sin[0]
    mask = torch.arange(ids.shape[1]).unsqueeze(0) <= last.unsqueeze(1)
    return ((ids * mask).sum(1, keepdim=True).float() * torch.linspace(0.1, 1.0, 5)).float()


def pool(n=64):
    return [torch.zeros(n)], [torch.zeros(n)], torch.ones(8), torch.full((8,), 2.0)


def prompt(tokens, length=16, start=0):
    ids = torch.tensor([tokens + [0] * (length - len(tokens))])
    return ids, torch.tensor([len(tokens) - 1]), torch.arange(start, start + length).unsqueeze(0)


def test_a_length_is_captured_once_and_each_prompt_gets_the_eager_result():
    cap = Captures()
    g = PrefillGraphs(eager, capture=cap)
    keys, values, cos, sin = pool()
    ref_keys = [torch.zeros(64)]
    for tokens, start in (([3, 4, 5], 0), ([7, 1], 16), ([2] * 9, 32)):
        ids, last, where = prompt(tokens, start=start)
        got = g(ids, last, where, cos, sin, keys, values)
        want = eager(ids, last, where, cos, sin, ref_keys, [torch.zeros(64)])
        assert torch.equal(got, want)
    assert torch.equal(keys[0], ref_keys[0])  # every prompt's keys where its own positions are
    assert cap.count == 1 and g.lengths == [16] and cap.parts == [("prefill graphs", "prefill graphs")]
    ids, last, where = prompt([1] * 20, length=32)  # a new padded length: a graph of its own
    g(ids, last, where, cos, sin, keys, values)
    assert cap.count == 2 and g.lengths == [16, 32]


def test_a_graph_whose_bits_differ_from_the_eager_forward_is_not_kept():
    cap = Captures(skew=1e-3)
    g = PrefillGraphs(eager, capture=cap)
    keys, values, cos, sin = pool()
    since = events.now()
    for tokens in ([3, 4, 5], [6, 6]):
        ids, last, where = prompt(tokens)
        assert torch.equal(g(ids, last, where, cos, sin, keys, values),
                           eager(ids, last, where, cos, sin, [torch.zeros(64)], [torch.zeros(64)]))
    assert g.lengths == [] and cap.count == 1  # the second prompt runs eagerly, no second capture
    assert "differ from the eager forward" in g.eager_lengths[16]
    said = [e.text for e in events.events(since)]
    assert any("prompts of 16 padded tokens prefill eagerly: its graph's logits differ" in t for t in said), said


def test_a_failed_capture_leaves_that_length_eager_and_the_others_captured():
    keys, values, cos, sin = pool()
    failing = Captures(fail=True)
    g = PrefillGraphs(eager, capture=failing)
    ids, last, where = prompt([3, 4, 5])
    assert torch.equal(g(ids, last, where, cos, sin, keys, values),
                       eager(ids, last, where, cos, sin, [torch.zeros(64)], [torch.zeros(64)]))
    assert "its capture failed (RuntimeError: operation not permitted" in g.eager_lengths[16]
    g._capture = ok = Captures()
    g(ids, last, where, cos, sin, keys, values)      # 16 stays eager: no capture tried again
    assert ok.count == 0
    ids, last, where = prompt([1] * 20, length=32)
    g(ids, last, where, cos, sin, keys, values)
    assert ok.count == 1 and g.lengths == [32]


def test_a_new_pool_drops_the_graphs_and_captures_again():
    cap = Captures()
    g = PrefillGraphs(eager, capture=cap)
    ids, last, where = prompt([3, 4, 5])
    keys, values, cos, sin = pool()
    g(ids, last, where, cos, sin, keys, values)
    g(ids, last, where, cos, sin, keys, values)
    assert cap.count == 1
    keys2, values2, _, _ = pool(128)                  # the decoder's new, larger pool
    got = g(ids, last, where, cos, sin, keys2, values2)
    assert cap.count == 2 and torch.equal(keys2[0][:16], keys[0][:16])
    assert torch.equal(got, eager(ids, last, where, cos, sin, [torch.zeros(128)], [torch.zeros(128)]))
    g.release()
    assert g.lengths == [] and g.eager_lengths == {}


@pytest.mark.parametrize("case", ["two rows", "too long", "graphs off", "cpu without a stand-in"])
def test_what_a_graph_is_not_for_runs_eagerly(case):
    cap = Captures()
    g = PrefillGraphs(eager, capture=None if case == "cpu without a stand-in" else cap,
                      graphs=case != "graphs off", max_length=16 if case == "too long" else 2048)
    keys, values, cos, sin = pool()
    ids, last, where = prompt([3, 4, 5], length=32 if case == "too long" else 16)
    if case == "two rows":
        ids, last, where = torch.cat([ids, ids]), torch.cat([last, last]), torch.cat([where, where + 16])
    got = g(ids, last, where, cos, sin, keys, values)
    assert torch.equal(got, eager(ids, last, where, cos, sin, [torch.zeros(64)], [torch.zeros(64)]))
    assert cap.count == 0 and g.lengths == []
