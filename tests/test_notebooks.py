"""The tutorial notebooks: committed clean, each in step with its jupytext source, and every one
executes top to bottom on the CPU through a real kernel (its asserts are the checks) without a
word on stderr from a third-party library.

Each tutorial is a pair: ``notebooks/NN-name.ipynb`` (where the server, the Launcher, binder and
``nvkit lab`` find it) and ``notebooks/src/NN-name.py`` in jupytext's percent format, paired by
``notebooks/jupytext.toml``. Conventions the checks below hold them to:
- the first cell is markdown starting with ``# Title`` (the Launcher shows that line);
- the second is the parameters cell (``MODEL = os.environ.get("NVKIT_MODEL", "demo")``, ...), so
  CI runs them on the CPU with the demo model and the GPU run swaps in a real-size model;
- a cell that needs a CUDA GPU prints ``Skipped: ...`` with the reason when there is none;
- ``assert`` lines check the key results, so executing a notebook is a test.

Each notebook runs from a copy in a temporary directory (nothing is written into notebooks/) with
``HF_HUB_OFFLINE=1``, the demo model and no fake GPUs (02 sets ``NVKIT_FAKE_GPUS`` itself when the
machine has no GPU). ``run_notebook`` is shared with tests/gpu/test_notebooks_gpu.py.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
SOURCE_DIR = NOTEBOOK_DIR / "src"  # the jupytext pairs, as notebooks/jupytext.toml says
CELL_TIMEOUT_S = 300
TOTAL_BUDGET_S = 600   # the limit for all notebooks on the CPU
PARAMS_LINE = 'MODEL = os.environ.get("NVKIT_MODEL", "demo")'

_timings: dict[str, float] = {}


def kernel_env(tmp: Path, **overrides) -> dict:
    """The environment the notebook's kernel starts with."""
    env = dict(os.environ)
    # CUDA_VISIBLE_DEVICES is kept: on a shared GPU host it is the share this run may use
    for k in ("NVKIT_FAKE_GPUS", "NVKIT_MODEL", "NVKIT_DEVICE_MAP", "NVKIT_QUANT", "NVKIT_STEPS", "NVKIT_NPROC",
              "NVKIT_BATCH", "NVKIT_NEW_TOKENS"):
        env.pop(k, None)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               NVKIT_CACHE=str(tmp / "nvkit-cache"), MPLBACKEND="agg", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in overrides.items() if v is not None})
    return env


def run_notebook(src: Path, workdir: Path, cell_timeout: int = CELL_TIMEOUT_S, **env_overrides):
    """Execute a copy of ``src`` in ``workdir`` with a fresh kernel; returns (executed nb, seconds).
    Raises nbclient's CellExecutionError (with the failing cell and traceback) on any error."""
    from nbclient import NotebookClient

    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / src.name
    shutil.copy(src, copy)
    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=False,
                            store_widget_state=False, record_timing=True, startup_timeout=120,
                            resources={"metadata": {"path": str(workdir)}})
    t0 = time.perf_counter()
    client.execute(env=kernel_env(workdir, **env_overrides))
    return nb, time.perf_counter() - t0


def cell_seconds(nb) -> list[tuple[float, str]]:
    """(seconds, first source line) per code cell, from nbclient's recorded timing."""
    from datetime import datetime
    out = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        t = c.metadata.get("execution", {})
        try:
            a = datetime.fromisoformat(t["iopub.execute_input"].replace("Z", "+00:00"))
            b = datetime.fromisoformat(t["shell.execute_reply"].replace("Z", "+00:00"))
            out.append(((b - a).total_seconds(), c.source.splitlines()[0] if c.source else ""))
        except (KeyError, ValueError):
            pass
    return out


# Lines nvkit itself writes to stderr start so (nvkit's warnings and the magic's errors).
NVKIT_STDERR = ("nvkit:", "nvkit ", "NvkitError:")


def third_party_stderr(nb) -> list[str]:
    """The stderr output of an executed notebook that is not nvkit's own, one entry per output:
    'cell N (its first line): the text'. nvkit routes the third-party messages it knows to be noise
    (nvkit.quiet); anything listed here reached the user as a pink block."""
    found = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        for o in c.outputs:
            if o.get("output_type") != "stream" or o.get("name") != "stderr":
                continue
            lines = [ln for ln in o.get("text", "").splitlines() if ln.strip()]
            if any(not ln.lstrip().startswith(NVKIT_STDERR) for ln in lines):
                first = c.source.splitlines()[0] if c.source else ""
                found.append(f"cell {i} ({first[:60]!r}): {o['text'][:1000]}")
    return found


# --- static checks -------------------------------------------------------------------------------

def test_there_are_tutorials():
    names = [p.stem for p in NOTEBOOKS]
    assert names[:3] == ["00-start-here", "01-check-the-gpu", "02-select-gpus"], names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"
    assert "widgets" not in nb.metadata, f"{path.name}: saved widget state in the metadata; clear it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_title_and_parameters(path):
    nb = nbformat.read(path, as_version=4)
    first, second = nb.cells[0], nb.cells[1]
    assert first.cell_type == "markdown" and first.source.startswith("# "), "first cell: a '# Title' markdown cell"
    assert second.cell_type == "code" and PARAMS_LINE in second.source, "second cell: the parameters cell"


def test_every_notebook_has_its_source():
    notebooks = sorted(p.stem for p in NOTEBOOKS)
    sources = sorted(p.stem for p in SOURCE_DIR.glob("*.py"))
    assert notebooks == sources, (f"notebooks/*.ipynb and notebooks/src/*.py must pair one to one "
                                  f"(run `jupytext --sync` on the one that is alone): {notebooks} vs {sources}")


def test_jupytext_pairs_them_as_the_tests_do():
    # the config is what JupyterLab's jupytext and `jupytext --sync` follow
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file
    from jupytext.paired_paths import paired_paths

    path = NOTEBOOKS[0]
    config_file = find_jupytext_configuration_file(str(NOTEBOOK_DIR))
    assert config_file and Path(config_file) == NOTEBOOK_DIR / "jupytext.toml", config_file
    formats = load_jupytext_configuration_file(config_file).default_formats(str(path))
    paired = [(Path(p), fmt.get("format_name")) for p, fmt in paired_paths(str(path), "ipynb", formats)]
    assert paired == [(path, None), (SOURCE_DIR / f"{path.stem}.py", "percent")], paired


def _cells(nb) -> list[tuple]:
    return [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_and_source_in_sync(path, source_dir=SOURCE_DIR):
    import jupytext

    source = source_dir / f"{path.stem}.py"
    text = jupytext.read(source)
    nb = nbformat.read(path, as_version=4)
    fix = f"edit one, then `jupytext --sync {source.relative_to(source.parents[2])}`"
    a, b = _cells(text), _cells(nb)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"{path.name} cell {i} differs from {source.name}: {x!r:.200} vs {y!r:.200}; {fix}"
    assert len(a) == len(b), f"{source.name} has {len(a)} cells, {path.name} {len(b)}; {fix}"
    assert text.metadata.get("kernelspec") == nb.metadata.get("kernelspec"), f"kernelspec differs; {fix}"


def test_the_sync_check_catches_a_difference(tmp_path):
    # the check above must fail when one side of a pair was edited and not synced
    path = NOTEBOOKS[0]
    (tmp_path / "notebooks" / "src").mkdir(parents=True)
    src = tmp_path / "notebooks" / "src" / f"{path.stem}.py"
    text = (SOURCE_DIR / src.name).read_text(encoding="utf-8")
    src.write_text(text.replace("# # ", "# # Edited: ", 1), encoding="utf-8")
    with pytest.raises(AssertionError, match="cell 0 differs"):
        test_notebook_and_source_in_sync(path, source_dir=src.parent)
    src.write_text(text + "\n# %%\nprint('a cell only the .py has')\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="cells"):
        test_notebook_and_source_in_sync(path, source_dir=src.parent)


def test_the_clean_check_catches_outputs(tmp_path):
    # the check above must fail on a notebook that was saved after running
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    p = tmp_path / NOTEBOOKS[0].name
    nbformat.write(nb, p)
    with pytest.raises(AssertionError, match="outputs or execution counts"):
        test_committed_without_outputs(p)


# --- execution -----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_cpu(path, tmp_path):
    nb, seconds = run_notebook(path, tmp_path / "run")
    _timings[path.stem] = seconds
    slow = sorted(cell_seconds(nb), reverse=True)[:3]
    print(f"\n{path.stem}: {seconds:.1f} s; slowest cells: "
          + "; ".join(f"{s:.1f} s {line[:50]!r}" for s, line in slow))
    # a skipped GPU cell must say so; none may pass silently
    texts = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    import torch
    if not torch.cuda.is_available():
        gpu_cells = [c for c in nb.cells if c.cell_type == "code" and "Skipped:" in c.source]
        assert texts.count("Skipped:") >= min(1, len(gpu_cells))
    assert not (NOTEBOOK_DIR / "nvkit-runs").exists(), "a notebook wrote into notebooks/"
    noise = third_party_stderr(nb)
    assert not noise, (f"{path.name} printed third-party stderr (route it where nvkit calls the library, "
                       f"see nvkit/quiet.py):\n" + "\n".join(noise))


def test_the_stderr_check_catches_third_party_lines():
    nb = nbformat.v4.new_notebook()
    quiet_cell = nbformat.v4.new_code_cell("nvkit.select_gpus([0])")
    quiet_cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="nvkit: CUDA is already initialised\n"),
                          nbformat.v4.new_output("stream", name="stdout", text="Warning: printed, not stderr\n")]
    noisy_cell = nbformat.v4.new_code_cell("import bitsandbytes\nx = 1")
    noisy_cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="Failed to load CPU gemm_4bit_forward\n")]
    nb.cells = [quiet_cell, noisy_cell]
    assert third_party_stderr(nb) == ["cell 1 ('import bitsandbytes'): Failed to load CPU gemm_4bit_forward\n"]


def test_total_time_within_budget():
    if len(_timings) < len(NOTEBOOKS):
        pytest.skip("runs only after every notebook ran in this session (no -k filter)")
    total = sum(_timings.values())
    print("\n" + "\n".join(f"  {k}: {v:.1f} s" for k, v in _timings.items()) + f"\n  total: {total:.1f} s")
    assert total < TOTAL_BUDGET_S, f"the notebooks took {total:.0f} s on the CPU; keep them under {TOTAL_BUDGET_S} s"
