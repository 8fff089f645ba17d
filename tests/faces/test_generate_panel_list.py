"""GeneratePanel's list mode without a browser: one prompt per line (or a .txt / .jsonl file),
all generated at once, answers in an escaped table in the prompts' order, Stop, and .code()."""

import datetime
import time

import pytest

from tests import demo_model  # noqa: E402

import nvkit
from nvkit.errors import NvkitError
from nvkit.ui.generate_panel import GeneratePanel, prompt_lines


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def _upload(p, name, data: bytes):
    p.prompt_file.value = ({"name": name, "type": "text/plain", "size": len(data), "content": memoryview(data),
                            "last_modified": datetime.datetime.now(datetime.timezone.utc)},)


def test_prompt_lines_from_text_and_jsonl():
    assert prompt_lines("first\n\n  second  \r\nthird") == (["first", "  second", "third"], 0)
    text = '"plain string"\n{"prompt": "from a field"}\n\n{"text": "two\\nlines"}\n'
    assert prompt_lines(text, "x.jsonl") == (["plain string", "from a field", "two lines"], 1)
    with pytest.raises(NvkitError, match="line 2 is not JSON"):
        prompt_lines('"ok"\nnot json', "x.jsonl")
    with pytest.raises(NvkitError, match="line 1: expected a string"):
        prompt_lines('{"other": 1}', "x.jsonl")


def test_list_mode_shows_its_widgets_loads_files_and_shows_code():
    p = GeneratePanel()
    assert p.prompt_file.layout.display == "none" and p.results.layout.display == "none" and not p.listing
    assert "nvkit-generate-list" in p.list_mode._dom_classes and "nvkit-generate-results" in p.results._dom_classes
    _upload(p, "prompts.jsonl", b'{"prompt": "NVIDIA GPUs are"}\n"Hello <there>"\n')
    assert p.listing and p.prompt_file.layout.display == "" and p.results.layout.display == ""
    assert p.output.layout.display == "none"
    assert p.prompts() == ["NVIDIA GPUs are", "Hello <there>"] and "Loaded 2 prompts from prompts.jsonl" in p.status.value
    _upload(p, "bad.jsonl", b'"ok"\n{broken\n')
    assert "bad.jsonl line 2 is not JSON" in p.status.value and p.prompts() == ["NVIDIA GPUs are", "Hello <there>"]
    _upload(p, "latin.txt", "café".encode("latin-1"))
    assert "not UTF-8" in p.status.value
    p.max_new_tokens.value = 7
    code = p.code()
    compile(code, "<panel code>", "exec")
    assert "prompts = ['NVIDIA GPUs are', 'Hello <there>']" in code and "s.generate(prompts, max_new_tokens=7" in code
    p.prompt.value = "\n \n"
    assert p.start() is None and "prompt list is empty" in p.status.value
    p.list_mode.value = False
    assert p.results.layout.display == "none" and p.output.layout.display == ""
    assert "s.generate(prompts" not in p.code()
    p.close()


def test_a_list_runs_at_once_and_fills_the_table_in_order(s):
    p = GeneratePanel(session=s)
    p.list_mode.value = True
    prompts = ["NVIDIA GPUs are", "<b>Hello</b> there", "A"]
    p.prompt.value = "\n".join(prompts)
    p.max_new_tokens.value = 6
    job = p.start()
    assert job is not None and not p.stop_button.disabled
    outs = p.wait(timeout=120)
    assert outs == p.outputs and len(outs) == 3
    assert outs == s.generate(prompts, max_new_tokens=6)  # the same call as a script makes
    table = p.results.value
    assert table.count("<tr>") == 4 and "&lt;b&gt;Hello&lt;/b&gt; there" in table and "<b>Hello" not in table
    assert table.index("NVIDIA GPUs are") < table.index("&lt;b&gt;Hello") < table.index("<td>3</td>")
    assert p.stats.value.startswith("3/3 prompts") and "path generate" in p.stats.value
    assert p.stop_button.disabled and not p.generate_button.disabled and p.status.value == "Done."
    p.close()


def test_stop_ends_a_long_list(s):
    p = GeneratePanel(session=s)
    p.list_mode.value = True
    p.prompt.value = "Hello there\nNVIDIA GPUs are"
    p.max_new_tokens.value = 5000
    eos = s.model.generation_config.eos_token_id
    s.model.generation_config.eos_token_id = None  # the demo model would end at its first EOS
    try:
        p.start()
        time.sleep(0.5)
        p.stop_button.click()
        p.wait(timeout=60)
    finally:
        s.model.generation_config.eos_token_id = eos
    assert s.last_stats.stopped and "stopped" in p.stats.value and p.status.value.startswith("Stopped")
    p.close()
