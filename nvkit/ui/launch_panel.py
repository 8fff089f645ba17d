"""``nvkit.LaunchPanel()``: the Launch tab — a LoRA fine-tune over several GPUs (or CPU processes),
a view over ``nvkit.launch``.

The GPUs are the ones chosen in the GPUs tab (``nvkit.select_gpus``; a choice waiting for a
restart counts, since the launched processes start fresh). Where this torch has no CUDA the run
goes to CPU processes over gloo whatever NVML lists (``NVKIT_FAKE_GPUS`` fakes that list, not
CUDA), and the tab says so. The strategy list says what each one does and needs, with every
strategy's per-GPU memory estimate side by side (``nvkit.estimate`` split the way the strategy
splits the model, for the batches the examples make) and which of them fit the chosen GPUs; on
the CPU the figures are per process: the RSS each process's run adds, its model included, which
is what CPU ranks report. The line the run will execute is shown as it changes (torchrun or
``accelerate launch``). Start calls
``nvkit.launch`` (processes outside the kernel; it returns at once), the chart draws every rank's
loss and memory per step from the lines the ranks print, Stop ends the whole process group after
the current step (adapter saved), and the summary puts each rank's measured peak beside the
estimate, with the adapter and a button that loads it into the session.

Made with ``source=`` a Fine-tune panel, it takes the data and the LoRA/training settings from
that panel (its "run on N GPUs" choice) and shows only the launch's own controls.
"""

from __future__ import annotations

import html
import math

import ipywidgets as w
import numpy as np

from ..checks import env_set
from ..errors import NvkitError
from ..hardware.inventory import FAKE_ENV
from ..train import strategies as strat
from ..train.data import parse_examples
from ..units import counted, fmt_bytes
from . import live
from .common import (CodeToggle, current_session, danger_while_enabled, observe_values, off_events, on_events, root,
                     style, why_html, wrap_row)

_REFRESH_S = 0.25
_EXAMPLES = "\n".join([
    '{"prompt": "What does DDP replicate?", "response": "The whole model, on every GPU."}',
    '{"prompt": "What does FSDP2 shard?", "response": "Parameters, gradients and optimizer state."}',
    '{"prompt": "What does tensor parallelism cut?", "response": "Every weight matrix, across the GPUs."}',
    '{"prompt": "Which backend do GPUs use?", "response": "NCCL, and gloo on the CPU."}',
])
_COLORS = ["#76b900", "#1f77b4", "#ff7f0e", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22"]
_PRED_COLOR = "#d62728"
MAX_RANKS_DRAWN = 8


def chosen_gpus() -> tuple[list, str]:
    """(the GPUs a launch would use, in words) from the GPU selection, read with NVML; none when
    this torch has no CUDA, since the launched processes then train on the CPU (``nvkit.launch``
    decides the same way)."""
    from ..hardware.inventory import gpus
    from ..hardware.selection import requested
    sel = requested()
    every = gpus()
    if sel.choice == ():
        return [], "CPU processes over gloo (the GPUs tab chose no GPU)"
    chosen = every if sel.choice is None else [g for i in sel.choice for g in every if g.index == i]
    if not chosen:
        return [], "CPU processes over gloo (no GPU here)"
    names = ", ".join(f"{g.index} ({g.name}, {fmt_bytes(g.memory_total)})" for g in chosen)
    import torch
    if not torch.cuda.is_available():
        fake = f" {FAKE_ENV} fakes that list (NVML's), not CUDA." if env_set(FAKE_ENV) else ""
        return [], (f"CPU processes over gloo: this torch has no CUDA, so the GPU{'s' if len(chosen) > 1 else ''} "
                    f"the GPUs tab lists ({names}) {'are' if len(chosen) > 1 else 'is'} not used.{fake}")
    return chosen, f"GPU{'s' if len(chosen) > 1 else ''} {names}, from the GPUs tab"


class RankChart(live.LiveChart):
    """Loss (above) and memory (below) per step, one line per rank of a ``LaunchRun``, with the
    predicted per-GPU peak as a dashed line. Made with every trace at once for ``ranks`` ranks.
    ``cpu``: the ranks are CPU processes, whose memory is the RSS their run adds, model included
    (what the per-process estimate predicts), not a GPU's."""

    def __init__(self, ranks: int, cpu: bool = False):
        import plotly.graph_objects as go
        self.n = max(1, min(int(ranks), MAX_RANKS_DRAWN))
        self.cpu = bool(cpu)
        self.run = None
        self.predicted: int | None = None
        self._seen = -1
        traces = []
        for r in range(self.n):
            c = _COLORS[r % len(_COLORS)]
            traces.append(go.Scatter(x=[], y=[], mode="lines+markers", name=f"rank {r} loss", yaxis="y2",
                                     legendgroup=f"r{r}", line=dict(color=c, width=2), marker=dict(size=4)))
            traces.append(go.Scatter(x=[], y=[], mode="lines", name=f"rank {r} memory", legendgroup=f"r{r}",
                                     line=dict(color=c, width=2, dash="dot")))
        predicted = ("predicted per process (the table's figure)" if cpu else
                     "predicted peak per GPU in PyTorch (the table's figure less the CUDA context)")
        traces.append(go.Scatter(x=[], y=[], mode="lines", name=predicted,
                                 line=dict(color=_PRED_COLOR, width=2, dash="dashdot")))
        layout = dict(height=380, margin=dict(l=72, r=20, t=36, b=40), template="plotly_white",
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
                      title=dict(text="Launched run: loss and memory per rank", x=0.01, font=dict(size=14)),
                      xaxis=dict(title=dict(text="training step"), anchor="y"),
                      yaxis=dict(title=dict(text="process memory added (GiB)" if cpu else "memory (GiB)"),
                                 domain=[0, 0.56], rangemode="tozero"),
                      yaxis2=dict(domain=[0.64, 1], anchor="x", title=dict(text="loss"), rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.2, x=0, font=dict(size=11)), hovermode="closest",
                      uirevision="nvkit", showlegend=True)
        fig = live.figure(traces, layout)
        self.status = w.HTML("")
        self.status.add_class("nvkit-launch-chart-status")
        super().__init__(fig, [self.status])
        self.add_class("nvkit-launch-chart")

    def follow(self, run, predicted: int | None = None) -> "RankChart":
        with self._draw_lock:
            self.run, self.predicted, self._seen = run, predicted, -1
            self._dirty = True
        self.start()
        live.ticker.wake()
        return self

    def collect(self) -> bool:
        if self.run is None:
            return False
        n = len(self.run.history)
        if n == self._seen:
            return False
        self._seen = n
        return True

    def series(self) -> dict:
        """rank → {"loss": (steps, values), "memory": (steps, bytes)} from the run's history."""
        run = self.run
        out: dict = {}
        if run is None:
            return out
        for key, event, name in (("loss", "log", "loss"), ("memory", "step", "peak_memory")):
            for rank, pts in run.per_rank(name, event).items():
                pts = [(s, v) for s, v in pts if isinstance(s, int) and isinstance(v, (int, float))]
                out.setdefault(rank, {})[key] = (np.array([p[0] for p in pts], dtype=np.float64),
                                                 np.array([p[1] for p in pts], dtype=np.float64))
        return out

    def draw(self) -> bool:
        data = self.series()
        gib = float(2**30)
        last = 0.0
        with self.figure.batch_update():
            for r in range(self.n):
                d = data.get(r, {})
                xs, ys = d.get("loss", (np.zeros(0), np.zeros(0)))
                self.figure.data[2 * r].x, self.figure.data[2 * r].y = xs, np.round(ys, 5)
                mx, my = d.get("memory", (np.zeros(0), np.zeros(0)))
                self.figure.data[2 * r + 1].x, self.figure.data[2 * r + 1].y = mx, np.round(my / gib, 4)
                if len(mx):
                    last = max(last, float(mx[-1]))
            pred = self.figure.data[2 * self.n]
            if self.predicted and last:
                pred.x, pred.y = np.array([1.0, last]), np.array([self.predicted / gib] * 2)
            else:
                pred.x, pred.y = np.zeros(0), np.zeros(0)
        ranks = sorted(data)
        text = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''} reporting"
        if len(ranks) > self.n:
            text += f" (the first {self.n} drawn)"
        if self.status.value != text:
            self.status.value = text
        return True

    def show_error(self, text: str) -> None:
        self.status.value = f"<span class='nvkit-warn'>not redrawing: {html.escape(text[:200])}</span>"


class LaunchPanel(w.VBox):
    """Fine-tune over several GPUs from a form; ``.run`` is the ``nvkit.LaunchRun``.

    ``source``: a ``FinetunePanel`` whose data and settings to use (its "run on N GPUs" choice)."""

    def __init__(self, session=None, source=None, **kwargs):
        self._session = session
        self._source = source
        self.run = None
        self.chart: RankChart | None = None
        self.rows: list = []          # strat.compare() of the current settings
        self._estimates: dict = {}
        self._run_estimate = None     # the estimate the running (or last) run was started beside
        style_ = {"description_width": "110px"}
        lay = w.Layout(width="220px")

        self.gpus_line = w.HTML("")
        self.gpus_line.add_class("nvkit-launch-gpus")
        self.nproc = w.BoundedIntText(value=2, min=1, max=64, description="processes", style=style_, layout=lay)
        self.strategy = w.Dropdown(options=[(s.title, name) for name, s in strat.STRATEGIES.items()], value="ddp",
                                   description="strategy", style=style_, layout=w.Layout(width="300px"))
        self.strategy.add_class("nvkit-launch-strategy")
        self.about = w.HTML("")
        self.about.add_class("nvkit-launch-about")
        # "none"/"auto", not None: a Dropdown whose value is None shows no selection in the browser
        self.offload = w.Dropdown(options=[("none", "none"), ("optimizer state", "optimizer"),
                                           ("optimizer state and parameters", "all")],
                                  value="none", description="CPU offload", style=style_,
                                  layout=w.Layout(width="330px", display="none"))
        self.launcher = w.ToggleButtons(options=[("torchrun", "torchrun"), ("accelerate launch", "accelerate")],
                                        value="torchrun", description="launcher", style={"button_width": "auto"})
        self.launcher.add_class("nvkit-launch-launcher")
        self.precision = w.Dropdown(options=[("automatic", "auto"), ("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")],
                                    value="auto", description="precision", style=style_, layout=lay)
        # data and training settings (hidden when a Fine-tune panel is the source)
        self.examples = w.Textarea(value=_EXAMPLES, placeholder="one example per line: text, or a JSON object",
                                   description="training data", style=style_,
                                   tooltip='one example per line: text, or a JSON object such as {"prompt": ..., '
                                           '"response": ...}',
                                   layout=w.Layout(width="auto", height="90px"))
        self.examples.add_class("nvkit-launch-examples")
        self.steps = w.BoundedIntText(value=20, min=1, max=1_000_000, description="steps", style=style_, layout=lay)
        self.batch = w.BoundedIntText(value=4, min=1, max=4096, description="batch per GPU", style=style_, layout=lay)
        self.seq_len = w.BoundedIntText(value=128, min=8, max=1_000_000, description="seq len", style=style_, layout=lay)
        self.lr = w.BoundedFloatText(value=2e-4, min=1e-7, max=0.5, step=1e-5, description="learning rate",
                                     style=style_, layout=lay)
        self.r = w.BoundedIntText(value=16, min=1, max=1024, description="LoRA r", style=style_, layout=lay)
        own = w.VBox([self.examples, wrap_row([self.steps, self.batch, self.seq_len]),
                      wrap_row([self.lr, self.r, self.precision])])
        if source is not None:
            own.layout.display = "none"
        self.own_settings = own

        self.estimates = w.HTML("")
        self.estimates.add_class("nvkit-launch-estimates")
        self.line = w.HTML("")
        self.line.add_class("nvkit-code")
        self.line.add_class("nvkit-launch-line")
        self.start_btn = w.Button(description="Start", button_style="success", icon="play")
        self.start_btn.add_class("nvkit-launch-start")
        self.start_btn.on_click(lambda _b: self.start())
        self.stop_btn = danger_while_enabled(w.Button(description="Stop all ranks", icon="stop", disabled=True))
        self.stop_btn.add_class("nvkit-launch-stop")
        self.stop_btn.on_click(lambda _b: self.stop())
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="240px"))
        self.progress.add_class("nvkit-launch-progress")
        self.progress_label = w.HTML("")
        self.status = w.HTML("")
        self.status.add_class("nvkit-launch-status")
        self.summary = w.HTML("")
        self.summary.add_class("nvkit-launch-summary")
        self.load_btn = w.Button(description="Load the adapter into the session", icon="download",
                                 layout=w.Layout(display="none"))
        self.load_btn.add_class("nvkit-launch-load-adapter")
        self.load_btn.on_click(lambda _b: self.load_adapter())
        self.chart_box = w.VBox([w.HTML("<span class='nvkit-muted'>Every rank's loss and memory per step appear "
                                        "here when a run starts.</span>")])
        self.chart_box.add_class("nvkit-launch-chart-box")
        self.code_view = CodeToggle(self.code)

        # the examples set the batches' length, so the estimates follow them too
        observe_values((self.strategy, self.offload, self.nproc, self.batch, self.seq_len, self.r, self.precision,
                        self.examples), self._refresh)
        observe_values((self.launcher, self.steps, self.lr), self._refresh_line)
        super().__init__(children=[
            style(), self.gpus_line, wrap_row([self.nproc, self.strategy, self.offload]), self.about,
            wrap_row([self.launcher]), own, self.estimates, self.line,
            wrap_row([self.start_btn, self.stop_btn, self.progress, self.progress_label]),
            self.status, self.chart_box, self.summary, self.load_btn, self.code_view,
        ], **kwargs)
        self.add_class("nvkit-launch-panel")
        root(self)
        self._read_gpus()
        self._refresh()
        on_events(self._on_event)

    # --- what the form says -----------------------------------------------------------------------
    def _current_session(self):
        if self._session is not None and getattr(self._session, "model", None) is not None:
            return self._session
        return current_session()

    def _read_gpus(self) -> None:
        try:
            self.gpus, words = chosen_gpus()
        except Exception as e:  # noqa: BLE001 - no NVML: say so, the launch still works on the CPU
            self.gpus, words = [], f"CPU processes over gloo (the GPUs could not be read: {type(e).__name__})"
        self.gpus_line.value = f"<b>Runs on</b> {html.escape(words)}"
        self.nproc.value = len(self.gpus) or 2

    def _on_event(self, ev) -> None:
        if ev.kind in ("select", "load", "unload"):
            if ev.kind == "select":
                self._read_gpus()
            self._refresh()

    def settings(self) -> dict:
        """The settings Start passes to ``nvkit.launch`` (config keys and keywords), without data."""
        if self._source is not None:
            kw = dict(self._source.settings())
            kw.pop("output_dir", None)
        else:
            kw = dict(lora=dict(r=self.r.value, alpha=2 * self.r.value, dropout=0.05, target_modules="all-linear"),
                      max_steps=self.steps.value, learning_rate=self.lr.value, batch_size=self.batch.value,
                      seq_len=self.seq_len.value)
        if self._source is None and self.precision.value != "auto":
            kw["precision"] = self.precision.value
        return kw

    def launch_kwargs(self) -> dict:
        kw = dict(nproc_per_node=self.nproc.value, strategy=self.strategy.value, launcher=self.launcher.value)
        if self.offload.value != "none" and self.strategy.value in ("zero2", "zero3"):
            kw["offload"] = self.offload.value
        if not self.gpus:
            kw["gpus"] = []
        return kw

    def data(self):
        if self._source is not None:
            return self._source.data()
        return parse_examples(self.examples.value)

    def code(self) -> str:
        settings = self.settings()
        try:
            rows = self.data() if self._source is None else None
        except NvkitError:
            rows = []
        if rows is None:
            data_src = "data = ...  # the Fine-tune tab's examples or file\n"
        else:
            data_src = "data = [\n" + "".join(f"    {r!r},\n" for r in rows) + "]\n"
        cfg = ", ".join(f"{k!r}: {v!r}" for k, v in settings.items())
        args = ", ".join(f"{k}={v!r}" for k, v in self.launch_kwargs().items())
        return ("import nvkit\n" + data_src +
                f"config = {{'data': data, {cfg}}}  # the model: the session's (nvkit.load)\n"
                f"run = nvkit.launch(config, {args})\n"
                "print(run.command)\n"
                "await run  # or run.result(); run.stop() ends every rank after the current step\n"
                "run.summary(), run.adapter_dir\n")

    # --- strategy text, estimates, the line --------------------------------------------------------
    def _refresh(self) -> None:
        s = strat.STRATEGIES[self.strategy.value]
        self.offload.layout.display = None if s.name in ("zero2", "zero3") else "none"
        if s.name == "zero2" and self.offload.value == "all":
            self.offload.value = "optimizer"
        self.about.value = "".join(f"<div>{why_html(text, 90, prefix=label)}</div>" for label, text in
                                   (("What it does: ", s.what), ("Needs: ", s.needs), ("When: ", s.when)))
        self._refresh_estimates()
        self._refresh_line()

    def _refresh_line(self) -> None:
        from ..train.launch import launch_line
        try:
            kw = self.launch_kwargs()
            line = launch_line(kw["nproc_per_node"], launcher=kw["launcher"],
                               **({"gpus": kw["gpus"]} if "gpus" in kw else {}))
            text = f"$ {line}"
        except Exception as e:  # noqa: BLE001 - a half-filled form: say what is missing
            text = f"# {type(e).__name__}: {e}"
        value = f"<pre>{html.escape(text)}</pre>"
        if self.line.value != value:
            self.line.value = value
        self.code_view.refresh()

    @property
    def gpu_memory(self) -> int | None:
        """Bytes of the smallest chosen GPU (None on the CPU): what a strategy's estimate must fit."""
        return min(g.memory_total for g in self.gpus) if self.gpus else None

    def _refresh_estimates(self) -> None:
        s = self._current_session()
        if s is None:
            self.rows, self._estimates = [], {}
            self.estimates.value = ("<span class='nvkit-muted'>Load a model first (Model tab or nvkit.load): the "
                                    "launched run trains the session's model, with its attention backend, "
                                    "quantization and kernels.</span>")
            return
        settings = self.settings()
        try:
            q = s.quantization if isinstance(s.quantization, str) else None
            batch, tokens, bound = self._batch_shape(s, settings)
            lora = settings.get("lora") or {}
            kw = dict(dtype=str(s.dtype).replace("torch.", ""), quantization=q, batch_size=batch, seq_len=tokens,
                      lora_r=int(lora.get("r", 16)), lora_dropout=float(lora.get("dropout", 0.05)),
                      gradient_checkpointing=bool(settings.get("gradient_checkpointing", False)),
                      device="cuda" if self.gpus else "cpu")
            mem = self.gpu_memory
            self.rows = strat.compare(s.model.config, self.nproc.value, mem, **kw)
            if self.offload.value != "none" and self.strategy.value in ("zero2", "zero3"):
                for row in self.rows:
                    if row["strategy"] == self.strategy.value and row["estimate"] is not None:
                        row["estimate"] = strat.per_gpu_estimate(s.model.config, row["strategy"], self.nproc.value,
                                                                 offload=self.offload.value, **kw)
                        row["fits"] = row["estimate"].total <= mem if mem else None
            self._estimates = {r["strategy"]: r["estimate"] for r in self.rows}
        except Exception as e:  # noqa: BLE001 - an estimate must never block starting a run
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.rows, self._estimates = [], {}
            self.estimates.value = f"<span class='nvkit-muted'>No estimate: {html.escape(msg)}</span>"
            return
        what = ("<b>Per-GPU memory</b>" if self.gpus else
                "<b>Per-process memory</b> (CPU: the RSS each process's run adds, its model included)")
        shape = f"batches of {batch} × {'at most ' if bound else ''}{tokens} tokens"
        head = (f"{what} for {html.escape(s.model_id)} on {self.nproc.value} "
                f"process{'es' if self.nproc.value != 1 else ''}, {html.escape(shape)}"
                + (f" (each GPU: {html.escape(fmt_bytes(self.gpu_memory))})" if self.gpu_memory else "") + ":")
        cells = []
        for r in self.rows:
            mark = "▶ " if r["strategy"] == self.strategy.value else ""
            if r["estimate"] is None:
                verdict = why_html(r["why_not"] or "", 60, prefix="not here: ")
                size = "–"
            else:
                size = html.escape(fmt_bytes(r["estimate"].total))
                verdict = ("<span class='nvkit-ok'>fits</span>" if r["fits"] else
                           "<span class='nvkit-error'>too big</span>" if r["fits"] is False else "")
                if r["missing"]:
                    verdict += " " + why_html(r["missing"], 50, prefix="")
            cells.append(f"<tr><td>{mark}<b>{html.escape(r['title'])}</b></td><td>{size}</td><td>{verdict}</td></tr>")
        advice = html.escape(strat.advice(self.rows, self.gpu_memory) if self.gpus else
                             "On the CPU each process holds a whole copy of the model (DDP over gloo), in the "
                             "machine's memory: the figure is what each process's run adds to it.")
        self.estimates.value = (f"{head}<table class='nvkit-table'>{''.join(cells)}</table>"
                                f"<span class='nvkit-muted'>{advice}</span>")

    def _batch_shape(self, s, settings: dict) -> tuple[int, int, bool]:
        """(batch per process, tokens per row, whether that is only the bound) of the batches the
        launched ranks will train on: from the rows of the form's examples, shared out over the
        processes, as the run folder will hold them; for a data file (read when the run starts)
        or examples that do not read, rows of ``seq len`` tokens."""
        from ..train import data as train_data
        batch, seq_len = int(settings.get("batch_size", 8)), int(settings.get("seq_len", 512))
        try:
            data = self.data()
        except NvkitError:
            data = None
        if not isinstance(data, list) or not data:
            return batch, seq_len, True
        try:
            rows, _ = train_data.prepare(data, s.tokenizer, seq_len, settings.get("packing", "auto"))
        except NvkitError:
            return batch, seq_len, True
        per_rank = math.ceil(len(rows) / max(1, int(self.nproc.value)))
        # the ranks' collator pads each batch to a multiple of 8 (nvkit.train.worker)
        return max(1, min(batch, per_rank)), max(1, train_data.batch_length(rows, 8)), False

    # --- actions (main thread; they only start or signal work) ---------------------------------------
    def start(self):
        """What Start does: ``nvkit.launch`` with the form's settings; returns the LaunchRun (None on
        a refusal, whose reason the status line shows)."""
        if self.run is not None and not self.run.done:
            self.status.value = "<span class='nvkit-error'>A run is in progress: Stop it first.</span>"
            return None
        try:
            s = self._current_session()
            if s is None:
                raise NvkitError("No model is loaded: load one first (Model tab, or s = nvkit.load('demo')).")
            from ..train.launch import launch
            live.plotly_ready()
            run = launch({"data": self.data(), **self.settings()}, **self.launch_kwargs())
        except NvkitError as e:
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(e))}</span>"
            return None
        self.run = run
        self.summary.value = ""
        self.load_btn.layout.display = "none"
        notes = "; ".join(run.notes)
        self.status.value = html.escape(f"Running {counted(run.total_steps, 'step')} on {counted(self.nproc.value, 'process', 'processes')} · "
                                        f"{strat.STRATEGIES[run.strategy].title} via {run.launcher}"
                                        + (f" · {notes}" if notes else ""))
        self.start_btn.disabled = True
        self.stop_btn.disabled = False
        self.progress.value = 0.0
        self._refresh_estimates()  # of the data and settings this run took (a Fine-tune tab's may have changed)
        est = self._run_estimate = self._estimates.get(run.strategy)  # the summary's, whatever changes meanwhile
        cpu = not self.gpus
        if self.chart is None or self.chart.n != min(self.nproc.value, MAX_RANKS_DRAWN) or self.chart.cpu != cpu:
            if self.chart is not None:
                self.chart.close()
            self.chart = RankChart(self.nproc.value, cpu=cpu)
            self.chart_box.children = [self.chart]
        # GPU ranks report PyTorch's peak, so their line is the estimate less the CUDA context; CPU
        # ranks report what the estimate predicts (the RSS their run adds), so theirs is the table's
        self.chart.follow(run, est.total - est.parts.get("CUDA context", 0) if est is not None else None)
        live.every(_REFRESH_S, lambda: self._tick(run), owner=self)
        return run

    def stop(self):
        if self.run is not None and not self.run.done:
            self.run.stop()
            self.status.value = "Stopping every rank after the current step; the adapter will be saved."

    def load_adapter(self):
        s = self._current_session()
        if self.run is None or s is None:
            return
        try:
            s.load_adapter(self.run.adapter_dir)
            self.status.value = html.escape(f"Adapter loaded into {s.model_id}: {self.run.adapter_dir}")
        except NvkitError as e:
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(e))}</span>"

    # --- progress (the shared live thread; sets values only) -----------------------------------------
    def _tick(self, run) -> None:
        if run is not self.run:
            return
        p = run.progress
        frac = min(1.0, p["step"] / p["total"]) if p["total"] else 0.0
        if abs(self.progress.value - frac) > 1e-9:
            self.progress.value = frac
        logs = [r for r in run.history if r.get("event") == "log" and r.get("rank") == 0]
        loss = f" · loss {logs[-1]['loss']:.4f}" if logs and isinstance(logs[-1].get("loss"), float) else ""
        label = html.escape(f"step {p['step']}/{p['total']}{loss} · ranks {run.ranks}")
        if self.progress_label.value != label:
            self.progress_label.value = label
        if run.done:
            live.stop_every(self)
            if self.chart is not None:
                self.chart.refresh()
            self._finish(run)

    def _finish(self, run):
        # the buttons come back last: once Start is enabled, the status, the summary and the
        # Load button all describe the run that ended
        try:
            self._show_finished(run)
        finally:
            self.stop_btn.disabled = True
            self.start_btn.disabled = False

    def _show_finished(self, run):
        if run.error is not None:
            self.status.value = f"<span class='nvkit-error'>{html.escape(str(run.error)[-2000:])}</span>"
            return
        sm = run.summary()
        self.status.value = "Stopped by the user (every rank, after the same step)." if run.stopped else "Done."
        est = self._run_estimate
        rows = [("strategy", f"{strat.STRATEGIES[run.strategy].title} via {run.launcher}"),
                ("steps", str(sm["steps"])),
                ("steps/s", f"{sm['steps_per_s']:.2f}" if sm["steps_per_s"] else "n/a"),
                ("final loss", f"{sm['final_loss']:.4f}" if isinstance(sm["final_loss"], float) else "n/a")]
        for rank, peak in sm["peak_memory"].items():
            beside = ""
            if est is not None and self.gpus:
                ctx = est.parts.get("CUDA context", 0)
                beside = f" · estimate {fmt_bytes(est.total - ctx)} (+ {fmt_bytes(ctx)} CUDA context outside PyTorch)"
            elif est is not None:
                beside = f" · estimate {fmt_bytes(est.total)}"
            what = "PyTorch peak" if self.gpus else "CPU: the RSS the rank's run added, its model included"
            rows.append((f"rank {rank} peak memory", f"{fmt_bytes(peak)} ({what}){beside}"))
        rows.append(("adapter", sm["adapter_dir"] or "not saved"))
        self.summary.value = "<table class='nvkit-table'>" + "".join(
            f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"
        if sm["adapter_dir"] and self._current_session() is not None:
            self.load_btn.layout.display = None
        self.code_view.refresh()

    def close(self):
        live.stop_every(self)
        off_events(self._on_event)
        if self.chart is not None:
            self.chart.close()
        super().close()
