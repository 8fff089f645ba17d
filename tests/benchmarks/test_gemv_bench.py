"""The GEMV benchmark (``python -m nvkit.benchmarks.gemv``): its refusals, and a whole run under
Triton's interpreter on the CPU, every fused launch checked against the step's own kernels (the
figures need CUDA: ``bash scripts/gpu_session.sh gemv`` on the GPU machine)."""

import os
import subprocess
import sys
import textwrap

import pytest

from nvkit.benchmarks import gemv as G
from nvkit.errors import NvkitError


@pytest.mark.parametrize("kw, words", [
    (dict(models=()), "models must be"), (dict(models="qwen3-0.6b"), "models must be"),
    (dict(models=("gpt-17",)), "Unknown shape"), (dict(repeats=0), "repeats must be"),
    (dict(launches=((4, 256),)), "launches must be"), (dict(forms=("qkv", "lm")), "forms must be"),
    (dict(forms=()), "forms must be"), (dict(every=1), "every must be True or False"),
    (dict(device="tpu"), "device must be"), (dict(device="cpu"), "TRITON_INTERPRET=1"),
])
def test_bad_arguments_are_refused_before_any_work(kw, words):
    with pytest.raises(NvkitError, match=words):
        G.run(**kw)


def test_without_cuda_the_command_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the benchmark runs")
    assert G.main(["--models", "qwen3-tiny"]) == 2 and G.main(["--models", "nope"]) == 2


def test_a_whole_run_in_the_interpreter_checks_the_fused_forms_against_the_steps_kernels():
    pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent("""
        from nvkit.benchmarks import gemv as G
        # the layer's forms (the head is the q/k/v form's code over the vocabulary: slow to interpret)
        df = G.run(models=("qwen3-tiny",), repeats=1, device="cpu", launches=((64, 64, 4),), forms=G.LAYER_FORMS)
        assert list(df["form"].unique()) == list(G.LAYER_FORMS) and G.FORMS == G.LAYER_FORMS + ("head",), df
        assert "note" not in df.columns or df["note"].isna().all(), df
        fused = df[df.variant.str.startswith("fused")]
        assert len(fused) >= 4 and (fused.max_err < 1e-4).all() and (df.us_per_call > 0).all()
        now = df[df.variant == "now"].set_index("form")
        assert now.kernels.to_dict() == {"qkv": 2, "o": 1, "gate_up": 3, "down": 1}
        assert now.loc["gate_up", "n"] == now.loc["down", "k"]  # the GLU's output feeds the down product
        s = G.layer_summary(df)
        assert s.now_kernels.tolist() == [7] and s.fused_kernels.tolist() == [4] and s.fused_us.notna().all()
        # every launch a row of its own (what ``--every`` prints to fit the launch rule to)
        e = G.run(models=("qwen3-tiny",), repeats=1, device="cpu", launches=((64, 64, 4), (32, 128, 4)),
                  forms=("o",), every=True)
        assert list(e.variant)[2:] == [e.variant.iloc[2], "fused 64x64 w4", "fused 32x128 w4"], e
        assert (e.max_err.dropna() < 1e-4).all() and (e.pdl.dropna() == False).all()  # noqa: E712 - no GPU, no PDL
        assert len(set(G.GRID)) == len(G.GRID) > 30 and all(r * bk <= 16384 for r, bk, _ in G.GRID)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
