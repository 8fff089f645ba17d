"""Every tutorial notebook on a CUDA GPU with a model of real size: random weights in the exact
shape of Qwen3-0.6B (``nvkit.demo.shaped("qwen3-0.6b")``, built once from its config, no download),
passed to the notebooks through ``NVKIT_MODEL``. Prints the time of each notebook and its slowest
cells; the GPU-only cells run here instead of printing why they are skipped.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python -m pytest tests/gpu/test_notebooks_gpu.py -s``
"""

from __future__ import annotations

import pytest

from tests.test_notebooks import NOTEBOOKS, cell_seconds, run_notebook, third_party_stderr

GPU_CELL_TIMEOUT_S = 600
_timings: dict[str, float] = {}


@pytest.fixture(scope="module")
def shaped_model():
    import nvkit.demo
    return nvkit.demo.shaped("qwen3-0.6b")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_gpu(path, shaped_model, tmp_path):
    nb, seconds = run_notebook(path, tmp_path / "run", cell_timeout=GPU_CELL_TIMEOUT_S, NVKIT_MODEL=shaped_model)
    _timings[path.stem] = seconds
    slow = sorted(cell_seconds(nb), reverse=True)[:3]
    print(f"\n[gpu] {path.stem}: {seconds:.1f} s; slowest cells: "
          + "; ".join(f"{s:.1f} s {line[:50]!r}" for s, line in slow))
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for line in outputs.splitlines():
        if line.startswith("Skipped:"):
            print(f"[gpu] {path.stem}: {line}")  # e.g. FSDP with one GPU: said, not hidden
    # quiet on the GPU too (issue 24): the CUDA paths import libraries the CPU run never reaches
    noise = third_party_stderr(nb)
    assert not noise, f"{path.name} printed third-party stderr on the GPU: {noise[:3]}"


def test_gpu_timings_summary():
    if not _timings:
        pytest.skip("no notebook ran")
    print("\n[gpu] notebook timings (Qwen3-0.6B shape):")
    for k, v in _timings.items():
        print(f"[gpu]   {k}: {v:.1f} s")
    print(f"[gpu]   total: {sum(_timings.values()):.1f} s")
    # every tutorial that started also finished (a failed one is missing here, and fails above too)
    assert set(_timings) <= {p.stem for p in NOTEBOOKS} and all(v > 0 for v in _timings.values()), _timings
