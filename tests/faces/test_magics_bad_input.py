"""``%nvkit`` with bad arguments in a real IPython kernel (nbclient), as a user types them: one
``NvkitError:`` line on stderr that says what to do, no traceback, and the loaded demo session is
still current and generates the same text in the next cell."""

import nbformat
import pytest
from nbclient import NotebookClient

SETUP = [
    "import os; os.environ['HF_HUB_OFFLINE'] = '1'\n%load_ext nvkit",
    "%nvkit load demo",
    "import nvkit\nS = nvkit.session()\nREF = S.generate('NVIDIA GPUs are', max_new_tokens=4)\nprint(repr(REF))",
]
CHECK = ("assert nvkit.session() is S, 'the session was replaced'\n"
         "assert S.generate('NVIDIA GPUs are', max_new_tokens=4) == REF\nprint('SURVIVED')")

BAD = [
    ("%nvkit generate -n x hi", ["argument -n/--max-new-tokens: invalid int value: 'x'", "usage: %nvkit generate"]),
    ("%nvkit generate -n 0 hi", ["max_new_tokens must be a whole number"]),
    ("%nvkit generate -n -3 hi", ["max_new_tokens must be a whole number"]),
    ("%nvkit generate --temperature abc --sample hi", ["argument --temperature: invalid float value: 'abc'"]),
    ("%nvkit generate --temperature inf --sample hi", ["temperature must be a finite number > 0"]),
    ("%nvkit generate --top-p 2 --sample hi", ["top_p must be a finite number in (0, 1]"]),
    ("%nvkit generate --top-k -1 --sample hi", ["top_k must be a whole number ≥ 0"]),
    ("%nvkit generate --seed x hi", ["argument --seed: invalid int value: 'x'"]),
    ("%nvkit generate --seed -1 hi", ["seed must be a whole number from 0"]),
    ("%nvkit generate --bogus hi", ["unrecognized arguments: --bogus"]),
    ("%nvkit generate --batch", ["takes its prompts from the cell body"]),
    ("%nvkit generate", ["needs a prompt"]),
    ('%nvkit generate "unterminated', ["cannot split the line", "quotes"]),
    ("%%nvkit generate --batch\n\n\n", ["the body is empty"]),
    ("%nvkit select", ["needs a choice"]),
    ("%nvkit select x,y", ["'x' is neither a GPU index nor a GPU UUID"]),
    ("%nvkit select --foo", ["unrecognized arguments: --foo"]),
    ("%nvkit load --dtype x", ["Unknown dtype 'x'"]),
    ("%nvkit load --device-map x", ["Unknown device_map 'x'"]),
    ("%nvkit load --quant x", ["Unknown quantization 'x'"]),
    ("%nvkit load --attn x", ["Unknown attention backend 'x'"]),
    ("%nvkit load a b", ["unrecognized arguments: b"]),
    ("%nvkit load /no/such/model", ["not a checkpoint directory"]),
    ("%nvkit backends --device gpu", ["device must be 'cpu', 'cuda', 'cuda:N'"]),
    ("%nvkit backends --device cuda:7", ["cuda:7 does not exist"]),
    ("%nvkit memory --unit kb", ["argument --unit: invalid choice: 'kb'", "'GiB'"]),
    ("%nvkit memory extra", ["unrecognized arguments: extra"]),
    ("%nvkit mark", ["needs a text"]),
    ("%nvkit unload now", ["unrecognized arguments: now"]),
    ("%nvkit gpus --xml", ["unrecognized arguments: --xml"]),
    ("%nvkit stop please", ["unrecognized arguments: please"]),
    ("%nvkit frobnicate", ["unknown command 'frobnicate'", "generate"]),
    ("%nvkit finetune --steps x", ["argument --steps: invalid int value: 'x'"]),
    ("%nvkit finetune", ["needs data"]),
]


@pytest.fixture(scope="module")
def nb():
    book = nbformat.v4.new_notebook()
    sources = list(SETUP)
    for line, _ in BAD:
        sources += [line, CHECK]
    book.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    NotebookClient(book, timeout=180, kernel_name="python3", allow_errors=True).execute()
    return book


def _streams(cell, name):
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == name)


def _errors(cell):
    return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]


def test_setup_loaded_the_demo(nb):
    for cell in nb.cells[:len(SETUP)]:
        assert _errors(cell) == []
    assert _streams(nb.cells[2], "stdout").strip()


@pytest.mark.parametrize("i", range(len(BAD)), ids=[line.splitlines()[0] for line, _ in BAD])
def test_bad_magic_line(nb, i):
    line, words = BAD[i]
    bad, check = nb.cells[len(SETUP) + 2 * i], nb.cells[len(SETUP) + 2 * i + 1]
    assert _errors(bad) == [], f"{line!r} raised instead of printing one line"
    err = _streams(bad, "stderr")
    nvkit_lines = [ln for ln in err.splitlines() if ln.startswith("NvkitError: ")]
    assert len(nvkit_lines) == 1, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"
    assert _errors(check) == [] and _streams(check, "stdout").strip() == "SURVIVED", _errors(check)
