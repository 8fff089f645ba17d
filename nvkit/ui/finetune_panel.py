"""``nvkit.FinetunePanel()``: the Fine-tune tab — data, LoRA and training settings, the memory
estimate, Start/Stop, progress with ETA, loss and memory per step, a summary; a view over
``nvkit.finetune``.

Widgets are created here in the main thread. Start calls ``nvkit.finetune`` (which returns at once;
training runs in its worker). The chart is nvkit's one live chart (``MemoryChart(x="step")``,
created at the first Start) reading the shared memory sampler; the progress line is refreshed a
few times a second by the same shared thread that redraws charts (nvkit/ui/live.py), and the
summary appears when the run's job ends. Stop only sets the run's stop event. The estimate
follows the loaded model (nvkit's load/unload events), wherever it was loaded.
"""

from __future__ import annotations

import html
import json

import ipywidgets as w

from ..errors import NvkitError
from ..train.data import parse_examples
from ..units import fmt_bytes
from . import live
from .common import CodeToggle, current_session, observe_values, on_events, root, style, wrap_row

_REFRESH_S = 0.25
_EXAMPLES = "\n".join([
    '{"prompt": "What does nvkit do?", "response": "It runs Transformers on NVIDIA GPUs from a notebook."}',
    '{"prompt": "Which precision on Ampere?", "response": "bfloat16, because the GPU supports it natively."}',
    '{"prompt": "How do I stop a run?", "response": "Press Stop: it ends after the current step and saves the adapter."}',
])




def _run_on_options() -> list:
    """"this kernel" and, for 2 up to the number of GPUs chosen (2 on the CPU), N processes."""
    try:
        from .launch_panel import chosen_gpus
        n = len(chosen_gpus()[0])
    except Exception:  # noqa: BLE001 - no NVML: the CPU choice is still offered
        n = 0
    top = n if n >= 2 else 2
    where = "GPUs" if n >= 2 else "CPU processes"
    return [("this kernel", 1)] + [(f"{k} {where} (nvkit.launch)", k) for k in range(2, top + 1)]


class FinetunePanel(w.VBox):
    """Fine-tune the current session's model with LoRA from a form; ``.run`` is the FinetuneRun."""

    def __init__(self, session=None, **kwargs):
        self._session = session
        self.run = None
        self.chart = None     # MemoryChart(x="step"), made at the first Start

        # data
        self.source = w.ToggleButtons(options=[("Examples", "inline"), ("File", "file")], value="inline",
                                      description="data", style={"button_width": "auto"})
        self.source.add_class("nvkit-ft-source")
        self.examples = w.Textarea(value=_EXAMPLES, placeholder="one example per line: text, or a JSON object",
                                   layout=w.Layout(width="auto", height="110px"))
        self.examples.add_class("nvkit-ft-examples")
        self.path = w.Text(value="", placeholder="/path/to/data.jsonl (.jsonl, .json, .csv, .txt)",
                           description="file", layout=w.Layout(width="auto", display="none"))
        self.path.add_class("nvkit-ft-file")
        self.source.observe(self._on_source, "value")
        # LoRA and training
        style_ = {"description_width": "110px"}
        lay = w.Layout(width="220px")
        self.r = w.BoundedIntText(value=16, min=1, max=1024, description="LoRA r", style=style_, layout=lay)
        self.alpha = w.BoundedIntText(value=32, min=1, max=4096, description="alpha", style=style_, layout=lay)
        self.dropout = w.BoundedFloatText(value=0.05, min=0.0, max=0.9, step=0.01, description="dropout", style=style_, layout=lay)
        self.targets = w.Text(value="all-linear", description="target modules", style=style_,
                              layout=w.Layout(width="440px", max_width="100%"))
        self.steps = w.BoundedIntText(value=30, min=1, max=1_000_000, description="steps", style=style_, layout=lay)
        self.lr = w.BoundedFloatText(value=2e-4, min=1e-7, max=0.5, step=1e-5, description="learning rate", style=style_, layout=lay)
        self.batch = w.BoundedIntText(value=8, min=1, max=4096, description="batch size", style=style_, layout=lay)
        self.seq_len = w.BoundedIntText(value=512, min=8, max=1_000_000, description="seq len", style=style_, layout=lay)
        self.accum = w.BoundedIntText(value=1, min=1, max=1024, description="grad accum", style=style_, layout=lay)
        self.checkpointing = w.Checkbox(value=False, description="gradient checkpointing", indent=False,
                                        layout=w.Layout(width="auto"))
        self.output_dir = w.Text(value="", placeholder="(default: ./nvkit-runs/<model>-lora-<time>)",
                                 description="output dir", style=style_, layout=w.Layout(width="440px", max_width="100%"))
        # "auto", not None: a Dropdown whose value is None shows no selection in the browser
        self.precision = w.Dropdown(options=[("automatic", "auto"), ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")],
                                    value="auto", description="precision", style=style_, layout=lay)
        # "run on N GPUs": more than one hands the form to a Launch panel (nvkit.launch) shown below
        self.run_on = w.Dropdown(options=_run_on_options(), value=1, description="run on", style=style_,
                                 layout=w.Layout(width="330px"))
        self.run_on.add_class("nvkit-ft-run-on")
        self.launch_view = None
        observe_values((self.r, self.batch, self.seq_len, self.checkpointing), self._refresh_estimate)
        # estimate, controls, progress
        self.estimate = w.HTML("")
        self.estimate.add_class("nvkit-ft-estimate")
        self.start_btn = w.Button(description="Start", button_style="success", icon="play")
        self.start_btn.add_class("nvkit-ft-start")
        self.start_btn.on_click(lambda _b: self.start())
        self.stop_btn = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.stop_btn.add_class("nvkit-ft-stop")
        self.stop_btn.on_click(lambda _b: self.stop())
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="240px"))
        self.progress.add_class("nvkit-ft-progress")
        self.progress_label = w.HTML("")
        self.progress_label.add_class("nvkit-ft-progress-label")
        self.status = w.HTML("")
        self.status.add_class("nvkit-ft-status")
        self.summary = w.HTML("")
        self.summary.add_class("nvkit-ft-summary")
        self.chart_box = w.VBox([w.HTML("<span class='nvkit-muted'>Loss and memory per step appear here "
                                        "when a run starts.</span>")])
        self.chart_box.add_class("nvkit-ft-chart")
        self.code_view = CodeToggle(self.code)
        observe_values((self.source, self.examples, self.path, self.r, self.alpha, self.dropout, self.targets,
                        self.steps, self.lr, self.batch, self.seq_len, self.accum, self.checkpointing,
                        self.output_dir, self.precision, self.run_on), self.code_view.refresh)

        settings = w.VBox([
            wrap_row([self.r, self.alpha, self.dropout]), self.targets,
            wrap_row([self.steps, self.lr, self.accum]), wrap_row([self.batch, self.seq_len, self.checkpointing]),
            self.output_dir, wrap_row([self.precision, self.run_on]),
        ])
        super().__init__(children=[
            style(), self.source, self.examples, self.path, settings, self.estimate,
            wrap_row([self.start_btn, self.stop_btn, self.progress, self.progress_label]),
            self.status, self.chart_box, self.summary, self.code_view,
        ], **kwargs)
        self.add_class("nvkit-finetune-panel")
        root(self)
        self._refresh_estimate()
        on_events(self._on_event)

    @property
    def figure(self):
        """The chart's plotly FigureWidget (None before the first Start)."""
        return None if self.chart is None else self.chart.figure

    def _on_source(self, change):
        inline = change["new"] == "inline"
        self.examples.layout.display = None if inline else "none"
        self.path.layout.display = "none" if inline else None

    def _current_session(self):
        if self._session is not None and getattr(self._session, "model", None) is not None:
            return self._session
        return current_session()

    # --- settings -> core call -----------------------------------------------------------------
    def _targets(self):
        t = self.targets.value.strip()
        return "all-linear" if t in ("", "all-linear") else [x.strip() for x in t.split(",") if x.strip()]

    def settings(self) -> dict:
        """The keyword arguments Start passes to ``nvkit.finetune`` (without session and data)."""
        kw = dict(lora=dict(r=self.r.value, alpha=self.alpha.value, dropout=round(self.dropout.value, 4),
                            target_modules=self._targets()),
                  max_steps=self.steps.value, learning_rate=self.lr.value, batch_size=self.batch.value,
                  seq_len=self.seq_len.value, grad_accum=self.accum.value,
                  gradient_checkpointing=self.checkpointing.value)
        if self.output_dir.value.strip():
            kw["output_dir"] = self.output_dir.value.strip()
        if self.precision.value != "auto":
            kw["precision"] = self.precision.value
        return kw

    def data(self):
        if self.source.value == "file":
            p = self.path.value.strip()
            if not p:
                raise NvkitError("Choose a data file (.jsonl, .json, .csv or .txt), or switch to Examples.")
            return p
        return parse_examples(self.examples.value)

    def code(self) -> str:
        if self.run_on.value > 1 and self.launch_view is not None:
            return self.launch_view.code()
        kw = self.settings()
        if self.source.value == "file":
            data_src = f"data = {self.path.value.strip()!r}\n"
        else:
            try:
                rows = parse_examples(self.examples.value)
            except NvkitError:
                rows = []
            data_src = "data = [\n" + "".join(f"    {r!r},\n" for r in rows) + "]\n"
        args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        return ("import nvkit\n" + data_src +
                f"run = nvkit.finetune(nvkit.session(), data, {args})\n"
                "await run  # or run.result(); run.stop() ends it after the current step\n"
                "run.history[-1], run.adapter_dir\n")

    # --- the estimate follows the loaded model --------------------------------------------------
    def _on_event(self, ev) -> None:
        if ev.kind in ("load", "unload"):
            self._refresh_estimate()

    def _refresh_estimate(self):
        self.code_view.refresh()
        s = self._current_session()
        if s is None:
            self.estimate.value = ("<span class='nvkit-muted'>Load a model first (Model tab or nvkit.load) to see "
                                   "the memory estimate.</span>")
            return
        from ..memory.estimate import for_session
        try:  # what nvkit.finetune will predict for these settings (memory.expect_finetune)
            est = for_session(s, mode="lora", batch_size=self.batch.value, seq_len=self.seq_len.value,
                              lora_r=self.r.value, gradient_checkpointing=self.checkpointing.value, path="nvkit")
            self.estimate.value = (f"Estimated peak for this run on {html.escape(s.model_id)}: "
                                   f"<b>{html.escape(fmt_bytes(est.total))}</b> "
                                   "<span class='nvkit-muted'>(the measured peak appears in the summary)</span>")
        except Exception as e:  # an estimate must never block starting a run
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.estimate.value = f"<span class='nvkit-muted'>No estimate: {html.escape(msg)}</span>"

    # --- actions (main thread; they only start or signal work) ---------------------------------
    def start(self):
        """What the Start button does: ``nvkit.finetune`` with the form's settings, or ``nvkit.launch``
        over N processes when "run on" says N > 1 (through a Launch panel shown below the form)."""
        if self.run_on.value > 1:
            if self.launch_view is None:
                from .launch_panel import LaunchPanel
                self.launch_view = LaunchPanel(session=self._session, source=self)
                self.chart_box.children = [self.launch_view]
            self.launch_view.nproc.value = self.run_on.value
            return self.launch_view.start()
        if self.run is not None and not self.run.done:
            self.status.value = "<span class='nvkit-error'>A run is in progress: Stop it first.</span>"
            return None
        s = self._current_session()
        try:
            if s is None:
                raise NvkitError("No model is loaded: load one first (Model tab, or s = nvkit.load('demo')).")
            from .. import finetune
            # the trainer's thread imports pandas, and the chart made below checks values
            # against it: whole before the thread starts (live.plotly_ready says why)
            live.plotly_ready()
            run = finetune(s, self.data(), **self.settings())
        except NvkitError as e:
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(e))}</span>"
            return None
        self.run = run
        self.summary.value = ""
        self.status.value = html.escape(f"Training {run.total_steps} steps · {run.info['precision']} · "
                                        f"loss: {run.info.get('loss', 'model loss')} · Liger {run.info['liger']}")
        self.start_btn.disabled = True
        self.stop_btn.disabled = False
        self.progress.value = 0.0
        if self.chart is None:  # widgets are made here, in the main thread, once
            from .memory_chart import MemoryChart
            self.chart = MemoryChart(x="step")
            self.chart_box.children = [self.chart]
        self.chart.follow(run)
        live.every(_REFRESH_S, lambda: self._tick(run), owner=self)
        return run

    def stop(self):
        if self.launch_view is not None:
            self.launch_view.stop()
        if self.run is not None:
            self.run.stop()
            self.status.value = "Stopping after the current step; the adapter will be saved."

    # --- progress (the shared live thread; sets values only) -----------------------------------
    def _tick(self, run) -> None:
        if run is not self.run:
            return
        finished = run.done
        p = run.progress
        if abs(self.progress.value - p["fraction"]) > 1e-9:
            self.progress.value = p["fraction"]
        hist = run.history
        eta = f" · ETA {p['eta_s']:.0f} s" if p["eta_s"] is not None else ""
        loss = f" · loss {hist[-1]['loss']:.4f}" if hist else ""
        label = html.escape(f"step {p['step']}/{p['total']}{loss}{eta}")
        if self.progress_label.value != label:
            self.progress_label.value = label
        if finished:
            live.stop_every(self)
            if self.chart is not None:
                self.chart.refresh()
            self._finish(run)

    def _finish(self, run):
        self.start_btn.disabled = False
        self.stop_btn.disabled = True
        if run.error is not None:
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(run.error))}</span>"
            return
        sm = run.summary()
        self.progress.value = 1.0 if not run.stopped else self.progress.value
        self.status.value = "Stopped by the user." if run.stopped else "Done."
        rows = [("time", f"{sm['seconds']:.1f} s"), ("steps", str(sm["steps"])),
                ("tokens/s", f"{sm['tokens_per_s']:.0f}"), ("peak memory", fmt_bytes(sm["peak_memory"])),
                ("final loss", f"{sm['final_loss']:.4f}" if sm["final_loss"] is not None else "n/a"),
                ("adapter", sm["adapter_dir"] or "not saved")]
        self.summary.value = "<table class='nvkit-table'>" + "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"
        self.code_view.refresh()

    def close(self):
        live.stop_every(self)
        if self.launch_view is not None:
            self.launch_view.close()
        if self.chart is not None:
            self.chart.close()
        super().close()
