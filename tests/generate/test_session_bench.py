"""The session benchmark (``nvkit bench --session``) on the CPU with the demo model: its rows, its
totals, the fine-tune part and the cold/warm processes (the H200 figures come from the GPU run)."""

import pytest

import nvkit
from nvkit.benchmarks import session as bench_session
from nvkit.errors import NvkitError
from tests import demo_model  # noqa: E402


def test_session_sequence_rows_and_totals():
    s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    try:
        df = bench_session.run(model=s, requests="6,3,4", plain="6,4", static="6", finetune_steps=2, n_prompts=3,
                               list_new_tokens=3, prompt_len=8, show=False)
    finally:
        s.unload()
    seq = df[df["part"] == "sequence"]
    ours = seq[seq["path"] == "nvkit default"]
    assert list(ours["request"]) == [0, 1, 2, "total"] and list(ours["new_tokens"]) == [6, 3, 4, 13]
    assert (ours["ran"].iloc[:3] == "generate").all()  # the CPU: plain generate, no reason shown there
    plain = seq[seq["path"] == "plain generate"]
    assert list(plain["request"]) == [0, 2, 1, "total"]  # 6 and 4 ran, 3 was estimated from their rate
    assert list(plain["note"].iloc[:2]) == ["", ""] and plain["note"].iloc[2].startswith("est. from its ")
    assert plain["note"].iloc[-1] == "measured + est."
    # plain generate and nvkit's fast=False run in neighbouring pairs, each pair in the other order
    pairs = seq[seq["path"].isin(["plain generate", "nvkit fast=False"]) & ~seq["note"].str.startswith("est.")]
    pairs = pairs[pairs["request"] != "total"]
    assert [(r.request, r.path) for r in pairs.itertuples()] == [
        (0, "plain generate"), (0, "nvkit fast=False"), (2, "nvkit fast=False"), (2, "plain generate")]
    assert "static+compile" not in set(seq["path"])  # compiled static cache: benchmarked on CUDA only
    assert set(df["part"]) == {"sequence", "fine-tune", "after fine-tune", "3 prompts"}
    after = df[(df["part"] == "after fine-tune") & (df["path"] == "nvkit default")]
    assert list(after["new_tokens"]) == [6, 3, 4, 13]
    assert set(df[df["part"] == "3 prompts"]["path"]) == {"nvkit default", "padded generate"}
    tot = bench_session.summary(df)
    row = tot[(tot["part"] == "sequence") & (tot["path"] == "nvkit default")].iloc[0]
    assert row["plain_over_nvkit"] > 0
    with pytest.raises(NvkitError, match="requests"):
        bench_session.run(model=s, requests="ten")


def test_cold_and_warm_phases_run_in_processes_of_their_own(tmp_path):
    df = bench_session.run_phases(model=demo_model.path(), requests="3", plain="", static="", finetune_steps=0, n_prompts=0,
                                  prompt_len=8, csv=str(tmp_path / "session.csv"), folder=str(tmp_path / "run"))
    assert list(dict.fromkeys(df["phase"])) == ["cold", "warm"] and (tmp_path / "session.csv").is_file()
    # warm gets empty torch caches of its own; a restart reuses the cold phase's (nothing new beside them)
    assert (tmp_path / "run" / "inductor-warm").is_dir()
    bench_session.run_phases(model=demo_model.path(), phases=("restart",), requests="3", plain="", static="",
                             finetune_steps=0, n_prompts=0, prompt_len=8, folder=str(tmp_path / "run"))
    assert not (tmp_path / "run" / "inductor-restart").exists()
    assert (df[df["path"] == "whole process"]["seconds"] > 0).all()
    with pytest.raises(NvkitError, match="phases"):
        bench_session.run_phases(model=demo_model.path(), phases=("tepid",))
    # a cold phase in a folder that already holds artifacts would not be cold: refused, nothing removed
    (tmp_path / "kept" / "nvkit" / "fast-decode").mkdir(parents=True)
    (tmp_path / "kept" / "nvkit" / "fast-decode" / "a.bin").write_bytes(b"x")
    with pytest.raises(NvkitError, match="cold phase needs nothing on disk"):
        bench_session.run_phases(model=demo_model.path(), folder=str(tmp_path / "kept"), requests="3")
    assert (tmp_path / "kept" / "nvkit" / "fast-decode" / "a.bin").read_bytes() == b"x"


def test_cli_session_dispatch(monkeypatch):
    from nvkit.benchmarks.backends import cli_main
    seen = {}
    monkeypatch.setattr(bench_session, "run_phases", lambda **kw: seen.update(kw))
    assert cli_main(["demo", "--session", "--csv", "x.csv"]) == 0
    assert seen == dict(model="demo", csv="x.csv", folder=None, phases=("cold", "warm"))
    assert cli_main(["demo", "--session", "--phases", "warm"]) == 0 and seen["phases"] == ("warm",)
    assert cli_main(["demo", "--session", "--plain", "none", "--static", "256,40"]) == 0
    assert seen["plain"] == "" and seen["static"] == "256,40"


def test_the_paths_requests_must_be_in_the_sequence(tmp_path):
    # refused before any phase's process starts, and nothing is written
    for kw in (dict(plain="100,999"), dict(static="seven"), dict(requests="3", plain="100")):
        with pytest.raises(NvkitError, match="plain|static|requests"):
            bench_session.run_phases(model=demo_model.path(), folder=str(tmp_path / "run"), **kw)
    assert not (tmp_path / "run").exists()
    with pytest.raises(NvkitError, match="plain must be 'all'"):
        bench_session.run(model="demo", plain="999")
