"""The third run of scripts/test.sh (the steps' tests under the GPU machine's transformers) sets
NVKIT_EXPECT_TRANSFORMERS: this checks that the run imported that version, so the run cannot pass
on the checkout's own transformers by mistake (a PYTHONPATH that did not take)."""

import os

import pytest


def test_the_run_has_the_transformers_it_was_given():
    expected = os.environ.get("NVKIT_EXPECT_TRANSFORMERS")
    if not expected:
        pytest.skip("only in scripts/test.sh's run under the GPU machine's transformers")
    import transformers
    assert transformers.__version__ == expected, (transformers.__version__, transformers.__file__)
