"""``%nvkit finetune`` with evaluation and resume, in a real kernel (nbclient): --eval-split and
--eval-every reach nvkit.finetune and the evaluations are printed, --save-every writes checkpoints
that --resume continues, bad values are one-line errors and the session stays usable."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from tests import demo_model  # noqa: E402

QA = [{"prompt": f"Which GPU holds shard {i}?", "response": f"GPU {i % 4} holds shard {i}."} for i in range(16)]


def _text(cell):
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type == "error":
            out.append(f"ERROR {o.ename}: {o.evalue}")
    return "".join(out)


@pytest.fixture(scope="module")
def nb(tmp_path_factory):
    path = demo_model.path()
    out = tmp_path_factory.mktemp("ft-magic") / "run"
    body = "\n".join(json.dumps(r) for r in QA)
    common = f"--batch-size 4 --seq-len 64 --output-dir {out}"
    cells = [
        "import os; os.environ['HF_HUB_OFFLINE'] = '1'\nimport torch; torch.set_num_threads(2)\n"
        f"%load_ext nvkit\n%nvkit load {path}",
        f"%%nvkit finetune --steps 4 --save-every 2 --eval-split 0.25 --eval-every 2 {common}\n{body}",   # 1
        "import nvkit; s = nvkit.session(); run = s.training\n"
        "print('EVAL', [e['step'] for e in run.eval_history], run.info['eval']['examples'], run.checkpoint)",  # 2
        f"%%nvkit finetune --steps 6 --eval-split 0.25 --eval-every 2 --resume {common}\n{body}",       # 3
        "print('HIST', [h['step'] for h in s.training.history], s.training.info['resumed_from'])",         # 4
        f"%%nvkit finetune --resume-from /no/such/checkpoint-3 --steps 6 {common}\n{body}",              # 5
        f"%%nvkit finetune --steps 2 --eval-split 2 {common}\n{body}",                                      # 6
        "print('USABLE', bool(s.generate('GPU', max_new_tokens=2)))",                                     # 7
    ]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=True).execute()
    return notebook, out


def test_eval_options_reach_finetune_and_are_printed(nb):
    notebook, out = nb
    text = _text(notebook.cells[1])
    assert "ERROR" not in text and "NvkitError" not in text, text
    assert [line.split(" · ")[0] for line in text.splitlines() if line.startswith("eval at step")] == \
        ["eval at step 0", "eval at step 2", "eval at step 4"]
    assert "eval loss " in text and " → " in text and "perplexity" in text
    assert f"EVAL [0, 2, 4] 4 {out / 'checkpoint-4'}" in _text(notebook.cells[2])


def test_resume_continues_the_latest_checkpoint(nb):
    notebook, out = nb
    text = _text(notebook.cells[3])
    assert f"resuming at step 4 from {out / 'checkpoint-4'}" in text and "Done: 6 steps" in text, text
    assert f"HIST [5, 6] {out / 'checkpoint-4'}" in _text(notebook.cells[4])


def test_bad_values_say_why_and_the_session_stays_usable(nb):
    notebook, _ = nb
    assert "NvkitError" in _text(notebook.cells[5]) and "No checkpoint folder" in _text(notebook.cells[5])
    assert "NvkitError" in _text(notebook.cells[6]) and "eval_split" in _text(notebook.cells[6])
    assert "USABLE True" in _text(notebook.cells[7])
