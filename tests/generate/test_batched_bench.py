"""The decode benchmark's batched grid on the CPU: the cells' groups and rows, the paths that need
CUDA skipped with the reason, each group against its own plain path, and the grid argument."""

import pytest

from nvkit.benchmarks import decode as bench_decode
from nvkit.errors import NvkitError
from tests import demo_model  # noqa: E402


def test_grid_rows_on_the_cpu():
    df = bench_decode.run(model=demo_model.path(), paths=["padded generate", "nvkit batched"], grid="3x4,2x3",
                          n_prompts=2, batch_new_tokens=2, new_tokens=2, show=False)
    cells = df[df["group"].str.contains("new tokens") & ~df["group"].str.startswith("2 prompts ·")]
    groups = list(dict.fromkeys(cells["group"]))
    assert len(groups) == 2 and groups[0].startswith("3 prompts of ") and groups[0].endswith("· 4 new tokens")
    padded = cells[cells["path"] == "padded generate"]
    assert list(padded["tokens"]) == [12, 6] and (padded["tokens_per_s"] > 0).all()
    assert (padded["vs_plain"] == 1.0).all()  # each cell against its own padded generate
    skipped = cells[cells["path"] == "nvkit batched"]
    assert len(skipped) == 2 and skipped["note"].str.contains("needs CUDA").all()
    assert "generate_batch" not in set(cells["path"])  # not asked for


def test_grid_argument():
    assert bench_decode._grid_cells(None) == list(bench_decode.GRID)
    assert bench_decode._grid_cells("8x128, 256X512") == [(8, 128), (256, 512)]
    assert bench_decode._grid_cells([(2, 3)]) == [(2, 3)]
    for bad in ("8by128", [(0, 4)], [(2,)], "x"):
        with pytest.raises(NvkitError, match="grid must be"):
            bench_decode._grid_cells(bad)
    assert bench_decode.main(["--model", "demo", "--grid", "nope", "--paths", "nvkit batched"]) == 2
