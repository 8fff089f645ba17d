"""GeneratePanel without a browser: state, Generate/Stop/Clear, chat history, errors, .code()."""

import time

import pytest

from tests import demo_model  # noqa: E402

import nvkit
from nvkit.ui.generate_panel import MAX_SHOWN_CHARS, GeneratePanel


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
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
    from nvkit.ui.generate_views import pre_html as _pre, transcript_html as _transcript_html
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
    out = p.output.value
    assert "nvkit-turn-user" in out and "nvkit-turn-assistant" in out and "What is a GPU?" in out
    p.close()


# --- stats, compile progress, compare with base ------------------------------------------------------

def test_stats_line_gives_the_whole_request_rate_and_the_decode_rate():
    from dataclasses import dataclass

    from nvkit.generate.stats import GenerationStats
    from nvkit.ui.generate_views import stats_text

    # 11 tokens in 2 s, the first after 1 s: 5.5 tok/s over the request, 10 tok/s decoding after it
    st = GenerationStats(new_tokens=11, seconds=2.0, time_to_first_token=1.0, path="fast", detail="fused step")
    line = stats_text(st)
    assert line.startswith("11 tokens in 2.00 s · 5.5 tok/s overall · decode 10.0 tok/s · first token 1000 ms")
    assert line.endswith("path fast (fused step)")

    @dataclass
    class SplitStats(GenerationStats):  # stats whose tokens_per_second is the whole request's rate
        @property
        def tokens_per_second(self) -> float:
            return self.new_tokens / self.seconds

        @property
        def decode_tokens_per_second(self) -> float:
            return (self.new_tokens - 1) / (self.seconds - self.time_to_first_token)

    st2 = SplitStats(new_tokens=11, seconds=2.0, time_to_first_token=1.0, stopped=True)
    assert stats_text(st2).startswith("11 tokens in 2.00 s · 5.5 tok/s overall · decode 10.0 tok/s")
    assert stats_text(st2).endswith("path generate · stopped")


def test_a_real_request_shows_both_rates(s):
    p = GeneratePanel(session=s)
    p.max_new_tokens.value = 6
    p.start()
    p.wait(timeout=60)
    assert "tok/s overall · decode " in p.stats.value and "first token" in p.stats.value
    p.close()


def test_status_shows_fast_decode_preparation_and_tokens_so_far(s):
    from nvkit.generate.stats import GenerationStats
    p = GeneratePanel(session=s)
    # what the fast path reports about once a second while it compiles
    p._on_progress(GenerationStats(detail="preparing fast decode… 12 s"))
    assert p.status.value == "preparing fast decode… 12 s"
    p._on_progress(GenerationStats(detail="preparing fast decode… 13 s"))  # not held back by the rate limit
    assert p.status.value == "preparing fast decode… 13 s"
    # a real request passes on_progress: the status counts the tokens while it runs
    eos = s.model.generation_config.eos_token_id
    s.model.generation_config.eos_token_id = None
    try:
        p.prompt.value = "Hello there"
        p.max_new_tokens.value = 5000
        p.start()
        deadline = time.monotonic() + 30
        while "tokens" not in p.status.value and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.status.value.startswith("Generating with ") and p.status.value.endswith(" tokens")
        p.stop()
        p.wait(timeout=30)
    finally:
        s.model.generation_config.eos_token_id = eos
    p.close()


def test_compare_with_base_appears_with_an_adapter_and_shows_both_sides(s, tmp_path):
    p = GeneratePanel(session=s)
    assert p.compare.layout.display == "none" and not p.comparing   # no adapter: no switch
    p.compare.value = True
    assert not p.comparing and "s.generate(" in p.code()
    qa = [{"prompt": f"Which GPU holds shard {i}?", "response": f"GPU {i % 4} holds shard {i}."} for i in range(8)]
    run = nvkit.finetune(s, qa, max_steps=2, batch_size=4, seq_len=64, output_dir=str(tmp_path / "run"))
    run.result(timeout=600)
    try:
        assert p.compare.layout.display is None and p.comparing          # the fine-tune's adapter: it is there
        p.prompt.value = "<b>Which GPU</b> holds shard 3?"
        p.max_new_tokens.value = 6
        code = p.code()
        assert "s.compare(['<b>Which GPU</b> holds shard 3?'], max_new_tokens=6, do_sample=False, seed=0)" in code
        compile(code, "<panel>", "exec")
        job = p.start()
        assert job is not None and p.stop_button.disabled is False
        p.wait(timeout=120)
        cmp = p.comparison
        want = s.compare([p.prompt.value], max_new_tokens=6)   # the same question asked directly
        assert [(r.base, r.tuned) for r in cmp] == [(r.base, r.tuned) for r in want]
        out = p.output.value
        assert "nvkit-compare-base" in out and "nvkit-compare-tuned" in out and "<b>Which" not in out
        assert "&lt;b&gt;Which GPU&lt;/b&gt;" in out and "base (adapter off)" in out
        assert f"{cmp[0].base_tokens_per_s:.1f} tok/s" in out and f"{cmp[0].tuned_tokens_per_s:.1f} tok/s" in out
        assert p.stats.value.startswith("base ") and " tok/s · tuned " in p.stats.value
        assert p.text == cmp[0].tuned and not p.generate_button.disabled
        # Stop ends a long comparison: no result, the session free again
        eos = s.model.generation_config.eos_token_id
        s.model.generation_config.eos_token_id = None
        try:
            p.max_new_tokens.value = 5000
            p.start()
            time.sleep(0.5)
            p.stop_button.click()
            p.wait(timeout=60)
        finally:
            s.model.generation_config.eos_token_id = eos
        assert p.comparison is None and "Stopped" in p.status.value and not s.busy
    finally:
        s.unload_adapter()
    assert p.compare.layout.display == "none" and not p.comparing
    p.close()


# last: it unloads the module's session
def test_model_line_follows_loads_anywhere():
    p = GeneratePanel()
    cur = nvkit.session(required=False)
    if cur is not None and cur.model is not None:
        cur.unload()
    assert "No model is loaded" in p.model_line.value
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    try:
        assert "model <b>" in p.model_line.value
    finally:
        sess.unload()
    assert "No model is loaded" in p.model_line.value
    p.close()


def test_same_text_checkbox_asks_for_deterministic_and_each_list_prompt_gets_its_own_text():
    """The "Same text alone or in a list" switch passes ``deterministic=True`` (in the code shown
    too); on the CPU a list then runs each prompt alone, so every text is the one it gets alone."""
    s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    p = GeneratePanel(session=s)
    assert "deterministic" not in p.generation_kwargs() and "deterministic" not in p.code()
    p.deterministic.value = True
    assert p.generation_kwargs()["deterministic"] is True and "deterministic=True" in p.code()
    assert "nvkit-generate-deterministic" in p.deterministic._dom_classes
    prompts = ["NVIDIA GPUs are", "The memory of a GPU holds"]
    alone = [s.generate(q, max_new_tokens=6) for q in prompts]
    p.list_mode.value = True
    p.prompt.value = "\n".join(prompts)
    p.max_new_tokens.value = 6
    p.start()
    assert p.wait(timeout=60) == alone and p.last_error is None
    assert "each prompt runs alone" in s.last_stats.detail, s.last_stats.detail
    p.close()
    s.unload()
