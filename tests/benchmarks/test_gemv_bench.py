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


def test_the_fit_picks_the_rule_whose_launches_the_table_times_fastest():
    """``fit``: on a table where each form's fastest launch is known (rows per program 4 for the
    q/k/v form, 1 for the down form, 1024 inputs per step, 4 warps), the rule it ranks first gives
    exactly those launches, and a rule whose launch is missing from the table is not ranked."""
    import math

    import pandas as pd
    forms = {"qkv": (4096, 1024, 4), "down": (1024, 3072, 1)}
    rows = []
    for form, (n, k, target) in forms.items():
        for bn, bk, w in G.GRID:
            us = 1 + abs(math.log2(bn) - math.log2(target)) + abs(math.log2(bk) - 10) + 0.5 * (w != 4)
            rows.append(dict(model="m", form=form, n=n, k=k, variant=f"fused {bn}x{bk} w{w}", us_per_call=us))
        rows.append(dict(model="m", form=form, n=n, k=k, variant="now", us_per_call=50.0))
    df = pd.DataFrame(rows)
    fitted = G.fit(df, 132)
    top = fitted.iloc[0]
    assert (top.cap, top.per_sm) == (1024, 4) and top.total_us == 2.0 and top.worst == 1.0, fitted.head()
    for form, (n, k, target) in forms.items():
        assert G.rule_launch(n, k, 132, int(top.cap), int(top.per_sm), int(top.wide)) == (target, 1024, 4)
    assert (fitted.total_us >= 2.0).all() and fitted.total_us.is_monotonic_increasing
    # without the 4 x 1024 launch the winner above has no time for the q/k/v form: not ranked
    fewer = G.fit(df[df.variant != "fused 4x1024 w4"], 132)
    assert not ((fewer.cap == 1024) & (fewer.per_sm == 4) & (fewer.wide >= 4096)).any()
    assert G.rule_launch(151936, 1024, 132, 512, 1, 8192) == (32, 512, 8)  # the LM head: the widest tile


def test_the_fit_ranks_saved_tables_on_no_gpu_and_refuses_what_it_cannot_read(tmp_path, capsys):
    """``--fit A.csv,B.csv --sms N``: two models' saved tables ranked together, the winning rule's
    launch per form beside that form's fastest; missing files, a missing SM count and a table of
    another kind are refused with exit 2 and a message that says what to pass."""
    import math

    import pandas as pd
    files = []
    # model b's long inputs (kernels.gemv.LONG_K) are fastest in steps of 2,048: the long cap's own
    for model, (n, k, target, step) in {"a": (4096, 1024, 4, 1024), "b": (1024, 8192, 1, 2048)}.items():
        rows = [dict(model=model, form="qkv", n=n, k=k, variant=f"fused {bn}x{bk} w{w}",
                     us_per_call=1 + abs(math.log2(bn) - math.log2(target)) + abs(math.log2(bk / step)) + (w != 4))
                for bn, bk, w in G.GRID]
        files.append(tmp_path / f"{model}.csv")
        pd.DataFrame(rows).to_csv(files[-1], index=False)
    assert G.main(["--fit", ",".join(map(str, files)), "--sms", "132"]) == 0
    out = capsys.readouterr().out
    assert "over 2 model(s)' forms, 132 SMs" in out and out.count("4x1024 w4") == 2 and out.count("1x2048 w4") == 2, out
    top = out.splitlines()[2].split()
    assert (top[1], top[2], top[4]) == ("1024", "4", "2048") and float(top[5]) == 2.0, out  # cap, per SM, long cap
    (tmp_path / "other.csv").write_text("x,y\n1,2\n")
    for argv, words in ((["--fit", str(tmp_path / "none.csv"), "--sms", "132"], "cannot read"),
                        (["--fit", str(files[0])], "--sms the SM count"),
                        (["--fit", str(files[0]), "--sms", "0"], "--sms the SM count"),
                        (["--fit", ""], "one or more CSV files"),
                        (["--fit", str(tmp_path / "other.csv"), "--sms", "132"], "no rule has a timed launch")):
        assert G.main(argv) == 2, argv
        assert words in capsys.readouterr().out, argv
