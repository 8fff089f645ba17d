"""FinetunePanel without a browser: Start runs nvkit.finetune, the chart fills, Stop works, errors show."""

from __future__ import annotations

import html
import json
import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.train.data import parse_examples as _parse_inline
from nvkit.ui.finetune_panel import FinetunePanel  # noqa: E402
from tests import demo_model  # noqa: E402


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return demo_model.path()


def _wait(cond, timeout=180):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_parse_inline():
    rows = _parse_inline('plain text\n\n{"prompt": "a", "response": "b"}\n"quoted"\n')
    assert rows == ["plain text", {"prompt": "a", "response": "b"}, "quoted"]
    with pytest.raises(NvkitError, match="JSON"):
        _parse_inline('{"prompt": ')
    with pytest.raises(NvkitError, match="No examples"):
        _parse_inline("  \n ")


def test_panel_without_model_says_so():
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()
    p = FinetunePanel()
    assert "Load a model" in p.estimate.value
    assert p.start() is None and "No model" in p.status.value
    assert not p.start_btn.disabled and p.stop_btn.disabled
    # no chart (and no plotly bundle) before a run
    assert p.chart is None and p.figure is None
    for cls in ("nvkit-ft-start", "nvkit-ft-stop", "nvkit-ft-progress"):
        assert any(cls in wdg._dom_classes for wdg in (p.start_btn, p.stop_btn, p.progress))
    assert "nvkit-ft-chart" in p.chart_box._dom_classes
    p.close()


def test_estimate_follows_a_load_in_another_cell(path):
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()
    p = FinetunePanel()
    assert "Load a model" in p.estimate.value
    s = nvkit.load(path)            # anywhere: a cell, the magic, the Model tab
    try:
        assert "Estimated peak for this run" in p.estimate.value
    finally:
        s.unload()
    assert "Load a model" in p.estimate.value
    p.close()


def test_panel_start_chart_stop_summary(path, tmp_path):
    s = nvkit.load(path)
    p = FinetunePanel()
    p.examples.value = "\n".join(["The H200 has 141 GB of fast memory."] * 32)
    p.steps.value = 300
    p.batch.value = 4
    p.seq_len.value = 64
    p.output_dir.value = str(tmp_path / "run")
    code = p.code()
    assert "s = nvkit.session()\nrun = nvkit.finetune(s, data," not in code  # the preview comes first
    assert "run = nvkit.finetune(s, data," in code and "max_steps=300" in code
    compile(code.replace("await run", "run.result()"), "<panel code>", "exec")
    run = p.start()
    assert run is not None and p.run is run
    assert p.start_btn.disabled and not p.stop_btn.disabled
    assert p.start() is None and "in progress" in p.status.value  # a second Start is refused
    # one chart, on the shared sampler and the shared live thread: no thread of the panel's own
    import threading
    assert not [t for t in threading.enumerate() if t.name == "nvkit-ft-panel"]
    chart = p.chart
    assert chart.x == "step" and chart.run is run
    loss = chart.figure.data[chart.trace_index[("loss", None)]]
    mem = chart.figure.data[chart.trace_index[("rss", None)]]
    _wait(lambda: (loss.x is not None and len(loss.x) >= 2) or run.done)
    assert len(loss.x) >= 2 and len(mem.x) == len(loss.x) and list(loss.x)[:2] == [1, 2]
    _wait(lambda: p.progress.value > 0)
    assert "step" in p.progress_label.value
    p.stop_btn.click()
    run.result(timeout=120)
    _wait(lambda: not p.start_btn.disabled)
    assert run.stopped and run.step < 300
    assert "Stopped" in p.status.value
    assert "adapter" in p.summary.value and "tokens/s" in p.summary.value
    assert os.path.isdir(run.adapter_dir)
    p.close()
    s.unload()


def test_panel_bad_data_shows_error(path):
    s = nvkit.load(path)
    p = FinetunePanel()
    p.examples.value = '{"question": "a", "answer": "b"}'
    assert p.start() is None
    assert "keys" in p.status.value and not p.start_btn.disabled
    p.source.value = "file"
    assert p.examples.layout.display == "none" and p.path.layout.display is None
    assert p.start() is None and "Choose a data file" in p.status.value
    p.path.value = "/no/such/file.jsonl"
    assert p.start() is None and "not found" in p.status.value
    assert "data = '/no/such/file.jsonl'" in p.code()
    assert s.generate("The H200", max_new_tokens=3)
    p.close()
    s.unload()


# --- the fine-tune loop: preview, evaluation, resume, export ------------------------------------------

QA = [{"prompt": f"Which GPU holds shard {i}?", "response": f"GPU {i % 4} holds shard {i}."} for i in range(16)]


def _qa_panel(tmp_path, steps=6):
    p = FinetunePanel()
    p.examples.value = "\n".join(json.dumps(r) for r in QA)
    p.steps.value = steps
    p.batch.value = 4
    p.seq_len.value = 64
    p.output_dir.value = str(tmp_path / "run")
    return p


def _finished(p):
    _wait(lambda: not p.start_btn.disabled and p.run is not None and p.run.done)


def test_preview_shows_the_rows_as_the_model_sees_them(path):
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()
    p = FinetunePanel()
    p.examples.value = ('{"prompt": "Is <b>this</b> escaped?", "response": "Yes & it is."}\n'
                        '{"prompt": "Which GPU?", "response": "The H200, with 141 GB of fast memory."}')
    assert p.preview() is None   # no model: no tokenizer to preview with
    assert "No preview: Load a model first" in p.preview_html.value and p.preview_box.layout.display is None
    s = nvkit.load(path)
    try:
        p.preview_btn.click()   # tokenizing every row runs in a worker: the kernel stays free
        pv = p.preview_job.result(timeout=60)
        assert p.last_preview is pv and p.preview_box.layout.display is None and not p.preview_btn.disabled
        shown = p.preview_html.value
        assert shown == pv._repr_html_()
        assert "&lt;b&gt;this&lt;/b&gt;" in shown and "<b>this</b>" not in shown and "<mark>" in shown
        assert f"{pv.totals['rows']} " in shown and " per epoch" in shown
        assert pv.totals["seq_len"] == 512 and pv.totals["batch_size"] == p.batch.value
        # other data or settings: the preview goes rather than mislead
        p.seq_len.value = 16
        assert p.preview_box.layout.display == "none" and p.last_preview is None
        p.preview().result(timeout=60)
        assert "over seq_len=16" in p.preview_html.value  # rows finetune would refuse are flagged
        p.examples.value = '{"question": "a", "answer": "b"}'
        with pytest.raises(NvkitError):
            p.preview().result(timeout=60)
        assert p.last_preview is None
        v = p.preview_html.value
        assert v.startswith("<details class='nvkit-why'") and "No preview:" in v and "keys" in v
        assert "display(nvkit.data.preview(data, s, seq_len=16, n=5, batch_size=8, grad_accum=1))" in p.code()
        # a preview still running when the data changes is not shown when it ends
        p.examples.value = "\n".join(json.dumps(r) for r in QA)
        job = p.preview()
        p.batch.value = 4
        job.result(timeout=60)
        assert p.preview_box.layout.display == "none" and p.last_preview is None
        p.examples.value = '{"prompt": '
        assert p.preview() is None and "No preview:" in p.preview_html.value   # the form itself is wrong
    finally:
        p.close()
        s.unload()


def test_eval_settings_reach_finetune_and_the_chart_draws_the_eval_curve(path, tmp_path):
    s = nvkit.load(path)
    p = _qa_panel(tmp_path)
    assert p.eval_settings() == {} and "eval_split=" not in p.code() and "eval_every=" not in p.code()  # off, as in finetune
    assert p.eval_split.layout.display == "none" and p.eval_every.layout.display == "none"
    p.eval_source.value = "file"
    assert p.eval_file.layout.display is None and p.eval_split.layout.display == "none"
    assert p.start() is None and "Choose an eval file" in p.status.value
    p.eval_file.value = "/data/held_out.jsonl"
    assert p.eval_settings() == {"eval_data": "/data/held_out.jsonl", "eval_every": 5}
    p.eval_source.value = "split"
    p.eval_split.value = 0.25
    p.eval_every.value = 2
    assert p.eval_settings() == {"eval_split": 0.25, "eval_every": 2}
    assert "eval_split=0.25, eval_every=2" in p.code()
    run = p.start()
    assert run is not None and run.info["eval"]["from"] == "eval_split=0.25" and run.info["eval"]["examples"] == 4
    # the status line: compile on or off in a word, the reason behind "why"
    assert "Liger off · compile off <u>why</u>" in p.status.value
    assert html.escape(run.info["compile_reason"], quote=True) in p.status.value
    _finished(p)
    assert p.status.value.startswith("Done. · ") and "Liger off · compile off <u>why</u>" in p.status.value  # it stays
    steps = [e["step"] for e in run.eval_history]
    assert steps == [0, 2, 4, 6]
    chart = p.chart
    ev = chart.figure.data[chart.trace_index[("eval", None)]]
    _wait(lambda: ev.x is not None and len(ev.x) == 4)
    assert list(ev.x) == steps and ev.yaxis == "y2" and ev.name == "eval loss"
    assert list(ev.y) == pytest.approx([e["eval_loss"] for e in run.eval_history], abs=1e-4)
    sm = run.summary()
    assert (f"{sm['eval_loss_before']:.4f} before → {sm['eval_loss_after']:.4f} after" in p.summary.value
            and "perplexity" in p.summary.value)
    p.close()
    s.unload()


def test_resume_continues_a_stopped_run(path, tmp_path):
    s = nvkit.load(path)
    p = _qa_panel(tmp_path)
    assert p.resume_btn.disabled and p.resume() is None and "Nothing to resume" in p.status.value
    run = p.start()
    run.subscribe(lambda rec: rec["step"] >= 2 and run.stop())
    _finished(p)
    assert run.stopped and run.checkpoint and not p.resume_btn.disabled
    assert "checkpoint" in p.summary.value and html.escape(run.checkpoint) in p.summary.value
    assert "ended early" in p.summary.value and "stopped by the user" in p.summary.value
    p.resume_btn.click()
    more = p.run
    assert more is not run and more.info["resumed_from"] == run.checkpoint
    assert p.status.value.startswith(f"Resuming at step {run.step} from ")
    _finished(p)
    assert [r["step"] for r in more.history] == list(range(run.step + 1, 7)) and more.error is None
    assert p.resume_btn.disabled   # it ran to the end: no checkpoint left to continue from
    assert "resume=True" in p.code()
    p.close()
    s.unload()


def test_export_writes_a_checkpoint_and_refusals_say_why(path, tmp_path):
    s = nvkit.load(path)
    p = _qa_panel(tmp_path, steps=2)
    assert p.export() is None and p.export_status.value.startswith("<details class='nvkit-why'")
    assert "Not exported: Choose a folder" in p.export_status.value
    p.start()
    _finished(p)
    assert p.export_dir.value == str(tmp_path / "run" / "export")   # suggested once a run has ended
    assert f"s.export({str(tmp_path / 'run' / 'export')!r}, merge=True)" in p.code()
    p.export_btn.click()
    out = p.export_job.result(timeout=300)
    assert out == str(tmp_path / "run" / "export") and not p.export_btn.disabled
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= set(os.listdir(out))
    assert "Exported the merged model" in p.export_status.value
    # the adapter alone, into a new folder
    p.export_merge.value = False
    p.export_dir.value = str(tmp_path / "adapter-export")
    p.export().result(timeout=300)
    assert "adapter_config.json" in os.listdir(tmp_path / "adapter-export") and "Exported the adapter" in p.export_status.value
    # a folder holding the user's files is refused, in one line, and nothing of theirs is touched
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    p.export_dir.value = str(mine)
    job = p.export()
    with pytest.raises(NvkitError):
        job.result(timeout=300)
    v = p.export_status.value
    assert v.startswith("<details class='nvkit-why'") and "Not exported:" in v and "nvkit did not write" in v
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    assert not p.export_btn.disabled
    p.close()
    s.unload()


def test_the_default_run_teaches_held_out_questions_and_is_estimated_once(path, tmp_path):
    """The panel's defaults are the demo lesson (nvkit.demo.lesson): after a default run the eval
    loss on questions held out of the data has fallen, and the tuned model's answers to them end
    with the sign-off the lesson teaches, which the base model's never do. One estimate per run:
    the tab shows before Start the number the run predicts with, that its summary compares with
    the measured peak (on the CPU the process memory the run adds, its model included; within
    ±25 % in a fresh process, ±50 % in a test worker that ran other tests first)."""
    from nvkit import memory
    from nvkit.demo import lesson
    from nvkit.units import fmt_bytes
    s = nvkit.load(path)
    p = FinetunePanel()
    try:
        assert _parse_inline(p.examples.value) == lesson.TRAIN
        assert p.steps.value == lesson.STEPS and p.lr.value == lesson.LEARNING_RATE
        held = tmp_path / "held-out.jsonl"
        held.write_text("".join(json.dumps(r) + "\n" for r in lesson.HELD_OUT))
        p.eval_source.value = "file"
        p.eval_file.value = str(held)
        p.eval_every.value = 0
        p.output_dir.value = str(tmp_path / "run")
        before = p.estimate.value
        assert "on the CPU" in before and "not the whole process" in before
        run = p.start()
        assert run is not None
        run.result(timeout=900)
        _wait(lambda: not p.start_btn.disabled, timeout=60)
        assert run.error is None and run.step == lesson.STEPS

        # one estimate: the tab's, the run's, the comparison's and the summary's
        shown = fmt_bytes(run.estimate.total)
        assert f"<b>{shown}</b>" in before
        c = [c for c in memory.comparisons(frame=False) if c.what == "train"][-1]
        assert c.estimate is run.estimate and c.predicted == run.estimate.total
        summary = html.unescape(p.summary.value)
        assert f"prediction {shown}" in summary and "the whole process's RSS" in summary
        assert "CUDA context" not in run.estimate.parts
        # ±25 % is the target in a fresh process (docs/benchmarks.md, "Memory estimate vs
        # measurement"); in a test worker that has run other tests first, the allocator hands
        # back memory those freed, which moves the RSS a run adds by tens of MiB either way
        assert abs(c.error) <= 0.5, str(c)

        # the lesson shows on questions it never trained on
        sm = run.summary()
        assert sm["eval_loss_after"] < 0.5 * sm["eval_loss_before"], sm
        rows = s.compare(list(lesson.HELD_OUT_QUESTIONS), max_new_tokens=48, chat=True)
        assert not any(lesson.SIGN_OFF in r.base for r in rows)
        taught = [r.prompt for r in rows if r.tuned.rstrip().endswith(lesson.SIGN_OFF)]
        assert "What is the KV cache?" in taught and len(taught) >= len(rows) // 2, str(rows)
    finally:
        p.close()
        s.unload()
