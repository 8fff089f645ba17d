"""The short-run rows of `nvkit bench --lora` (wall time of whole runs, plain vs nvkit cold/warm)."""

from __future__ import annotations

import pytest

from nvkit.errors import NvkitError


def test_short_runs_on_the_cpu(path):
    from nvkit.benchmarks.lora import short_runs
    df = short_runs(model=path, steps=(2,), batch_size=2, seq_len=32, r=4, device="cpu")
    assert list(df["variant"]) == ["plain", "nvkit cold", "nvkit warm"] and list(df["steps"]) == [2, 2, 2]
    assert (df["wall_s"] > 0).all() and (df["tokens_per_s"] > 0).all()
    assert df.loc[df["variant"] == "plain", "wall_vs_plain"].item() == 1.0
    assert all("CPU" in c for c in df.loc[df["variant"] != "plain", "compile"])


@pytest.mark.parametrize("kw, match", [(dict(steps=()), "steps"), (dict(steps=(0,)), "steps"),
                                       (dict(batch_size=0), "batch_size"), (dict(device="tpu"), "device")])
def test_short_runs_bad_input(path, kw, match):
    from nvkit.benchmarks.lora import short_runs
    with pytest.raises(NvkitError, match=match):
        short_runs(model=path, **kw)
