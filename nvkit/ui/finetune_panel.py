"""``nvkit.FinetunePanel()``: the Fine-tune tab — data (with a Preview of what the model will see),
LoRA, training and evaluation settings, the memory estimate, Start/Stop/Resume, progress with ETA,
training and eval loss and memory per step, a summary, Export; a view over ``nvkit.finetune``,
``nvkit.data.preview`` and ``Session.export``.

Widgets are created here in the main thread. Start calls ``nvkit.finetune`` (which returns at once;
training runs in its worker). The chart is nvkit's one live chart (``MemoryChart(x="step")``,
created at the first Start) reading the shared memory sampler; the progress line is refreshed a
few times a second by the same shared thread that redraws charts (nvkit/ui/live.py), and the
summary appears when the run's job ends. Stop only sets the run's stop event. The estimate is the
run's own (``nvkit.train.finetune.run_estimate``: the batches the form's examples make), follows
the loaded model (nvkit's load/unload events), wherever it was loaded, and is the number the
summary puts beside the measured peak. The default examples, steps and learning rate are the demo
lesson (``nvkit.demo.lesson``), which changes the answers to questions it does not contain. Preview tokenizes
in the main thread (a tokenizer call, no model); Export writes in a worker thread (a merge reads
the base weights again).
"""

from __future__ import annotations

import html
import json
import os

import ipywidgets as w

from ..demo import lesson
from ..errors import NvkitError
from ..threads import run_in_worker
from ..train.data import parse_examples
from ..units import counted, fmt_bytes
from . import live
from .common import (CodeToggle, current_session, danger_while_enabled, first_sentence, observe_values, on_events,
                     root, style, why_html, wrap_row)

_REFRESH_S = 0.25
# The demo lesson (nvkit.demo.lesson): with these examples and the default steps and learning rate,
# the tuned model's answers to questions it never trained on visibly change
_EXAMPLES = "\n".join(json.dumps(row) for row in lesson.TRAIN)
PREVIEW_ROWS = 5
# the preview's rows are the user's text: wrapped anywhere rather than widening the panel, and the
# loss-carrying tokens marked in the theme's colours
_CSS = """
.nvkit-ft-preview { max-height: 320px; overflow-y: auto; overflow-x: hidden; }
.nvkit-ft-preview .nvkit-preview p { margin: 2px 0; }
.nvkit-ft-preview .nvkit-preview pre { margin: 2px 0 8px 0; padding: 4px; overflow-wrap: anywhere;
  font-family: var(--jp-code-font-family); font-size: var(--jp-code-font-size);
  background: var(--jp-layout-color2); color: var(--jp-content-font-color1); }
.nvkit-ft-preview .nvkit-preview mark { color: inherit;
  background: color-mix(in srgb, var(--jp-brand-color1, #1976d2) 30%, transparent); }
"""


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
        self._build_preview()
        self._build_eval()
        # LoRA and training
        style_ = {"description_width": "110px"}
        lay = w.Layout(width="220px")
        self.r = w.BoundedIntText(value=16, min=1, max=1024, description="LoRA r", style=style_, layout=lay)
        self.alpha = w.BoundedIntText(value=32, min=1, max=4096, description="alpha", style=style_, layout=lay)
        self.dropout = w.BoundedFloatText(value=0.05, min=0.0, max=0.9, step=0.01, description="dropout", style=style_, layout=lay)
        self.targets = w.Text(value="all-linear", description="target modules", style=style_,
                              layout=w.Layout(width="440px", max_width="100%"))
        self.steps = w.BoundedIntText(value=lesson.STEPS, min=1, max=1_000_000, description="steps", style=style_,
                                      layout=lay)
        self.lr = w.BoundedFloatText(value=lesson.LEARNING_RATE, min=1e-7, max=0.5, step=1e-5,
                                     description="learning rate", style=style_, layout=lay)
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
        observe_values((self.r, self.dropout, self.batch, self.seq_len, self.checkpointing), self._refresh_estimate)
        # estimate, controls, progress
        self.estimate = w.HTML("")
        self.estimate.add_class("nvkit-ft-estimate")
        self.start_btn = w.Button(description="Start", button_style="success", icon="play")
        self.start_btn.add_class("nvkit-ft-start")
        self.start_btn.on_click(lambda _b: self.start())
        self.stop_btn = danger_while_enabled(w.Button(description="Stop", icon="stop", disabled=True))
        self.stop_btn.add_class("nvkit-ft-stop")
        self.stop_btn.on_click(lambda _b: self.stop())
        self._build_resume_export()
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
                        self.output_dir, self.eval_source, self.eval_split, self.eval_file, self.eval_every,
                        self.export_dir, self.export_merge, self.precision, self.run_on), self.code_view.refresh)
        # a preview of other data or settings would mislead: it goes when they change
        observe_values((self.source, self.examples, self.path, self.seq_len, self.batch, self.accum),
                       self._clear_preview)
        # the estimate is of the rows these settings make from this data, as the run's will be
        observe_values((self.steps, self.source, self.examples, self.path, self.accum, self.eval_source,
                        self.eval_split), self._refresh_estimate)

        settings = w.VBox([
            wrap_row([self.r, self.alpha, self.dropout]), self.targets,
            wrap_row([self.steps, self.lr, self.accum]), wrap_row([self.batch, self.seq_len, self.checkpointing]),
            self.output_dir, wrap_row([self.precision, self.run_on]),
        ])
        super().__init__(children=[
            style(), w.HTML(f"<style>{_CSS}</style>", layout=w.Layout(height="0px", margin="0")),
            self._data_row(), self.examples, self.path, self.preview_box, settings,
            self.eval_row, self.estimate,
            wrap_row([self.start_btn, self.stop_btn, self.resume_btn, self.progress, self.progress_label]),
            self.status, self.chart_box, self.summary, self.export_row, self.export_status, self.code_view,
        ], **kwargs)
        self.add_class("nvkit-finetune-panel")
        root(self)
        self._refresh_estimate()
        on_events(self._on_event)

    @property
    def figure(self):
        """The chart's plotly FigureWidget (None before the first Start)."""
        return None if self.chart is None else self.chart.figure

    # --- the parts of the form, built apart ------------------------------------------------------
    def _build_preview(self) -> None:
        self.preview_btn = w.Button(description="Preview", icon="eye",
                                    tooltip="the first rows as the model will see them (template, tokens, "
                                            "what carries the loss) and the totals, before paying for a run")
        self.preview_btn.add_class("nvkit-ft-preview-btn")
        self.preview_btn.on_click(lambda _b: self.preview())
        self.preview_html = w.HTML("")
        self.preview_html.add_class("nvkit-ft-preview")
        self.preview_box = w.VBox([self.preview_html], layout=w.Layout(display="none", width="100%"))
        self.last_preview = None
        self.preview_job = None
        self._preview_seq = 0   # a preview made for data or settings changed since is not shown

    def _build_eval(self) -> None:
        style_ = {"description_width": "110px"}
        self.eval_source = w.Dropdown(options=[("off", "none"), ("hold out a share", "split"), ("a file", "file")],
                                      value="none", description="evaluate", style=style_,
                                      layout=w.Layout(width="290px"))
        self.eval_source.add_class("nvkit-ft-eval-source")
        self.eval_split = w.BoundedFloatText(value=0.1, min=0.01, max=0.5, step=0.01, description="held-out share",
                                             style=style_, layout=w.Layout(width="220px"))
        self.eval_split.add_class("nvkit-ft-eval-split")
        self.eval_file = w.Text(value="", placeholder="/path/to/eval.jsonl (same forms as the data)",
                                description="eval file", style=style_, layout=w.Layout(width="440px", max_width="100%"))
        self.eval_file.add_class("nvkit-ft-eval-file")
        self.eval_every = w.BoundedIntText(value=5, min=0, max=1_000_000, description="eval every", style=style_,
                                           layout=w.Layout(width="220px"),
                                           tooltip="steps between evaluations; 0: only before the first step "
                                                   "and at the end")
        self.eval_every.add_class("nvkit-ft-eval-every")
        self.eval_row = wrap_row([self.eval_source, self.eval_split, self.eval_file, self.eval_every])
        self.eval_row.add_class("nvkit-ft-eval")
        self.eval_source.observe(lambda _ch: self._sync_eval(), "value")
        self._sync_eval()

    def _data_row(self) -> w.HBox:
        row = wrap_row([self.source, self.preview_btn])
        row.layout.align_items = "flex-end"  # Preview beside the buttons, not their label above them
        return row

    def _sync_eval(self) -> None:
        src = self.eval_source.value
        self.eval_split.layout.display = None if src == "split" else "none"
        self.eval_file.layout.display = None if src == "file" else "none"
        self.eval_every.layout.display = "none" if src == "none" else None

    def _build_resume_export(self) -> None:
        self.resume_btn = w.Button(description="Resume", icon="forward", disabled=True,
                                   tooltip="continue the last run from its latest checkpoint: same data and "
                                           "settings, 'steps' is the total")
        self.resume_btn.add_class("nvkit-ft-resume")
        self.resume_btn.on_click(lambda _b: self.resume())
        self.export_dir = w.Text(value="", placeholder="a new or empty folder", description="export to",
                                 style={"description_width": "110px"}, layout=w.Layout(width="440px", max_width="100%"))
        self.export_dir.add_class("nvkit-ft-export-dir")
        self.export_merge = w.Checkbox(value=True, description="merge the adapter into the weights", indent=False,
                                       layout=w.Layout(width="auto"))
        self.export_merge.add_class("nvkit-ft-export-merge")
        self.export_btn = w.Button(description="Export", icon="upload",
                                   tooltip="a standalone checkpoint (merged) or the adapter, with the tokenizer, "
                                           "generation config and a model card")
        self.export_btn.add_class("nvkit-ft-export")
        self.export_btn.on_click(lambda _b: self.export())
        self.export_status = w.HTML("")
        self.export_status.add_class("nvkit-ft-export-status")
        self.export_row = wrap_row([self.export_dir, self.export_merge, self.export_btn])
        self.export_row.add_class("nvkit-ft-export-row")
        self.export_job = None

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
        kw.update(self.eval_settings())
        return kw

    def eval_settings(self) -> dict:
        """The evaluation keywords of ``nvkit.finetune`` the form asks for (empty when off)."""
        src = self.eval_source.value
        if src == "none":
            return {}
        if src == "split":
            kw = {"eval_split": round(float(self.eval_split.value), 4)}
        else:
            p = self.eval_file.value.strip()
            if not p:
                raise NvkitError("Choose an eval file (.jsonl, .json, .csv or .txt), or hold out a share of the data.")
            kw = {"eval_data": p}
        if self.eval_every.value:
            kw["eval_every"] = int(self.eval_every.value)
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
        return ("import nvkit\n" + data_src + "s = nvkit.session()\n" + self._preview_code() +
                f"run = nvkit.finetune(s, data, {args})\n"
                "await run  # or run.result(); run.stop() ends it after the current step, with a checkpoint\n"
                "print(run.summary())  # eval loss before and after, why it stopped, checkpoint, adapter\n"
                + self._resume_export_code())

    def _preview_code(self) -> str:
        return (f"display(nvkit.data.preview(data, s, seq_len={self.seq_len.value}, n={PREVIEW_ROWS}, "
                f"batch_size={self.batch.value}, grad_accum={self.accum.value}))  # what the model will see\n")

    def _resume_export_code(self) -> str:
        lines = ["# Resume: the same call with resume=True, output_dir=run.info['output_dir'] continues from "
                 "the latest checkpoint"]
        folder = self.export_dir.value.strip()
        if folder:
            lines.append(f"s.export({folder!r}, merge={bool(self.export_merge.value)})")
        else:
            lines.append("# s.export('folder', merge=True)  # a standalone checkpoint; merge=False: the adapter")
        return "\n".join(lines) + "\n"

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
        run = self.run
        try:  # an estimate must never block starting a run
            if run is not None and not run.done and run.estimate is not None:
                est, bound = run.estimate, False  # the running run's own prediction
            else:
                est, bound = self._form_estimate(s)
        except Exception as e:  # noqa: BLE001 - see above
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.estimate.value = f"<span class='nvkit-muted'>No estimate: {html.escape(msg)}</span>"
            return
        size = html.escape(fmt_bytes(est.total))
        head = f"Estimated peak for this run on {html.escape(s.model_id)}: " + (f"at most <b>{size}</b>" if bound
                                                                              else f"<b>{size}</b>")
        if est.device == "cpu":
            what = "on the CPU: the process memory the run adds, its model included (not the whole process)"
        else:
            what = "GPU memory, the CUDA context included"
        if bound:
            what += "; for rows of seq len tokens: the run's own estimate, from the file's rows, replaces this"
        self.estimate.value = (f"{head} <span class='nvkit-muted'>({html.escape(what)}; the measured peak appears "
                               "in the summary)</span>")

    def _form_estimate(self, s):
        """(the estimate of the run Start would begin, whether it is an upper bound): the run's own
        (``run_estimate``, the rows of the form's data), or for a data file, which is read when the
        run starts, the bound of rows that fill ``seq len``."""
        from ..train.finetune import run_estimate
        lora = dict(r=self.r.value, alpha=self.alpha.value, dropout=round(self.dropout.value, 4),
                    target_modules=self._targets())
        kw = dict(lora=lora, max_steps=int(self.steps.value), batch_size=int(self.batch.value),
                  grad_accum=int(self.accum.value), seq_len=int(self.seq_len.value),
                  gradient_checkpointing=bool(self.checkpointing.value))
        if self.source.value == "inline":
            if self.eval_source.value == "split":
                kw["eval_split"] = round(float(self.eval_split.value), 4)
            return run_estimate(s, self.data(), **kw), False
        from ..memory.estimate import for_session
        from ..train.compile import compile_decision
        # compiled or not as finetune(compile="auto") will decide (a warm compile cache can only
        # turn a short run's compile on, which needs less activation memory)
        compiled = compile_decision("auto", s.device.type, kw["max_steps"], False)[0]
        return for_session(s, mode="lora", batch_size=kw["batch_size"], seq_len=kw["seq_len"], lora_r=lora["r"],
                           lora_dropout=lora["dropout"], gradient_checkpointing=kw["gradient_checkpointing"],
                           path="nvkit", compiled=compiled), True

    # --- actions (main thread; they only start or signal work) ---------------------------------
    def start(self):
        """What the Start button does: ``nvkit.finetune`` with the form's settings, or ``nvkit.launch``
        over N processes when "run on" says N > 1 (through a Launch panel shown below the form)."""
        if self.run_on.value > 1:
            if self.eval_source.value != "none":
                # nvkit.launch's training program has no evaluation loop: say so rather than drop it
                self.status.value = why_html("Evaluation runs in this kernel only: set Eval to off to run on "
                                             f"{self.run_on.value} processes, or run here to evaluate.")
                return None
            if self.launch_view is None:
                from .launch_panel import LaunchPanel
                self.launch_view = LaunchPanel(session=self._session, source=self)
                self.chart_box.children = [self.launch_view]
            self.launch_view.nproc.value = self.run_on.value
            return self.launch_view.start()
        return self._begin({})

    def _begin(self, extra: dict):
        if self.run is not None and not self.run.done:
            self.status.value = "<span class='nvkit-error'>A run is in progress: Stop it first.</span>"
            return None
        if self.preview_job is not None:
            # one user of the tokenizer at a time: a preview clicked just before ends first
            self.preview_job.wait_done(60)
        s = self._current_session()
        chart = self.chart
        try:
            if s is None:
                raise NvkitError("No model is loaded: load one first (Model tab, or s = nvkit.load('demo')).")
            from .. import finetune
            # the trainer's thread imports pandas, and the chart checks values against it: whole
            # before the thread starts (live.plotly_ready says why)
            live.plotly_ready()
            if chart is None:
                # made (in the main thread, once) before the run starts: a FigureWidget's first
                # build loads plotly's validators, memory a CPU run's measurement would count
                from .memory_chart import MemoryChart
                chart = MemoryChart(x="step")
            run = finetune(s, self.data(), **{**self.settings(), **extra})
        except NvkitError as e:
            if chart is not None and chart is not self.chart:
                chart.close()
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(e))}</span>"
            return None
        self.run = run
        self._refresh_estimate()  # the run's own prediction, the one its summary measures against
        self.summary.value = ""
        self.status.value = self._status_line(run)
        self.start_btn.disabled = True
        self.resume_btn.disabled = True
        self.stop_btn.disabled = False
        self.progress.value = 0.0
        if self.chart is None:
            self.chart = chart
            self.chart_box.children = [chart]
        self.chart.follow(run)
        live.every(_REFRESH_S, lambda: self._tick(run), owner=self)
        return run

    @classmethod
    def _status_line(cls, run) -> str:
        i = run.info
        head = html.escape(f"Training {counted(run.total_steps, 'step')} · {i['precision']} · "
                           f"loss: {i.get('loss', 'model loss')}")
        if i.get("resumed_from"):
            head = html.escape(f"Resuming at step {run.first_step} from {i['resumed_from']} · ") + head
        return f"{head} · {cls._decisions(run)}"

    @staticmethod
    def _decisions(run) -> str:
        """Liger and compile on or off in a word each, both reasons behind one "why" (one
        fold-out: two on a line would not stay on it)."""
        i = run.info
        liger, comp = str(i.get("liger") or "off"), str(i.get("compile_reason") or "off")
        short = f"Liger {first_sentence(liger, 30)} · compile {first_sentence(comp, 30)}"
        full = f"Liger {' '.join(liger.split())}. Compile {' '.join(comp.split())}"
        return (f"<details class='nvkit-why' title='{html.escape(full, quote=True)}'><summary>{html.escape(short)} "
                f"<u>why</u></summary>{html.escape(full)}</details>")

    def resume(self):
        """What the Resume button does: the form's run again with ``resume=True`` in the last run's
        folder, so it continues from that run's latest checkpoint (optimizer, schedule, data order
        and step count); ``steps`` is the total."""
        last = self.run
        if last is None or not last.done:
            why = ("Nothing to resume: start a run first; Stop (or save_every) leaves a checkpoint to continue from."
                   if last is None else "A run is in progress: Stop it first.")
            self.status.value = why_html(why)
            return None
        return self._begin({"resume": True, "output_dir": last.info["output_dir"]})

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
        # the buttons come back last: once Start is enabled, the summary, the suggested export
        # folder and the code all describe the run that ended (a quick Export reads them)
        try:
            self._show_finished(run)
        finally:
            self.stop_btn.disabled = True
            self.resume_btn.disabled = not run.checkpoints
            self.start_btn.disabled = False

    def _show_finished(self, run):
        if run.error is not None:
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(run.error))}</span>"
            return
        sm = run.summary()
        self.progress.value = 1.0 if not run.stopped else self.progress.value
        self.status.value = ("Stopped by the user." if run.stopped else "Done.") + " · " + self._decisions(run)
        cpu = str(run.info.get("device", "")).startswith("cpu")
        peak = fmt_bytes(sm["peak_memory"]) + (" (the whole process's RSS)" if cpu else "")
        rows = [("time", f"{sm['seconds']:.1f} s"), ("steps", str(sm["steps"])),
                ("tokens/s", f"{sm['tokens_per_s']:.0f}"), ("peak memory", peak), *self._estimate_row(run),
                ("final loss", f"{sm['final_loss']:.4f}" if sm["final_loss"] is not None else "n/a"),
                *self._eval_rows(sm), ("adapter", sm["adapter_dir"] or "not saved")]
        if not self.export_dir.value.strip() and run.info.get("output_dir"):
            self.export_dir.value = os.path.join(run.info["output_dir"], "export")
        self.summary.value = "<table class='nvkit-table'>" + "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"
        self.code_view.refresh()

    @staticmethod
    def _estimate_row(run) -> list:
        """The run's prediction beside what it predicted (``nvkit.memory.comparisons``), in words."""
        from .. import memory
        from .memory_chart import compare_phrase
        mine = [c for c in memory.comparisons(frame=False) if c.what == "train" and c.t_start >= run.t0 - 1.0]
        return [("memory estimate", compare_phrase(mine[-1]))] if mine and mine[-1].predicted is not None else []

    @staticmethod
    def _eval_rows(sm: dict) -> list:
        """Summary rows for the evaluation, why the run ended early and where it can resume."""
        rows = []
        if sm.get("eval_loss_before") is not None:
            after = sm.get("eval_loss_after")
            rows.append(("eval loss", f"{sm['eval_loss_before']:.4f} before → {after:.4f} after "
                                      f"(perplexity {sm['eval_perplexity_before']:.2f} → "
                                      f"{sm['eval_perplexity_after']:.2f})"))
        if sm.get("stop_reason"):
            rows.append(("ended early", sm["stop_reason"]))
        if sm.get("checkpoint"):
            rows.append(("checkpoint", f"{sm['checkpoint']} (Resume continues from it)"))
        return rows

    # --- preview and export ----------------------------------------------------------------------
    def preview(self):
        """What the Preview button does: ``nvkit.data.preview`` of the form's data with the loaded
        model's tokenizer, shown in the panel (escaped: the rows are the user's text). It reads
        and tokenizes every row (for the totals), so it runs in a worker thread: returns the Job
        (``await panel.preview()``; its result is the Preview), or None when it cannot start (the
        reason is shown)."""
        if self.preview_job is not None and not self.preview_job.settled:
            return self.preview_job
        self._preview_seq += 1
        seq = self._preview_seq
        s = self._current_session()
        try:
            if s is None:
                raise NvkitError("Load a model first: the preview uses its tokenizer and chat template.")
            data = self.data()
        except NvkitError as e:
            self._show_preview(why_html(str(e), prefix="No preview: "))
            return None
        kw = dict(seq_len=int(self.seq_len.value), n=PREVIEW_ROWS, batch_size=int(self.batch.value),
                  grad_accum=int(self.accum.value))
        self.preview_btn.disabled = True
        self._show_preview("<span class='nvkit-muted'>Reading and tokenizing the data…</span>")

        def work(job):
            # the worker sets the widgets before it ends, so whoever waits on the job sees them
            from ..train.data import preview
            try:
                pv = preview(data, s, **kw)
            except BaseException as e:
                if seq == self._preview_seq:
                    msg = str(e) if isinstance(e, NvkitError) else f"{type(e).__name__}: {e}"
                    self._show_preview(why_html(msg, prefix="No preview: "))
                raise
            finally:
                self.preview_btn.disabled = False
            if seq == self._preview_seq:
                self._show_preview(pv._repr_html_(), pv)
            return pv

        self.preview_job = run_in_worker(work, name="nvkit-preview")
        return self.preview_job

    def _show_preview(self, value: str, pv=None) -> None:
        self.last_preview = pv
        self.preview_html.value = value
        self.preview_box.layout.display = None

    def _clear_preview(self) -> None:
        self._preview_seq += 1
        if self.preview_box.layout.display != "none":
            self.preview_box.layout.display = "none"
            self.preview_html.value = ""
        self.last_preview = None

    def export(self):
        """What the Export button does: ``s.export(folder, merge=...)`` in a worker thread; returns
        the Job (None when refused: the reason is shown on one line)."""
        if self.export_job is not None and not self.export_job.settled:
            return self.export_job
        s = self._current_session()
        folder, merge = self.export_dir.value.strip(), bool(self.export_merge.value)
        try:
            if s is None:
                raise NvkitError("No model is loaded: load one (and fine-tune it) first.")
            if not folder:
                raise NvkitError("Choose a folder to export into: a new or empty one (nvkit never writes into a "
                                 "folder it did not make).")
            if self.run is not None and not self.run.done:
                raise NvkitError("A run is in progress: wait for it or Stop it first.")
        except NvkitError as e:
            self.export_status.value = why_html(str(e), prefix="Not exported: ")
            return None
        what = "the merged model" if merge else "the adapter"
        self.export_btn.disabled = True
        self.export_status.value = f"Exporting {what} to {html.escape(folder)}…"

        def work(job):
            # the worker sets the widgets before it ends, so whoever waits on the job sees them
            try:
                out = s.export(folder, merge=merge)
            except BaseException as e:
                msg = str(e) if isinstance(e, NvkitError) else f"{type(e).__name__}: {e}"
                self.export_status.value = why_html(msg, prefix="Not exported: ")
                raise
            finally:
                self.export_btn.disabled = False
            parts = "weights" if merge else "adapter"
            self.export_status.value = (f"Exported {what} to <b>{html.escape(str(out))}</b> "
                                        f"<span class='nvkit-muted'>({parts}, tokenizer, generation config, "
                                        "README model card)</span>")
            return out

        self.export_job = run_in_worker(work, name="nvkit-export")
        return self.export_job

    def close(self):
        live.stop_every(self)
        if self.launch_view is not None:
            self.launch_view.close()
        if self.chart is not None:
            self.chart.close()
        super().close()
