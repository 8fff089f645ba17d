"""``nvkit bench MODEL --afternoon`` (nvkit.benchmarks.afternoon) on the CPU with the demo model:
every step's row, the checks that hold on any device (each list made the tokens it claims, top-k 1
is greedy, ``deterministic=True`` gives each prompt its text alone, ``tokenizer=`` beside
``stop_strings`` is accepted), the time targets marked as the GPU's,
and the command's refusals. The GPU runs are in docs/benchmarks.md."""

import contextlib
import io
import json

import pytest

from nvkit.benchmarks import afternoon, backends
from nvkit.errors import NvkitError
from tests import demo_model


def test_an_afternoon_on_the_cpu_has_every_step_and_holds_what_holds_there():
    df = afternoon.run(demo_model.path(), lists=(3, 2), list_tokens=4, invariance=(2, 3), invariance_tokens=6,
                       long_tokens=8, finetune_steps=2, compare_tokens=4, first_tokens=4, show=False)
    assert list(df.columns) == afternoon.COLUMNS
    assert list(df["step"]) == ["first request", "list", "list", "same answers", "same answers", "same answers",
                                "arguments", "long request", "fine-tune", "long request", "compare"]
    by = {(r.step, r.request): r for r in df.itertuples()}
    assert by[("same answers", "top_k=1 sampling vs greedy")].ok is True
    assert by[("arguments", "stop_strings with tokenizer=")].ok is True
    lists = df[df["step"] == "list"]
    assert lists["ok"].isna().all() and (lists["path"] == "generate").all()  # whole lists; no time target on a CPU
    assert by[("first request", "4 tokens")].target == "≤ 1.2 s (GPU)" and by[("first request", "4 tokens")].ok is None
    invariance = by[("same answers", "a prompt alone vs in lists of 2–3")]
    differ = int(invariance.note.split(" of 5 rows differ")[0])  # 2 + 3 rows, each against its prompt alone
    assert 0 <= differ <= 5 and invariance.ok is None and invariance.target == ""  # the default: reported, not held
    # deterministic=True is held to the target: on a CPU each prompt of a list runs alone, so none differs
    det = by[("same answers", "a prompt alone vs in lists of 2–3, deterministic=True")]
    assert det.ok is True and det.note.startswith("0 of 5 rows differ (generate); "), det.note
    assert "of the default" in det.note and "each prompt runs alone" in det.path, det.path
    assert by[("compare", "2 prompts × 4, base and tuned")].note.startswith("tok/s base ")
    assert (df["seconds"].dropna() > 0).all()


@pytest.mark.parametrize("kw, match", [(dict(lists=()), "lists must be"), (dict(lists=(0,)), "lists must be"),
                                       (dict(invariance=(300,)), "invariance must be"),
                                       (dict(first_tokens=0), "first_tokens"), (dict(finetune_steps=-1), "finetune_steps"),
                                       (dict(list_tokens="8"), "list_tokens")])
def test_wrong_settings_are_refused_before_loading(kw, match):
    with pytest.raises(NvkitError, match=match):
        afternoon.run("no-such-model", **kw)


def test_the_command_refuses_options_of_other_modes():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert backends.cli_main(["--afternoon", "--repeats", "3"]) != 0
    assert "--repeats does not apply to --afternoon" in err.getvalue()
