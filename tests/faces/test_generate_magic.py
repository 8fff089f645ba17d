"""``%nvkit generate`` options in a real kernel (nbclient): each option reaches Session.generate."""

import nbformat
import pytest
from nbclient import NotebookClient

from tests import demo_model  # noqa: E402


def _text(cell):
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type == "error":
            out.append(f"ERROR {o.ename}: {o.evalue}")
    return "".join(out)


@pytest.fixture(scope="module")
def nb():
    path = demo_model.path()
    cells = [
        f"import os; os.environ['HF_HUB_OFFLINE'] = '1'\n%load_ext nvkit\n%nvkit load {path} --device-map cpu --dtype float32",
        '%nvkit generate -n 5 "Hello there"',                                                    # 1
        "import nvkit; s = nvkit.session(); print('STATS', s.last_stats.new_tokens, s.last_stats.path)",  # 2
        '%nvkit generate -n 6 --sample --temperature 0.7 --top-p 0.9 --top-k 20 --seed 3 --no-stream "Hello there"',  # 3
        '%nvkit generate -n 6 --sample --temperature 0.7 --top-p 0.9 --top-k 20 --seed 3 --no-stream "Hello there"',  # 4
        '%nvkit generate -n 3 --chat --system "Answer briefly." "What is a GPU?"',              # 5
        "print('PROMPT_TOKENS', s.last_stats.prompt_tokens)",                                    # 6
        '%nvkit generate -n 3 --no-fast "Hello there"',                                           # 7
        '%nvkit generate -n 3 --fast "Hello there"',                                              # 8: CPU: clear error
        "%%nvkit generate --batch -n 4\nNVIDIA GPUs are\n\nHello there\nA",                      # 9
        "print('BATCH', s.last_stats.prompts_done, s.last_stats.path)",                          # 10
        '%nvkit generate --temperature hot "x"',                                                  # 11: bad value
        '%nvkit generate --batch "x"',                                                            # 12: --batch needs a cell
        '%nvkit generate -n 2 "still usable"',                                                    # 13
        "%%nvkit generate --batch --deterministic -n 4\nNVIDIA GPUs are\nHello there",          # 14
        "print('DET', s.last_stats.prompts_done, s.last_stats.how)",                              # 15
        "import json; print(json.dumps([s.generate(p, max_new_tokens=4) for p in ('NVIDIA GPUs are', 'Hello there')]))",  # 16
    ]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(notebook, timeout=240, kernel_name="python3", allow_errors=True).execute()
    return notebook


def test_plain_line_streams_prompt_and_five_tokens(nb):
    out = _text(nb.cells[1])
    assert out.startswith("Hello there") and "ERROR" not in out
    assert "STATS 5 generate" in _text(nb.cells[2])


def test_sampling_options_and_seed_are_passed(nb):
    a, b = _text(nb.cells[3]), _text(nb.cells[4])
    assert a.startswith("Hello there") and a == b  # same seed, same sample


def test_chat_and_system_use_the_template(nb):
    assert "ERROR" not in _text(nb.cells[5])
    n = int(_text(nb.cells[6]).split()[-1])
    assert n > len("What is a GPU?".split()) + 4  # the template's role markers and system text are in


def test_fast_flags(nb):
    assert "ERROR" not in _text(nb.cells[7]) and _text(nb.cells[7]).startswith("Hello there")
    assert "NvkitError" in _text(nb.cells[8]) and "CUDA" in _text(nb.cells[8])


def test_batch_cell_one_prompt_per_line_in_order(nb):
    out = _text(nb.cells[9])
    heads = [line[4:] for line in out.splitlines() if line.startswith("--- ")]
    assert heads == ["NVIDIA GPUs are", "Hello there", "A"]
    assert "BATCH 3 generate" in _text(nb.cells[10])


def test_bad_options_say_why_and_session_stays_usable(nb):
    assert "NvkitError" in _text(nb.cells[11]) and "temperature" in _text(nb.cells[11])
    assert "NvkitError" in _text(nb.cells[12]) and "%%nvkit generate --batch" in _text(nb.cells[12])
    assert _text(nb.cells[13]).startswith("still usable")


def test_compile_progress_updates_one_line_then_the_prompt_and_text(capsys):
    # what %nvkit generate prints while the fast path compiles, then as the text comes
    from nvkit.generate.stats import GenerationStats
    from nvkit.magics import ProgressLine
    line = ProgressLine("NVIDIA GPUs are")
    line.progress(GenerationStats(detail="preparing fast decode… 9 s"))
    line.progress(GenerationStats(detail="preparing fast decode… 10 s"))
    line.progress(GenerationStats(detail="fast path off: ..."))   # not compile progress: nothing printed
    assert capsys.readouterr().out == "\r(preparing fast decode… 9 s)\r(preparing fast decode… 10 s)"
    line.piece(" fast")
    line.piece("")
    line.piece(" and")
    n = len("(preparing fast decode… 10 s)")
    # the progress line is blanked, then the prompt is echoed once, before the first piece
    assert capsys.readouterr().out == "\r" + " " * n + "\r" + "NVIDIA GPUs are fast and"
    line.progress(GenerationStats(detail="preparing fast decode… 11 s"))  # once text flows, no more progress
    assert capsys.readouterr().out == ""
    quiet = ProgressLine("Hello")
    quiet.piece("")          # a request that produced no text still shows its prompt
    quiet.clear()
    assert capsys.readouterr().out == "Hello"


def test_deterministic_flag_runs_each_prompt_as_alone(nb):
    """``--deterministic`` reaches ``generate(deterministic=True)``: on the CPU each prompt of the
    list runs alone, so its text is the one the prompt gets on its own (cell 16)."""
    import json
    out = _text(nb.cells[14])
    assert "ERROR" not in out, out
    chunks = [c.split("\n", 1) for c in out.split("--- ")[1:]]
    assert [c[0] for c in chunks] == ["NVIDIA GPUs are", "Hello there"], out
    assert [c[1].removesuffix("\n") for c in chunks] == json.loads(_text(nb.cells[16])), out
    det = _text(nb.cells[15])
    assert det.startswith("DET 2 generate") and "each prompt runs alone" in det, det
