"""The Model tab: unavailable choices disabled with their reason, .code() follows the controls,
Load/Unload work from a worker thread."""

import pytest

from nvkit import NvkitError
from nvkit.model.session import session
from nvkit.ui.load_panel import LoadPanel
from tests.choices_model import model_path


@pytest.fixture
def panel():
    return LoadPanel(model=model_path(), device="cpu")


def test_unavailable_backends_are_disabled_with_reason(panel):
    b = panel.attn_buttons
    assert not b["sdpa"].disabled and b["sdpa"].value and panel.attention == "sdpa"
    for fa in ("flash_attention_2", "flash_attention_3", "flash_attention_4"):
        assert b[fa].disabled and "needs a CUDA GPU" in b[fa].tooltip
    with pytest.raises(NvkitError, match="can't be used here"):
        panel.select_attention("flash_attention_4")
    with pytest.raises(NvkitError, match="Unknown attention backend"):
        panel.select_attention("nope")
    # quantizations that are not shipped are listed with their reason, not offered
    assert "torchao" in panel.quant_notes.value
    assert [v for _, v in panel.quant.options] == [None, "nf4", "fp4", "int8"]


def test_code_follows_the_controls(panel):
    assert panel.code() == f"import nvkit\n\ns = nvkit.load({model_path()!r})\nprint(s.summary())\n"
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


def test_estimate_text_is_shown(panel):
    import time
    t0 = time.time()
    while not panel.estimate_html.value and time.time() - t0 < 30:
        time.sleep(0.05)
    v = panel.estimate_html.value
    assert "estimate" in v  # either the number or why there is none


def test_load_and_unload_from_the_panel(panel):
    panel.quant.value = "int8"
    job = panel.load()
    s = job.result(timeout=300)
    assert panel.progress.bar_style == "success" and panel.status.value == "loaded"
    assert "attention in use <b>sdpa</b>" in panel.summary.value and "reported" in panel.summary.value
    assert session() is s and s.info["quantization"] == "int8"
    panel.unload()
    assert "unloaded" in panel.status.value and panel.summary.value == ""
    assert "nothing is loaded" in (panel.unload() or panel.status.value)


def test_failed_load_shows_the_error(panel):
    panel.model.value = "/nonexistent/model/dir"
    job = panel.load()
    with pytest.raises(NvkitError):
        job.result(timeout=60)
    assert panel.progress.bar_style == "danger" and "not a checkpoint directory" in panel.status.value
    assert not panel.load_button.disabled
