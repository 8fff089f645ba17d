"""The paged-attention launch-shape benchmark: its inputs and refusals, and a whole run under
Triton's interpreter on the CPU (the figures need CUDA: ``python -m nvkit.benchmarks.attention`` on
the GPU machine, tests/gpu/test_batched_gpu.py)."""

import os
import subprocess
import sys
import textwrap

import pytest

from nvkit.benchmarks import attention as A
from nvkit.errors import NvkitError


def test_shapes_parse_and_bad_ones_say_the_form():
    assert A.parse_shapes("auto/1/auto, 2/2/8, 4/2/4/dot/3, 1/1/4/sum") == (
        (None, 1, None, False, None), (2, 2, 8, False, None), (4, 2, 4, True, 3), (1, 1, 4, False, None))
    for bad, words in (("2/2", "splits/pages/warps"), ("x/1/4", "'x'"), ("auto/auto/4", "pages per step"),
                       ("0/1/4", "'0'"), ("1/-2/4", "'-2'"), ("1/1/4/mma", "'dot' or 'sum'"),
                       ("1/1/4/dot/0", "'0'"), ("1/1/4/dot/3/9", "splits/pages/warps")):
        with pytest.raises(NvkitError, match=words):
            A.parse_shapes(bad)


@pytest.mark.parametrize("kw, words", [
    (dict(model="gpt-17"), "model must be one of"),
    (dict(rows=()), "rows must be"),
    (dict(rows=(64, 0)), "rows must be"),
    (dict(rows=(True,)), "rows must be"),
    (dict(lo=600, hi=512), "lo .600. must not be more than hi"),
    (dict(repeats=0), "repeats must be"),
    (dict(shapes=((1, 1, 4),)), "tuples"),
    (dict(device="tpu"), "device must be"),
    (dict(device="cpu"), "TRITON_INTERPRET=1"),
])
def test_bad_arguments_are_refused_before_any_work(kw, words):
    with pytest.raises(NvkitError, match=words):
        A.paged(**kw)


def test_without_cuda_it_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the benchmark runs (tests/gpu/test_batched_gpu.py)")
    with pytest.raises(NvkitError, match="CUDA GPU"):
        A.paged(rows=(4,))
    assert A.main(["--rows", "4"]) == 2
    assert A.main(["--shapes", "nope"]) == 2


def test_a_whole_run_in_the_interpreter_checks_every_shape_against_the_reference():
    pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent("""
        from nvkit.benchmarks import attention as A
        shapes = (A.SHAPES[0], A.SHAPES[3], A.SHAPES[10], A.SHAPES[-1])
        df = A.paged(rows=(3,), lo=16, hi=40, new_tokens=8, repeats=1, shapes=shapes, device="cpu")
        assert list(df["shape"])[0] == "default" and len(df) == 4, df
        assert "note" not in df.columns or df["note"].isna().all(), df["note"].tolist()
        assert (df["max_err"] < 1e-4).all() and (df["us_per_call"] > 0).all() and (df["kv_mib"] > 0).all()
        assert df.attrs["layers"] == 28 and df.attrs["heads"] == (16, 8, 128)
        print("ok", df["shape"].tolist())
    """)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("kw, words", [
    (dict(model="gpt-17"), "model must be one of"),
    (dict(lengths=()), "lengths must be"),
    (dict(lengths=(1024, 0)), "lengths must be"),
    (dict(repeats=0), "repeats must be"),
    (dict(shapes=((1, 1, 4),)), "tuples"),
    (dict(cache=3000), "cache must be a power of two"),
    (dict(cache=1024), "at least the longest length"),
    (dict(cache="big"), "cache must be"),
    (dict(device="tpu"), "device must be"),
    (dict(device="cpu"), "TRITON_INTERPRET=1"),
])
def test_the_batch1_benchmark_refuses_bad_arguments_before_any_work(kw, words):
    with pytest.raises(NvkitError, match=words):
        A.batch1(**kw)


def test_the_batch1_benchmark_in_the_interpreter_checks_every_launch_against_the_reference():
    """``--batch1``: a short and a longer position, the default launch and the others, each checked
    against ``attend_rope_reference`` before it is timed (the times mean nothing on the CPU)."""
    pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent("""
        from nvkit.benchmarks import attention as A
        shapes = (A.BATCH1_SHAPES[0], (2, 2, None, False, None), (4, 1, 4, True, 3), (64, 2, 4, True, 3))
        df = A.batch1(model="qwen3-tiny", lengths=(5, 300), repeats=1, shapes=shapes, device="cpu")
        assert list(df["shape"])[::4] == ["default", "default"] and len(df) == 8, df
        assert "note" not in df.columns or df["note"].isna().all(), df["note"].tolist()
        assert (df["max_err"] < 1e-4).all() and (df["us_per_call"] > 0).all(), df
        assert list(df["positions"]) == [5] * 4 + [300] * 4 and list(df["cache"]) == [1024] * 4 + [1024] * 4
        kv = df.attrs["heads"][1] * df.attrs["heads"][2] * 2 * 4  # bytes per position: K and V, fp32
        assert abs(df["kv_mib"].iloc[-1] - 300 * kv / 2 ** 20) < 1e-9
        one = A.batch1(model="qwen3-tiny", lengths=(5, 300), repeats=1, shapes=shapes[:2], device="cpu", cache=2048)
        assert list(one["cache"]) == [2048] * 4 and (one["max_err"] < 1e-4).all(), one
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    assert A.main(["--batch1", "--lengths", "0"]) == 2 and A.main(["--batch1", "--shapes", "1/1"]) == 2
