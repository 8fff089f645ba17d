"""The Model tab: attention "auto" offered first and chosen by default (nvkit.load's default), the
backend it picked shown after a load; unavailable choices disabled with a one-line reason (the
whole reason behind "why"), every dropdown with a value, a valid estimate in the default state,
.code() follows the controls, Load/Unload work from a worker thread, and a model loaded elsewhere
shows up."""

import pytest

from nvkit import NvkitError
from nvkit.model.session import session
from nvkit.ui.load_panel import LoadPanel
from tests import demo_model  # noqa: E402


@pytest.fixture
def panel():
    return LoadPanel(model=demo_model.path(), device="cpu")


def test_auto_is_offered_first_and_chosen_by_default(panel):
    b = panel.attn_buttons
    assert list(b)[0] == "auto" and b["auto"].value and panel.attention == "auto"
    assert not b["sdpa"].disabled and not b["sdpa"].value
    # "auto" is nvkit.load's own default: the call leaves it out; sdpa chosen by hand is written out
    assert "attn_implementation" not in panel.code() and "attn_implementation" not in panel.kwargs()
    panel.select_attention("sdpa")
    assert panel.attention == "sdpa" and not b["auto"].value
    assert panel.kwargs()["attn_implementation"] == "sdpa"
    panel.select_attention("auto")
    assert panel.attention == "auto" and not b["sdpa"].value
    # one line saying what auto does, the rest behind "why"
    note = panel.attn_box.children[0].children[1].value
    assert "nvkit.load&#x27;s default <u>why</u>" in note and "model&#x27;s class supports" in note


def test_unavailable_backends_are_disabled_with_reason(panel):
    b = panel.attn_buttons
    assert not b["sdpa"].disabled
    for fa in ("flash_attention_2", "flash_attention_3", "flash_attention_4"):
        assert b[fa].disabled and "needs a CUDA GPU" in b[fa].tooltip
    with pytest.raises(NvkitError, match="can't be used here"):
        panel.select_attention("flash_attention_4")
    with pytest.raises(NvkitError, match="Unknown attention backend"):
        panel.select_attention("nope")
    # quantizations that are not shipped are listed with their reason, not offered
    assert "torchao" in panel.quant_notes.value
    assert [v for _, v in panel.quant.options] == ["none", "nf4", "fp4", "int8"]
    # one line each, no red paragraphs: the whole reason folds out behind "why" and is the tooltip
    for row in panel.attn_box.children:
        note = row.children[1].value
        assert "color:#a33" not in note and len(note.split("<summary>")[-1].split("</summary>")[0]) < 200
    fa2 = panel.attn_box.children[3].children[1].value
    assert "not available: needs a CUDA GPU <u>why</u>" in fa2
    assert "Ampere or newer" in fa2.split("</summary>")[1]


def test_every_dropdown_has_a_value(panel):
    # a None value renders as a blank dropdown in the browser
    for dd in (panel.dtype, panel.device_map, panel.quant, panel.compute_dtype):
        values = [o[1] if isinstance(o, tuple) else o for o in dd.options]
        assert isinstance(dd.value, str) and dd.value in values


def test_code_follows_the_controls(panel):
    assert panel.code() == f"import nvkit\n\ns = nvkit.load({demo_model.path()!r})\nprint(s.summary())\n"
    panel.select_attention("eager")
    assert panel.attention == "eager" and not panel.attn_buttons["sdpa"].value
    panel.attn_buttons["eager"].value = False  # one backend always stays chosen
    assert panel.attn_buttons["eager"].value
    panel.dtype.value = "float32"
    panel.device_map.value = "cpu"
    panel.kernels.value = True
    panel.quant.value = "nf4"
    assert not panel.double_quant.disabled
    panel.double_quant.value = False
    panel.compute_dtype.value = "float32"
    code = panel.code()
    assert ("attn_implementation='eager'" in code and "dtype='float32'" in code and "device_map='cpu'" in code
            and "use_kernels=True" in code
            and "quantization={'method': 'nf4', 'double_quant': False, 'compute_dtype': 'float32'}" in code)
    panel.quant.value = "int8"
    assert panel.double_quant.disabled and "quantization='int8'" in panel.code()
    compile(panel.code(), "<panel>", "exec")


def test_default_state_shows_a_valid_estimate():
    # dtype 'auto' resolved the way nvkit.load resolves it (no "dtype must be ..." error)
    p = LoadPanel()
    v = p.estimate_html.value
    assert v.startswith("estimated before loading: <b>") and "MiB" in v, v
    assert "float32 on the CPU" in v and "dtype must be" not in v
    p.device_map.value = "cpu"
    p.dtype.value = "bfloat16"
    assert "bfloat16 on the CPU" in p.estimate_html.value
    p.model.value = "/nonexistent/model/dir"
    assert "no estimate" in p.estimate_html.value


def test_load_and_unload_from_the_panel(panel):
    panel.quant.value = "int8"
    job = panel.load()
    s = job.result(timeout=300)
    assert panel.progress.bar_style == "success"
    # loaded with "auto": the status and the summary name the backend it picked for this model
    chosen = s.info["attention"]
    assert chosen in ("sdpa", "eager") and s.load_kwargs["attn_implementation"] == chosen
    assert panel.status.value == f"loaded · attention auto picked <b>{chosen}</b> for this model"
    summary = panel.summary.value
    assert f"attention <b>{chosen}</b>" in summary and "weights <b>" in summary
    assert "the load grew this process's memory (RSS) by" in summary   # measured, and said what it is
    assert session() is s and s.info["quantization"] == "int8"
    panel.unload()
    assert "unloaded" in panel.status.value and panel.summary.value == ""
    # on the CPU the RSS drop is explained, not presented as what the model gave back
    assert "its weights were" in panel.status.value and "RSS can fall by less than the weights" in panel.status.value
    assert "nothing is loaded" in (panel.unload() or panel.status.value)


def test_a_model_loaded_elsewhere_shows_up(panel):
    import nvkit
    assert panel.summary.value == ""
    s = nvkit.load(demo_model.path(), device_map="cpu")
    try:
        assert "weights <b>" in panel.summary.value and "outside this panel" in panel.status.value
    finally:
        s.unload()
    assert panel.summary.value == ""


def test_show_code_follows_the_form(panel):
    cv = panel.code_view
    assert cv.html.layout.display == "none"
    cv.toggle.value = True
    assert "nvkit.load(" in cv.html.value and cv.html.layout.display is None
    panel.dtype.value = "float16"
    assert "dtype=&#x27;float16&#x27;" in cv.html.value


def test_failed_load_shows_the_error(panel):
    panel.model.value = "/nonexistent/model/dir"
    job = panel.load()
    with pytest.raises(NvkitError):
        job.result(timeout=60)
    assert panel.progress.bar_style == "danger" and "not a checkpoint directory" in panel.status.value
    assert not panel.load_button.disabled
