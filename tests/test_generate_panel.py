"""GeneratePanel without a browser: state, Generate/Stop/Clear, chat history, errors, .code()."""

import time

import pytest

from tests.gen_fixtures import model_dir

import nvkit
from nvkit.ui.generate_panel import MAX_SHOWN_CHARS, GeneratePanel


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(model_dir(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


def test_widgets_have_the_css_classes():
    p = GeneratePanel()
    for widget, cls in ((p.prompt, "nvkit-generate-prompt"), (p.generate_button, "nvkit-generate-button"),
                        (p.stop_button, "nvkit-stop-button"), (p.output, "nvkit-generate-output"),
                        (p.stats, "nvkit-generate-stats")):
        assert cls in widget._dom_classes
    assert p.stop_button.disabled and not p.generate_button.disabled
    assert p.temperature.disabled  # greedy by default
    p.sampling.value = True
    assert not p.temperature.disabled
    p.close()


def test_generate_streams_into_escaped_output_and_shows_stats(s):
    p = GeneratePanel(session=s)
    p.prompt.value = "<b>Hello</b> there"
    p.max_new_tokens.value = 8
    job = p.start()
    assert job is not None and p.stop_button.disabled is False
    out = p.wait(timeout=60)
    time.sleep(0.1)
    assert p.output.value.count("<b>") == 0 and "&lt;b&gt;Hello&lt;/b&gt; there" in p.output.value
    assert "8 tokens" in p.stats.value and "path generate" in p.stats.value
    assert p.text == out and p.stop_button.disabled
    assert not p.generate_button.disabled
    p.close()


def test_stop_button_ends_a_long_run(s):
    p = GeneratePanel(session=s)
    p.prompt.value = "Hello there"
    p.max_new_tokens.value = 5000
    eos = s.model.generation_config.eos_token_id
    s.model.generation_config.eos_token_id = None  # the demo model would end at its first EOS
    try:
        p.start()
        time.sleep(0.5)
        p.stop_button.click()
        p.wait(timeout=30)
    finally:
        s.model.generation_config.eos_token_id = eos
    time.sleep(0.1)
    assert s.last_stats.stopped and s.last_stats.new_tokens < 5000
    assert "stopped" in p.stats.value
    p.close()


def test_chat_keeps_history_and_clear_forgets_it(s):
    p = GeneratePanel(session=s)
    p.chat.value = True
    p.system.value = "Answer briefly."
    p.prompt.value = "What is a GPU?"
    p.max_new_tokens.value = 3
    p.start()
    p.wait(timeout=60)
    assert [m["role"] for m in p.history] == ["user", "assistant"]
    kw = p.generation_kwargs()
    assert kw["chat"] is True and kw["system"] == "Answer briefly." and len(kw["history"]) == 2
    p.clear_button.click()
    assert p.history == [] and p.output.value == ""
    p.close()


def test_bad_input_shows_an_error_and_starts_nothing(s):
    p = GeneratePanel(session=s)
    p.prompt.value = "   "
    assert p.start() is None and "empty" in p.status.value
    p.prompt.value = "Hello"
    p.seed.value = "abc"
    assert p.start() is None and "seed" in p.status.value
    p.seed.value = ""
    assert p.start() is not None
    p.wait(timeout=60)
    p.close()


def test_code_reproduces_the_settings(s):
    p = GeneratePanel(session=s)
    p.prompt.value = 'Say "hi"'
    p.max_new_tokens.value = 12
    p.sampling.value = True
    p.temperature.value = 0.5
    p.seed.value = "4"
    p.fast.value = "off"
    code = p.code()
    assert "s.generate('Say \"hi\"'" in code
    for part in ("max_new_tokens=12", "do_sample=True", "temperature=0.5", "seed=4", "fast=False"):
        assert part in code
    compile(code, "<panel>", "exec")
    p.close()


def test_output_is_bounded():
    from nvkit.ui.generate_panel import _pre, _transcript_html
    assert MAX_SHOWN_CHARS <= 50_000
    assert "&lt;" in _pre("<")
    long = [{"role": "user", "content": "x" * (MAX_SHOWN_CHARS * 2)}, {"role": "assistant", "content": "<ok>"}]
    html_ = _transcript_html(long)
    assert len(html_) < MAX_SHOWN_CHARS + 1000 and "&lt;ok&gt;" in html_


def test_fresh_tab_code_generates_from_the_prompt_shown():
    # a fresh tab has a prompt, its code uses it, and every dropdown has a value
    p = GeneratePanel()
    assert p.prompt.value.strip()
    assert f"s.generate({p.prompt.value!r}" in p.code()
    assert p.fast.value == "auto" and "fast=" not in p.code()
    p.prompt.value = "Hello GPUs"
    p.code_view.toggle.value = True
    assert "Hello GPUs" in p.code_view.html.value
    p.close()


def test_chat_output_is_a_transcript(s):
    p = GeneratePanel(session=s)
    p.chat.value = True
    p.prompt.value = "What is a GPU?"
    p.max_new_tokens.value = 3
    p.start()
    p.wait(timeout=60)
    time.sleep(0.1)
    out = p.output.value
    assert "nvkit-turn-user" in out and "nvkit-turn-assistant" in out and "What is a GPU?" in out
    p.close()


def test_model_line_follows_loads_anywhere():
    p = GeneratePanel()
    cur = nvkit.session(required=False)
    if cur is not None and cur.model is not None:
        cur.unload()
    assert "No model is loaded" in p.model_line.value
    sess = nvkit.load(model_dir(), device_map="cpu", dtype="float32")
    try:
        assert "model <b>" in p.model_line.value
    finally:
        sess.unload()
    assert "No model is loaded" in p.model_line.value
    p.close()
