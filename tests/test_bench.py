"""nvkit.bench on the CPU with small sizes: one row per choice plus plain transformers, greedy
agreement against the reference, unavailable choices as rows with the reason."""

import json

import pytest

from nvkit import NvkitError
from nvkit.benchmarks.backends import COLUMNS, bench, bench_chart, cli_main
from tests.choices_model import model_path


@pytest.fixture(scope="module")
def df():
    return bench(model_path(), backends=["sdpa", "eager", "flash_attention_2"], quantizations=[None, "int8"],
                 prompt_len=12, new_tokens=6, repeats=1, device_map="cpu")


def test_rows_and_reference(df):
    assert list(df.columns) == COLUMNS
    assert list(df["row"]) == ["transformers (plain)", "nvkit sdpa", "nvkit sdpa + int8", "nvkit eager",
                               "nvkit eager + int8", "nvkit flash_attention_2", "nvkit flash_attention_2 + int8"]
    ok = df[df["error"] == ""]
    assert len(ok) == 5
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
    (dict(colour=1), "Unknown bench option"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(NvkitError, match=match):
        bench(model_path(), **kw)


def test_decode_and_lora_dispatch(monkeypatch):
    import nvkit.benchmarks.decode as bd
    import nvkit.benchmarks.lora as bl
    seen = {}
    monkeypatch.setattr(bd, "run", lambda **kw: seen.setdefault("decode", kw) and "decode-df")
    monkeypatch.setattr(bl, "run", lambda **kw: seen.setdefault("lora", kw) and "lora-df")
    assert bench("demo", decode=True, new_tokens=5, extra=1) == "decode-df"
    assert seen["decode"]["new_tokens"] == 5 and seen["decode"]["extra"] == 1
    assert bench("demo", lora=True) == "lora-df" and seen["lora"]["model"] == "demo"


def test_cli_json(capsys):
    rc = cli_main([model_path(), "--backends", "sdpa", "--quant", "none", "--prompt-len", "6", "--new-tokens", "3",
                   "--repeats", "1", "--device-map", "cpu", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["row"] for r in rows] == ["transformers (plain)", "nvkit sdpa"] and rows[1]["match_rate"] == 1.0
    assert cli_main(["--help"]) == 0


def test_cli_decode_paths(monkeypatch, capsys):
    import pandas as pd

    import nvkit.benchmarks.decode as bd
    seen = {}
    monkeypatch.setattr(bd, "run", lambda **kw: seen.update(kw) or pd.DataFrame([{"path": "fast", "tokens_per_s": 1.0}]))
    assert cli_main(["demo", "--decode", "--paths", "fast, fast+triton", "--repeats", "2"]) == 0
    assert seen["paths"] == ["fast", "fast+triton"] and seen["repeats"] == 2
    assert cli_main(["demo", "--paths", "fast"]) == 2  # --paths without --decode
    assert "--decode" in capsys.readouterr().err
