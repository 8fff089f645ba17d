"""``InvariantRowsDecoder``: the rows decoder under which a prompt decodes the same alone and in a
list of any size (``generate(..., deterministic=True)``): its greedy text is the same bits
whatever prompts share its batch, how many rows the step runs, and when its row was refilled.

Why a decoder of its own: a kernel that picks its launch by the problem's shape (cuBLAS by the
row count, the paged attention's slices by the rows, torch's reductions by the number of rows they
reduce) sums a row's products in another order when the rows beside it change, and a greedy pick
that meets a near tie then takes another token. Here every kernel of the step computes a row as
it would alone:

- **the step**: the projections and the LM head in ``kernels.invariant_linear`` (fixed tiles and
  K slices per weight), the attention in the paged kernel with a fixed number of slices
  (``INVARIANT_SPLITS``), the norms, the activation and the adapters' products in nvkit's row
  kernels. It is never compiled (inductor picks its kernels per shape) and is captured per rung
  of the ladder like ``BatchedDecoder``'s; a failure of the kernels is an error rather than a
  fall-back to torch's operations, which would lose the guarantee without a word.
- **the prefill**: each prompt on its own (a group of one, at its own padded length), so its
  products run at the same shapes alone and in a list; replayed from a graph per padded length
  that gives the eager forward's bits (``prefill_graphs``), since a forward per prompt issued from
  the host would set the pace of a list.

It costs list throughput (the fixed tiles are not cuBLAS's best for every row count, and the
prefill runs a forward per prompt): ``nvkit bench MODEL --afternoon`` and the GPU test of
tests/gpu/test_batched_gpu.py measure it against the default rows decoder (docs/benchmarks.md). The model
must run nvkit's fused step (``fused_fit``).
"""

from __future__ import annotations

from typing import Callable

from ...errors import NvkitError, error_summary
from . import fused_fit, prefill_rows
from .prefill_graphs import PrefillGraphs
from .llama_rows_step import decode_rows_step, prefill_rows_step
from .paged_cache import MAX_ROWS, PAGE
from .rows import BatchedDecoder
from .schedule import SCRATCH
from .single import FastDecoder

#: padded prompt tokens per prefill forward: less than two prompts' worth, so each prompt is a group of its own
ALONE_PREFILL_TOKENS = 16


def invariant_why(single: FastDecoder) -> str | None:
    """Why the batch-invariant rows decoder cannot run ``single``'s model (None: it can)."""
    if not single.fused and single.fused_why is None:
        return "it runs on nvkit's fused decode step, which is turned off (fused=False)"
    return fused_fit.fusable_why(single.model)


class InvariantRowsDecoder(BatchedDecoder):
    """``BatchedDecoder`` with the batch-invariant step and prefill (see the module docstring).
    ``graphs=False`` runs it without capture, for checking on a CPU with Triton's interpreter."""

    label = "fast batch, deterministic"

    def __init__(self, single: FastDecoder, *, graphs: bool | None = None, max_rows: int = MAX_ROWS):
        super().__init__(single, graphs=graphs, max_rows=max_rows, prefill_tokens=ALONE_PREFILL_TOKENS)
        if self.attention != "paged":
            raise NvkitError(f"deterministic=True runs nvkit's paged Triton attention, which cannot run here: "
                             f"{self.attention_why or 'the attention is set to matmul'}.")
        self.kernels = True

    def _fits(self, single: FastDecoder) -> None:
        why = invariant_why(single)
        if why:
            raise NvkitError(f"deterministic=True cannot run this model: {why}.")

    def describe(self) -> str:
        return "batch-invariant kernels, " + super().describe()

    def _class_how(self) -> str:
        return "uncompiled" if self.graphs else "no CUDA graphs"

    def compile_due(self, lora_on: bool = False) -> bool:
        return False  # inductor's kernels are picked per shape: a compiled step would not be invariant

    @property
    def compile_waiting(self) -> bool:
        return False

    def _step(self, lora_on: bool) -> Callable:
        if lora_on not in self._steps:
            fw, slots = self._reads(lora_on)
            self._steps[lora_on] = decode_rows_step(fw, self.attention, PAGE, slots, kernels=True, invariant=True)
        return self._steps[lora_on]

    def _prefill_fn(self, lora_on: bool) -> Callable:
        if lora_on not in self._prefills:
            graphs = PrefillGraphs(prefill_rows_step(*self._reads(lora_on)), graphs=self.graphs, timings=self.timings)
            self._prefills[lora_on] = prefill_rows.RowsPrefill(graphs, compile=False, page=PAGE, scratch=SCRATCH,
                                                               timings=self.timings)
        return self._prefills[lora_on]

    @property
    def prefill_graphs(self) -> list[PrefillGraphs]:
        """The prefills' graphs (the base model's, the adapter's), for what they replay and why not."""
        return [p.eager for p in self._prefills.values()]

    def _drop_arena(self) -> None:
        super()._drop_arena()
        for graphs in self.prefill_graphs:  # they wrote the pool that goes
            graphs.release()

    def capture_or_fall_back(self, capture: Callable[[bool], object], compiling: bool,
                             clean: Callable[[], None] = lambda: None):
        try:
            return capture(False), False
        except Exception as e:  # noqa: BLE001 - said to the user: no silent fall-back here
            clean()
            raise NvkitError(f"deterministic=True runs nvkit's batch-invariant Triton kernels, which failed here "
                             f"({error_summary(e)}). Generate without deterministic=True.") from e
