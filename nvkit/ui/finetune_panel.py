"""``nvkit.FinetunePanel()``: the Fine-tune tab — data, LoRA and training settings, the memory
estimate, Start/Stop, progress with ETA, loss and memory on one time axis, a summary; a view over
``nvkit.finetune``.

Widgets are created here in the main thread. Start calls ``nvkit.finetune`` (which returns at once;
training runs in its worker); a small refresher thread then sets widget values and updates the
chart ~4 times a second from the run's history, and stops when the run ends. Stop only sets the
run's stop event.
"""

from __future__ import annotations

import collections
import html
import json
import threading

import ipywidgets as w
import numpy as np
# plotly imports pandas lazily on its first array check; done here, in the main thread, so the
# refresher thread can't meet a half-imported pandas while the trainer thread imports it too.
import pandas  # noqa: F401

from .. import events
from ..errors import NvkitError
from ..train.data import parse_examples
from ..units import fmt_bytes

_REFRESH_S = 0.25
_MAX_POINTS = 2000
_EXAMPLES = "\n".join([
    '{"prompt": "What does nvkit do?", "response": "It runs Transformers on NVIDIA GPUs from a notebook."}',
    '{"prompt": "Which precision on Ampere?", "response": "bfloat16, because the GPU supports it natively."}',
    '{"prompt": "How do I stop a run?", "response": "Press Stop: it ends after the current step and saves the adapter."}',
])




class FinetunePanel(w.VBox):
    """Fine-tune the current session's model with LoRA from a form; ``.run`` is the FinetuneRun."""

    def __init__(self, session=None, **kwargs):
        self._session = session
        self.run = None
        self._stop_refresh = threading.Event()
        self._loss_t: collections.deque = collections.deque(maxlen=_MAX_POINTS)
        self._loss_y: collections.deque = collections.deque(maxlen=_MAX_POINTS)
        self._mem_t: collections.deque = collections.deque(maxlen=_MAX_POINTS)
        self._mem_y: collections.deque = collections.deque(maxlen=_MAX_POINTS)

        # data
        self.source = w.ToggleButtons(options=[("Examples", "inline"), ("File", "file")], value="inline",
                                      description="Data")
        self.source.add_class("nvkit-ft-source")
        self.examples = w.Textarea(value=_EXAMPLES, placeholder="one example per line: text, or a JSON object",
                                   layout=w.Layout(width="100%", height="110px"))
        self.examples.add_class("nvkit-ft-examples")
        self.path = w.Text(value="", placeholder="/path/to/data.jsonl (.jsonl, .json, .csv, .txt)",
                           description="File", layout=w.Layout(width="100%", display="none"))
        self.path.add_class("nvkit-ft-file")
        self.source.observe(self._on_source, "value")
        # LoRA and training
        style = {"description_width": "110px"}
        lay = w.Layout(width="220px")
        self.r = w.BoundedIntText(value=16, min=1, max=1024, description="LoRA r", style=style, layout=lay)
        self.alpha = w.BoundedIntText(value=32, min=1, max=4096, description="alpha", style=style, layout=lay)
        self.dropout = w.BoundedFloatText(value=0.05, min=0.0, max=0.9, step=0.01, description="dropout", style=style, layout=lay)
        self.targets = w.Text(value="all-linear", description="target modules", style=style, layout=w.Layout(width="440px"))
        self.steps = w.BoundedIntText(value=30, min=1, max=1_000_000, description="steps", style=style, layout=lay)
        self.lr = w.BoundedFloatText(value=2e-4, min=1e-7, max=0.5, step=1e-5, description="learning rate", style=style, layout=lay)
        self.batch = w.BoundedIntText(value=8, min=1, max=4096, description="batch size", style=style, layout=lay)
        self.seq_len = w.BoundedIntText(value=512, min=8, max=1_000_000, description="seq len", style=style, layout=lay)
        self.accum = w.BoundedIntText(value=1, min=1, max=1024, description="grad accum", style=style, layout=lay)
        self.checkpointing = w.Checkbox(value=False, description="gradient checkpointing", indent=False)
        self.output_dir = w.Text(value="", placeholder="(default: ./nvkit-runs/<model>-lora-<time>)",
                                 description="output dir", style=style, layout=w.Layout(width="440px"))
        for widget in (self.r, self.batch, self.seq_len, self.checkpointing):
            widget.observe(lambda _ch: self._refresh_estimate(), "value")
        # estimate, controls, progress
        self.estimate = w.HTML("")
        self.estimate.add_class("nvkit-ft-estimate")
        self.start_btn = w.Button(description="Start", button_style="success", icon="play")
        self.start_btn.add_class("nvkit-ft-start")
        self.start_btn.on_click(lambda _b: self.start())
        self.stop_btn = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.stop_btn.add_class("nvkit-ft-stop")
        self.stop_btn.on_click(lambda _b: self.stop())
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="300px"))
        self.progress.add_class("nvkit-ft-progress")
        self.progress_label = w.HTML("")
        self.progress_label.add_class("nvkit-ft-progress-label")
        self.status = w.HTML("")
        self.status.add_class("nvkit-ft-status")
        self.summary = w.HTML("")
        self.summary.add_class("nvkit-ft-summary")
        self.figure = self._make_figure()
        self.chart = w.Box([self.figure])
        self.chart.add_class("nvkit-ft-chart")

        settings = w.VBox([
            w.HBox([self.r, self.alpha, self.dropout]), self.targets,
            w.HBox([self.steps, self.lr, self.accum]), w.HBox([self.batch, self.seq_len, self.checkpointing]),
            self.output_dir,
        ])
        super().__init__(children=[
            self.source, self.examples, self.path, settings, self.estimate,
            w.HBox([self.start_btn, self.stop_btn, self.progress, self.progress_label]),
            self.status, self.chart, self.summary,
        ], **kwargs)
        self.add_class("nvkit-finetune-panel")
        self._refresh_estimate()

    # --- widgets -------------------------------------------------------------------------------
    def _make_figure(self):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                            subplot_titles=("loss", "memory (GiB)"))
        fig.add_trace(go.Scatter(x=np.zeros(0), y=np.zeros(0), mode="lines+markers", name="loss"), row=1, col=1)
        fig.add_trace(go.Scatter(x=np.zeros(0), y=np.zeros(0), mode="lines", name="memory"), row=2, col=1)
        fig.update_layout(height=380, margin=dict(l=50, r=20, t=30, b=40), showlegend=False)
        fig.update_xaxes(title_text="seconds since nvkit started", row=2, col=1)
        return go.FigureWidget(fig)

    def _on_source(self, change):
        inline = change["new"] == "inline"
        self.examples.layout.display = None if inline else "none"
        self.path.layout.display = "none" if inline else None

    def _current_session(self):
        if self._session is not None:
            return self._session
        from .. import session as current
        return current(required=False)

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
        return kw

    def data(self):
        if self.source.value == "file":
            p = self.path.value.strip()
            if not p:
                raise NvkitError("Choose a data file (.jsonl, .json, .csv or .txt), or switch to Examples.")
            return p
        return parse_examples(self.examples.value)

    def code(self) -> str:
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

    def _refresh_estimate(self):
        s = self._current_session()
        if s is None or not getattr(s, "loaded", False):
            self.estimate.value = "<i>Load a model first (Model tab or nvkit.load) to see the memory estimate.</i>"
            return
        from ..memory.estimate import for_session
        try:  # what nvkit.finetune will predict for these settings (memory.expect_finetune)
            est = for_session(s, mode="lora", batch_size=self.batch.value, seq_len=self.seq_len.value,
                              lora_r=self.r.value, gradient_checkpointing=self.checkpointing.value, path="nvkit")
            total = getattr(est, "total", None)
            self.estimate.value = (f"Estimated peak for this run: <b>{html.escape(fmt_bytes(total))}</b> "
                                   "(measured peak appears in the summary)")
        except Exception as e:  # an estimate must never block starting a run
            self.estimate.value = f"<i>No estimate: {html.escape(str(e).splitlines()[0] if str(e) else type(e).__name__)}</i>"

    # --- actions (main thread; they only start or signal work) ---------------------------------
    def start(self):
        """What the Start button does: ``nvkit.finetune`` with the form's settings."""
        if self.run is not None and not self.run.done:
            self.status.value = "<span style='color:#b00'>A run is in progress: Stop it first.</span>"
            return None
        s = self._current_session()
        try:
            if s is None:
                raise NvkitError("No model is loaded: load one first (Model tab, or s = nvkit.load('demo')).")
            from .. import finetune
            run = finetune(s, self.data(), **self.settings())
        except NvkitError as e:
            self.status.value = f"<span style='color:#b00'>{html.escape(str(e))}</span>"
            return None
        self.run = run
        for dq in (self._loss_t, self._loss_y, self._mem_t, self._mem_y):
            dq.clear()
        self.summary.value = ""
        self.status.value = html.escape(f"Training {run.total_steps} steps · {run.info['precision']} · "
                                        f"loss: {run.info.get('loss', 'model loss')} · Liger {run.info['liger']}")
        self.start_btn.disabled = True
        self.stop_btn.disabled = False
        self.progress.value = 0.0
        self._stop_refresh.clear()
        threading.Thread(target=self._refresh_loop, args=(run,), name="nvkit-ft-panel", daemon=True).start()
        return run

    def stop(self):
        if self.run is not None:
            self.run.stop()
            self.status.value = "Stopping after the current step; the adapter will be saved."

    # --- refresher (its own thread; sets values only) -----------------------------------------
    def _refresh_loop(self, run):
        seen = 0
        while not self._stop_refresh.is_set():
            finished = run.done
            seen = self._update(run, seen)
            if finished:
                break
            self._stop_refresh.wait(_REFRESH_S)
        self._finish(run)

    def _update(self, run, seen: int) -> int:
        hist = run.history
        for rec in hist[seen:]:
            self._loss_t.append(rec["t"])
            self._loss_y.append(rec["loss"])
        seen = len(hist)
        from ..memory.usage import memory_now
        device_type = "cuda" if str(run.info.get("device", "cpu")).startswith("cuda") else "cpu"
        self._mem_t.append(events.now())
        self._mem_y.append(memory_now(device_type)[0] / 2**30)
        with self.figure.batch_update():
            self.figure.data[0].x = np.asarray(self._loss_t, dtype=np.float64)
            self.figure.data[0].y = np.asarray(self._loss_y, dtype=np.float64)
            self.figure.data[1].x = np.asarray(self._mem_t, dtype=np.float64)
            self.figure.data[1].y = np.asarray(self._mem_y, dtype=np.float64)
        p = run.progress
        self.progress.value = p["fraction"]
        eta = f" · ETA {p['eta_s']:.0f} s" if p["eta_s"] is not None else ""
        loss = f" · loss {hist[-1]['loss']:.4f}" if hist else ""
        self.progress_label.value = html.escape(f"step {p['step']}/{p['total']}{loss}{eta}")
        return seen

    def _finish(self, run):
        self.start_btn.disabled = False
        self.stop_btn.disabled = True
        if not run.done:
            return
        if run.error is not None:
            self.status.value = f"<span style='color:#b00'>{html.escape(str(run.error))}</span>"
            return
        sm = run.summary()
        self.progress.value = 1.0 if not run.stopped else self.progress.value
        self.status.value = "Stopped by the user." if run.stopped else "Done."
        rows = [("time", f"{sm['seconds']:.1f} s"), ("steps", str(sm["steps"])),
                ("tokens/s", f"{sm['tokens_per_s']:.0f}"), ("peak memory", fmt_bytes(sm["peak_memory"])),
                ("final loss", f"{sm['final_loss']:.4f}" if sm["final_loss"] is not None else "n/a"),
                ("adapter", sm["adapter_dir"] or "not saved")]
        self.summary.value = "<table>" + "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"

    def close(self):
        self._stop_refresh.set()
        super().close()
