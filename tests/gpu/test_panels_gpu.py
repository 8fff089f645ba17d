"""The faces on a real GPU: the Generate panel's status and ``%nvkit generate`` show the fast
path's compile progress ("preparing fast decode… N s") and then the text, and the Fine-tune
panel's estimate follows the compile decision finetune(compile="auto") will make (a short run
uncompiled, a long one compiled under the activation budget)."""

from __future__ import annotations

import time

import nbformat
import pytest
from nbclient import NotebookClient

import nvkit
from tests import demo_model  # noqa: E402


@pytest.fixture
def demo_cuda():
    s = nvkit.load(demo_model.path(), device_map="cuda")
    yield s
    s.unload()


def test_generate_panel_shows_the_compile_progress_then_both_rates(demo_cuda):
    from nvkit.ui.generate_panel import GeneratePanel
    p = GeneratePanel(session=demo_cuda)
    seen = []
    p.status.observe(lambda ch: seen.append(ch["new"]), "value")
    p.prompt.value = "NVIDIA GPUs are"
    p.max_new_tokens.value = 256       # long enough to compile the fast path (a fresh model: nothing compiled)
    p.start()
    p.wait(timeout=600)
    time.sleep(0.2)
    assert any(v.startswith("preparing fast decode… ") and v.endswith(" s") for v in seen), seen[:20]
    assert demo_cuda.last_stats.path == "fast"
    assert "tok/s overall · decode " in p.stats.value and "path fast" in p.stats.value
    p.close()


def test_finetune_estimate_follows_the_compile_decision(demo_cuda):
    from nvkit.memory.estimate import for_session
    from nvkit.train.compile import COMPILE_MIN_STEPS_COLD
    from nvkit.ui.finetune_panel import FinetunePanel
    from nvkit.units import fmt_bytes
    p = FinetunePanel()
    # plain text packs into rows of seq len tokens: the run's batches are then 16 × 1024, the shape
    # the panel's estimate (the run's own, from its rows) is of
    p.examples.value = "\n".join(["NVIDIA GPUs are fast at matrix multiplication."] * 4000)
    p.batch.value, p.seq_len.value = 16, 1024   # activations large enough that the budget shows
    kw = dict(mode="lora", batch_size=p.batch.value, seq_len=p.seq_len.value, lora_r=p.r.value,
              gradient_checkpointing=False, path="nvkit")
    short, long_ = (fmt_bytes(for_session(demo_cuda, compiled=c, **kw).total) for c in (False, True))
    assert short != long_
    p.steps.value = 30
    assert f"<b>{short}</b>" in p.estimate.value, p.estimate.value
    p.steps.value = COMPILE_MIN_STEPS_COLD
    assert f"<b>{long_}</b>" in p.estimate.value, p.estimate.value
    p.close()


def test_magic_prints_the_compile_progress_on_one_line_then_the_prompt():
    cells = ["import os; os.environ['HF_HUB_OFFLINE'] = '1'\n%load_ext nvkit\n"
             f"%nvkit load {demo_model.path()} --device-map cuda",
             '%nvkit generate -n 256 "NVIDIA GPUs are"']
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True).execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.output_type == "stream")
    assert text.startswith("\r(preparing fast decode… "), text[:200]
    # the progress line blanked, then the prompt and the text on it
    assert text.split("\r")[-1].startswith("NVIDIA GPUs are ") and "NvkitError" not in text, text[:400]
