"""``nvkit.benchmarks.gc_passes``: the garbage collector's full passes inside a block, counted
and timed; the younger passes not; nothing left registered after the block, even when it raises."""

import gc

import pytest

from nvkit.benchmarks.gc_passes import FullPasses, full_passes


def test_full_passes_are_counted_and_timed_and_younger_ones_are_not():
    with full_passes() as passes:
        gc.collect(0)
        gc.collect(1)
        assert passes == [] and passes.words() == ""
        gc.collect()
        gc.collect(2)
    assert len(passes) == 2 and all(ms >= 0 for ms in passes), passes
    assert passes.words().startswith("2 full gc passes inside: ") and passes.words().endswith(" ms")
    gc.collect()
    assert len(passes) == 2  # the block is over: nothing more counted
    assert FullPasses([47.6]).words() == "a full gc pass inside: 48 ms"


def test_the_callback_goes_even_when_the_block_raises():
    before = list(gc.callbacks)
    with pytest.raises(ValueError):
        with full_passes():
            raise ValueError("a failed benchmark")
    assert gc.callbacks == before
