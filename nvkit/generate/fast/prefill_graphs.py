"""The batch-invariant decoder's prompt prefill replayed from CUDA graphs, one per padded length
(``PrefillGraphs``).

Why: ``deterministic=True`` prefills each prompt on its own, so that its products run at the same
shapes alone and in a list; an eager forward of one prompt issues about fifty kernels per layer,
and the host, not the GPU, sets the pace of a list's prefill (a forward per prompt, one after
another). A prompt's padded length is a multiple of 16 tokens, so a few dozen graphs cover
prompts of hundreds of tokens, and each replays a whole forward in one launch.

The guarantee stays: a length's graph is kept only if its first replay gives the bits of the
eager forward it was captured from (logits compared exactly), so a prompt gets the same first
token and keys whichever of the two ran it; a length whose graph differs or fails to capture runs
eagerly for the rest of the decoder's life. Lengths over ``MAX_LENGTH`` run eagerly (a graph's
activations grow with its length). Graphs are kept per pool (the keys and values they write, the
rotary tables they read); a new pool drops them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

from ... import events
from ...errors import error_summary
from . import cuda_graphs

#: the longest padded prompt a graph is captured for; longer ones prefill eagerly
MAX_LENGTH = 2048


@dataclass
class _Graph:
    """One length's graph and the buffers it reads and writes."""
    replay: Callable[[], None]
    ids: Any
    last: Any
    where: Any
    out: dict  # "logits": the graph's output tensor (in its memory pool)


class PrefillGraphs:
    """``prefill(ids, last, where, cos, sin, keys, values)`` as ``eager`` computes it (a
    ``llama_rows_step.RowsPrefillStep``), for groups of one prompt from a graph per padded length
    on CUDA (see the module docstring); anything else runs ``eager`` itself.

    ``graphs=False``: always ``eager`` (a decoder that runs without CUDA graphs); ``capture``:
    ``cuda_graphs.capture``'s signature (a test passes its own)."""

    def __init__(self, eager: Callable, *, graphs: bool = True, timings: cuda_graphs.Timings | None = None,
                 capture: Callable | None = None, max_length: int = MAX_LENGTH):
        self.eager = eager
        self.graphs = graphs
        self.timings = timings if timings is not None else cuda_graphs.Timings()
        self.max_length = max_length
        self._capture = capture
        self._graphs: dict[int, _Graph] = {}
        self._eager_lengths: dict[int, str] = {}  # length -> why it runs eagerly
        self._pool_key: tuple | None = None
        self._pool = None

    @property
    def lengths(self) -> list[int]:
        """The padded lengths replayed from graphs."""
        return sorted(self._graphs)

    @property
    def eager_lengths(self) -> dict[int, str]:
        """The padded lengths that run eagerly, and why."""
        return dict(self._eager_lengths)

    def release(self) -> None:
        """Drop every graph and its memory (the pool they wrote is gone, or the decoder is)."""
        self._graphs.clear()
        self._eager_lengths.clear()
        self._pool_key = self._pool = None

    def __call__(self, ids, last, where, cos, sin, keys, values):
        length = int(ids.shape[1])
        if (not self.graphs or ids.shape[0] != 1 or length > self.max_length
                or (ids.device.type != "cuda" and self._capture is None)):
            return self.eager(ids, last, where, cos, sin, keys, values)
        # every tensor a graph reads or writes besides its inputs: a pool allocated where an old
        # one was is the same memory to a graph only if every tensor is where it was
        pool_key = tuple((t.data_ptr(), tuple(t.shape)) for t in (*keys, *values, cos, sin))
        if pool_key != self._pool_key:
            self.release()
            self._pool_key = pool_key
        if length in self._eager_lengths:
            return self.eager(ids, last, where, cos, sin, keys, values)
        g = self._graphs.get(length)
        if g is None:
            return self._first(ids, last, where, cos, sin, keys, values)
        g.ids.copy_(ids)
        g.last.copy_(last)
        g.where.copy_(where)
        g.replay()
        return g.out["logits"].clone()

    def _first(self, ids, last, where, cos, sin, keys, values):
        """A length's first prompt: capture its graph (the warm-up is the eager forward), replay
        it, and keep it only if the replay's logits are the eager forward's bits."""
        import torch
        length = int(ids.shape[1])
        g = _Graph(replay=lambda: None, ids=ids.clone(), last=last.clone(), where=where.clone(), out={})
        eager_out: dict = {}

        def body():
            out = self.eager(g.ids, g.last, g.where, cos, sin, keys, values)
            if "logits" not in eager_out:
                eager_out["logits"] = out.clone()   # the warm-up: the eager forward's own result
            g.out["logits"] = out

        try:
            capture = self._capture or cuda_graphs.capture
            if self._pool is None and ids.device.type == "cuda":
                self._pool = torch.cuda.graph_pool_handle()
            graph = capture(ids.device, body, lambda: None, compiling=False, warmups=1,
                            inductor=contextlib.nullcontext(), pool=self._pool, timings=self.timings,
                            parts=("prefill graphs", "prefill graphs"))
            g.replay = graph.replay
            g.replay()
            same = torch.equal(g.out["logits"], eager_out["logits"])
        except Exception as e:  # noqa: BLE001 - the eager forward computes the same: said, and it stays
            return self._stays_eager(length, f"its capture failed ({error_summary(e)})",
                                     ids, last, where, cos, sin, keys, values)
        if not same:
            return self._stays_eager(length, "its graph's logits differ from the eager forward's",
                                     ids, last, where, cos, sin, keys, values)
        self._graphs[length] = g
        return g.out["logits"].clone()

    def _stays_eager(self, length: int, why: str, ids, last, where, cos, sin, keys, values):
        self._eager_lengths[length] = why
        events.record("compile", f"fast batch, deterministic: prompts of {length} padded tokens prefill eagerly: {why}")
        if not self._graphs:
            self._pool = None  # a pool no graph holds cannot take another capture (cuda_graphs.drop)
        # run again eagerly: the pool's keys and the first token are then the eager forward's
        return self.eager(ids, last, where, cos, sin, keys, values)
