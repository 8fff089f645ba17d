"""nvkit.bench on the CPU with small sizes: one row per choice plus plain transformers, greedy
agreement against the reference, unavailable choices as rows with the reason, every timed run
producing exactly the tokens it asked for, and options that do not fit a mode refused."""

import functools
import json

import pytest

from nvkit import NvkitError
from nvkit.benchmarks.backends import COLUMNS, bench, bench_chart, cli_main
from tests import demo_model  # noqa: E402


@pytest.fixture(scope="module")
def df():
    return bench(demo_model.path(), backends=["sdpa", "eager", "flash_attention_2"], quantizations=[None, "int8"],
                 prompt_len=12, new_tokens=6, repeats=1, device_map="cpu")


def test_rows_and_reference(df):
    assert list(df.columns) == COLUMNS
    assert list(df["row"]) == ["transformers (plain)", "nvkit sdpa", "nvkit sdpa + int8", "nvkit eager",
                               "nvkit eager + int8", "nvkit flash_attention_2", "nvkit flash_attention_2 + int8"]
    ok = df[df["error"] == ""]
    assert len(ok) == 5
    # exactly the asked tokens, wherever this CPU's rounding makes the model put its EOS, so every rate
    # is measured: time to the first token and the decode after it come from the same run
    assert (ok["tokens"] == 6).all() and (ok["note"] == "").all()
    assert (ok["ttft_ms"] > 0).all() and (ok["prefill_tok_s"] > 0).all() and (ok["decode_tok_s"] > 0).all()
    by = df.set_index("row")
    assert by.loc["transformers (plain)", "match_rate"] == 1.0
    assert by.loc["nvkit sdpa", "match_rate"] == 1.0      # same weights, same backend: same greedy tokens
    assert by.loc["nvkit eager", "match_rate"] >= 0.8
    assert 0.0 <= by.loc["nvkit sdpa + int8", "match_rate"] <= 1.0
    assert "needs a CUDA GPU" in by.loc["nvkit flash_attention_2", "error"]


def test_chart(df):
    import plotly.graph_objects as go
    fig = bench_chart(df)
    assert isinstance(fig, go.Figure) and len(fig.data) == 2 and list(fig.data[0].x) == list(df["row"])
    with pytest.raises(NvkitError, match="DataFrame nvkit.bench returned"):
        bench_chart({"a": 1})


@pytest.mark.parametrize("kw, match", [
    (dict(backends=[]), "non-empty"),
    (dict(backends=[3]), "each entry must be a name"),
    (dict(quantizations=[1]), "each entry must be a name or None"),
    (dict(prompt_len=0), "prompt_len must be"),
    (dict(new_tokens=1.5), "new_tokens must be"),
    (dict(repeats=True), "repeats must be"),
    (dict(decode=True, lora=True), "Choose one"),
    (dict(colour=1), "Unknown bench option colour"),
    (dict(paths=["fast"]), "paths does not apply to the backend × quantization comparison: it belongs to the decode"),
    (dict(lora=True, prompt_len=8), "prompt_len does not apply to the LoRA comparison"),
    (dict(lora=True, backends=["eager"]), "backends does not apply to the LoRA comparison"),
    (dict(decode=True, batch_size=2), "batch_size does not apply to the decode comparison .* the LoRA comparison"),
    (dict(decode=True, steps=3), "steps does not apply to the decode comparison"),
    (dict(lora=True, turbo=1), "Unknown bench option turbo"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(NvkitError, match=match):
        bench(demo_model.path(), **kw)


def _recording(monkeypatch, module, seen, result):
    """Replace ``module.run`` by one that records its keywords; it keeps the real signature, which is
    what ``bench`` checks options against."""
    real = module.run

    @functools.wraps(real)
    def run(**kw):
        seen[module.__name__] = kw
        return result
    monkeypatch.setattr(module, "run", run)


def test_decode_and_lora_dispatch(monkeypatch):
    import nvkit.benchmarks.decode as bd
    import nvkit.benchmarks.lora as bl
    seen = {}
    _recording(monkeypatch, bd, seen, "decode-df")
    _recording(monkeypatch, bl, seen, "lora-df")
    # each mode gets what it takes and nothing it does not (the modes' own defaults stay theirs)
    assert bench("demo", decode=True, new_tokens=5, n_prompts=3) == "decode-df"
    assert seen[bd.__name__] == dict(model="demo", new_tokens=5, n_prompts=3)
    assert bench("demo", lora=True, batch_size=2, seq_len=64, steps=3) == "lora-df"
    assert seen[bl.__name__] == dict(model="demo", batch_size=2, seq_len=64, steps=3)


def test_cli_json(capsys):
    """``--json``: stdout carries the JSON alone, also where a session was loaded in the process
    (the bench says on stderr that it unloads it, as in a notebook that ran ``nvkit.load`` first)."""
    import nvkit
    nvkit.load(demo_model.path(), device_map="cpu")
    capsys.readouterr()  # what the load said (a session an earlier test left is unloaded first): not the bench's
    rc = cli_main([demo_model.path(), "--backends", "sdpa", "--quant", "none", "--prompt-len", "6", "--new-tokens", "3",
                   "--repeats", "1", "--device-map", "cpu", "--json"])
    assert rc == 0
    out = capsys.readouterr()
    assert "unloading" in out.err
    rows = json.loads(out.out)
    assert [r["row"] for r in rows] == ["transformers (plain)", "nvkit sdpa"] and rows[1]["match_rate"] == 1.0
    assert cli_main(["--help"]) == 0


def test_cli_decode_paths(monkeypatch, capsys):
    import pandas as pd

    import nvkit.benchmarks.decode as bd
    seen = {}
    _recording(monkeypatch, bd, seen, pd.DataFrame([{"path": "fast", "tokens_per_s": 1.0}]))
    assert cli_main(["demo", "--decode", "--paths", "fast, fast+split", "--repeats", "2"]) == 0
    assert seen[bd.__name__] == dict(model="demo", paths=["fast", "fast+split"], repeats=2)
    assert cli_main(["demo", "--paths", "fast"]) == 2  # --paths without --decode
    assert "--paths does not apply to the backend comparison (no --decode/--lora): it belongs to --decode" \
        in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--lora", "--prompt-len", "8"], "--prompt-len does not apply to --lora: it belongs to the backend comparison"),
    (["--lora", "--quant", "nf4"], "--quant does not apply to --lora"),
    (["--decode", "--steps", "3"], "--steps does not apply to --decode: it belongs to --lora"),
    (["--decode", "--device-map", "cpu"], "--device-map does not apply to --decode"),
    (["--seq-len", "64"], "--seq-len does not apply to the backend comparison (no --decode/--lora): it belongs to --lora"),
    (["shape:gpt-9", "--lora"], "Unknown model shape 'gpt-9'"),
])
def test_cli_refuses_what_a_mode_does_not_take(argv, words, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("nvkit bench: ") and words in err


def test_cli_modes_exclude_each_other(capsys):
    assert cli_main(["--decode", "--lora"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_lora_health_and_text_rows():
    from transformers import AutoTokenizer

    from nvkit.benchmarks.lora import health, text_rows
    assert health([11.9, 11.0, 10.2, 9.5], [1.0, 2.0, 1.5, 1.2]) == ""
    assert health([11.9, 0.0], [float("nan"), 0.0]) == "grad_norm nan at step 1"  # what the H200 run logged
    assert health([11.9, float("nan")], [1.0, 1.0]) == "loss nan at step 2"
    assert health([11.9, 11.0], [1.0, None]) == "grad_norm None at step 2"
    assert health([11.0, 11.2, 11.1, 11.3], [1.0] * 4).startswith("the loss did not fall")
    assert health([11.0, 11.5, 10.0, 10.4], [1.0] * 4) == ""  # noisy steps: quarters are compared, not two steps
    assert health([], []) == "no loss was logged"
    rows = text_rows(demo_model.path(), 32, 5)
    n_tok = len(AutoTokenizer.from_pretrained(demo_model.path()))
    assert len(rows) == 5 and all(len(r.input_ids) == 32 and r.labels == r.input_ids for r in rows)
    assert all(0 <= t < n_tok for r in rows for t in r.input_ids)  # text: every id one the tokenizer makes
    assert rows[0].input_ids != rows[1].input_ids
