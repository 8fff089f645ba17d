"""LaunchPanel without a browser: the GPUs from the selection, each strategy's text and per-GPU
estimate, the launcher line, a real 2-process run on the CPU (gloo) with per-rank charts, Stop for
the whole group, the summary beside the estimate, the adapter loaded into the session; and the
Fine-tune panel's "run on N" choice."""

from __future__ import annotations

import html
import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.train import strategies as st  # noqa: E402
from nvkit.train.launch import launch  # noqa: E402
from nvkit.units import fmt_bytes  # noqa: E402
from nvkit.ui.finetune_panel import FinetunePanel  # noqa: E402
from nvkit.ui.launch_panel import LaunchPanel  # noqa: E402
from tests import demo_model  # noqa: E402


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return demo_model.path()


@pytest.fixture
def unloaded():
    s = nvkit.session(required=False)
    if s is not None:
        s.unload()


def _wait(cond, timeout=300):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_panel_without_a_model_says_so(unloaded):
    p = LaunchPanel()
    assert "Load a model" in p.estimates.value
    assert "CPU" in p.gpus_line.value and p.nproc.value == 2  # no GPU here: two gloo processes
    assert p.start() is None and "No model" in p.status.value
    assert not p.start_btn.disabled and p.stop_btn.disabled and p.chart is None
    p.close()


def test_strategy_text_estimates_and_line(path, unloaded, monkeypatch):
    s = nvkit.load(path)
    p = LaunchPanel()
    try:
        assert [v for _, v in p.strategy.options] == list(st.STRATEGIES)
        seen = set()
        for name in st.STRATEGIES:
            p.strategy.value = name
            assert "What it does" in p.about.value and "Needs" in p.about.value
            seen.add(p.about.value)
            assert (p.offload.layout.display != "none") == name.startswith("zero")
            assert f"▶ <b>{st.STRATEGIES[name].title}</b>" in p.estimates.value
        assert len(seen) == len(st.STRATEGIES)
        # on the CPU the GPU-only strategies say why they cannot run here
        assert [r["strategy"] for r in p.rows if r["why_not"]] == ["fsdp", "tp"]
        assert "not here" in p.estimates.value and "needs CUDA" in p.estimates.value
        p.strategy.value = "zero3"
        p.offload.value = "all"
        p.strategy.value = "zero2"
        assert p.offload.value == "optimizer"  # ZeRO-2 keeps the parameters on the GPU
        assert "torchrun --nproc_per_node=2" in p.line.value and "nvkit.train.worker" in p.line.value
        p.launcher.value = "accelerate"
        assert "accelerate launch" in p.line.value and "--config_file=RUN_DIR/accelerate.yaml" in p.line.value
        p.code_view.toggle.value = True
        code = p.code()
        assert "nvkit.launch(config, nproc_per_node=2, strategy='zero2', launcher='accelerate'" in code
        assert "offload='optimizer'" in code
        compile(code.replace("await run", "run.result()"), "<launch panel code>", "exec")
        assert "nvkit.launch" in p.code_view.html.value
    finally:
        p.close()
        s.unload()


def test_fake_gpus_without_cuda_say_cpu_processes(path, unloaded, monkeypatch, tmp_path):
    """NVKIT_FAKE_GPUS fakes NVML's list, not CUDA: a launch from here trains CPU processes over
    gloo, and the tab says so: where it runs, the line it will run (no GPU on it), per-process
    numbers with no CUDA context, and the Fine-tune tab's "run on" choice."""
    import torch
    assert not torch.cuda.is_available()
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")
    s = nvkit.load(path)
    p = LaunchPanel()
    f = FinetunePanel()
    try:
        line = p.gpus_line.value
        assert "CPU processes over gloo" in line and "no CUDA" in line and "NVKIT_FAKE_GPUS" in line
        assert "from the GPUs tab" not in line and p.nproc.value == 2
        assert "CUDA_VISIBLE_DEVICES=&#x27;&#x27; torchrun --nproc_per_node=2" in p.line.value
        assert "CUDA_VISIBLE_DEVICES=0" not in p.line.value
        assert "gpus=[]" in p.code()
        assert "Per-process memory" in p.estimates.value and "Per-GPU" not in p.estimates.value
        assert "fits" not in p.estimates.value and "GPU" not in p.estimates.value.split("</table>")[1]
        assert "each GPU" not in p.estimates.value
        ddp = p._estimates["ddp"]
        assert ddp.device == "cpu" and "CUDA context" not in ddp.parts
        assert f"<td>{html.escape(fmt_bytes(ddp.total))}</td>" in p.estimates.value
        assert [label for label, _ in f.run_on.options][1] == "2 CPU processes (nvkit.launch)"
        # the line nvkit.launch writes and runs is the one shown
        run = launch({"data": ["The H200 has 141 GB."] * 4, "max_steps": 1}, nproc_per_node=2,
                     run_dir=str(tmp_path / "r"), start=False)
        assert "CUDA_VISIBLE_DEVICES=''" in run.command and "CUDA_VISIBLE_DEVICES=0" not in run.command
    finally:
        f.close()
        p.close()
        s.unload()


def test_fake_gpus_with_cuda_fill_the_form_and_the_fits(path, unloaded, monkeypatch):
    import torch
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "4")
    s = nvkit.load(path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as where torch has CUDA (the model is loaded)
    p = LaunchPanel()
    try:
        assert p.nproc.value == 4 and "GPUs 0" in p.gpus_line.value and "from the GPUs tab" in p.gpus_line.value
        # a fake 80 GB GPU holds the demo model with any strategy
        assert p.estimates.value.count("fits") >= 4 and "fits one GPU" in p.estimates.value
        assert "each GPU:" in p.estimates.value
    finally:
        p.close()
        s.unload()


def test_refused_start_says_why(path, unloaded):
    s = nvkit.load(path)
    p = LaunchPanel()
    try:
        p.strategy.value = "fsdp"
        assert p.start() is None and "needs CUDA" in p.status.value and not p.start_btn.disabled
        p.strategy.value = "ddp"
        p.examples.value = '{"question": "a"}'
        assert p.start() is None and "keys" in p.status.value
        assert s.generate("The H200", max_new_tokens=2)
    finally:
        p.close()
        s.unload()


def test_two_process_run_charts_stop_and_adapter(path, unloaded, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run folders go under ./nvkit-runs
    s = nvkit.load(path)
    p = LaunchPanel()
    try:
        p.examples.value = "\n".join(["The H200 has 141 GB of fast memory."] * 32)
        p.steps.value = 400
        p.batch.value = 2
        p.seq_len.value = 64
        run = p.start()
        assert run is not None and p.run is run and run.strategy == "ddp"
        assert p.start_btn.disabled and not p.stop_btn.disabled
        assert p.start() is None and "in progress" in p.status.value
        chart = p.chart
        assert chart.n == 2 and chart.run is run
        def points(i):
            x = chart.figure.data[i].x
            return 0 if x is None else len(x)

        _wait(lambda: (points(0) >= 2 and points(2) >= 2) or run.done)
        loss0, loss1 = chart.figure.data[0], chart.figure.data[2]
        assert list(loss0.x)[:2] == [1, 2] and list(loss1.x)[:2] == [1, 2]
        assert len(chart.figure.data[1].y) >= 1 and max(chart.figure.data[1].y) > 0  # rank 0 memory
        _wait(lambda: p.progress.value > 0)
        assert "ranks [0, 1]" in p.progress_label.value
        p.stop_btn.click()
        run.result(timeout=300)
        _wait(lambda: not p.start_btn.disabled)
        assert run.stopped and run.progress["step"] < 400
        assert "Stopped" in p.status.value
        assert "rank 0 peak memory" in p.summary.value and "rank 1 peak memory" in p.summary.value
        # CPU ranks: their numbers say so, no CUDA context; the table's figure is the chart's line
        est = p._estimates["ddp"]
        summary = html.unescape(p.summary.value)
        assert "CUDA" not in summary and "the RSS the rank's run added" in summary
        assert summary.count(f"estimate {fmt_bytes(est.total)}") == 2
        assert f"<td>{html.escape(fmt_bytes(est.total))}</td>" in p.estimates.value
        line = chart.figure.data[-1]
        assert "per process" in line.name and list(line.y) == pytest.approx([est.total / 2**30] * 2)
        assert "process memory" in chart.figure.layout.yaxis.title.text
        for rank, peak in run.summary()["peak_memory"].items():  # the estimate within ±25 % on the CPU demo
            assert abs(est.total - peak) <= 0.25 * peak, (rank, fmt_bytes(peak), str(est))
        assert "adapter" in p.summary.value and p.load_btn.layout.display is None
        p.load_btn.click()
        assert "Adapter loaded" in p.status.value and s.info["adapters"]
    finally:
        p.close()
        s.unload()


def test_finetune_panel_runs_on_two_processes(path, unloaded, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = nvkit.load(path)
    f = FinetunePanel()
    try:
        assert [v for _, v in f.run_on.options][:2] == [1, 2]
        f.examples.value = "\n".join(["NVIDIA GPUs are fast at matrix multiplication."] * 16)
        f.steps.value = 3
        f.batch.value = 2
        f.seq_len.value = 64
        f.precision.value = "fp32"
        f.run_on.value = 2
        f.eval_source.value = "split"   # launched runs have no evaluation: refused, with the way out
        assert f.start() is None and f.launch_view is None
        assert "Evaluation runs in this kernel only" in f.status.value and "off" in f.status.value
        f.eval_source.value = "none"
        run = f.start()
        assert run is not None and f.launch_view is not None and f.launch_view.run is run
        assert f.chart_box.children == (f.launch_view,)
        assert "nvkit.launch(config, nproc_per_node=2" in f.code() and "'precision': 'fp32'" in f.code()
        run.result(timeout=300)
        assert run.ranks == [0, 1] and run.setup(0)["precision"] == "fp32"
        assert os.path.isdir(run.adapter_dir)
        f.run_on.value = 1  # back to this kernel: the form is nvkit.finetune's again
        assert "nvkit.finetune(s, data," in f.code() and "precision='fp32'" in f.code()
    finally:
        f.close()
        s.unload()
