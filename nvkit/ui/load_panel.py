"""``nvkit.LoadPanel()``: the Model tab: what to load and how, the memory estimate before
loading, Load/Unload with progress, and what was actually loaded.

A thin view over ``nvkit.load`` / ``attention_backends`` / ``quantization_methods``: unavailable
backends and quantizations are shown disabled with a one-line reason (the whole reason folds out
behind "why"); attention "auto" (``nvkit.load``'s default: the best backend that works here and
that the model class supports) comes first and is chosen until another is, and after a load the
summary says which backend it picked. ``.code()`` is the call the panel makes. Loading runs in a
worker thread;
callbacks only start jobs and the worker sets values. A model loaded anywhere else (a cell, the
magic, another panel) shows up here too: the panel follows nvkit's load/unload events.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ..errors import NvkitError
from ..model import imports
from ..units import fmt_bytes
from ..threads import run_in_worker
from .common import CodeToggle, current_session, observe_values, on_events, root, soon, style, why_html, wrap_row

DTYPES = ("auto", "bfloat16", "float16", "float32")
# Dropdown values are strings: a None value renders as a blank dropdown in the browser.
DEVICE_MAPS = (("default (cuda if present)", "default"), ("cuda", "cuda"), ("auto (split over GPUs)", "auto"),
               ("cpu", "cpu"))
_WIDE = {"description_width": "initial"}
AUTO_WHY = ("nvkit.load's default: the best backend that works here and that the model's class supports "
            "(sdpa, or what the class supports instead); the summary says which after loading")


def auto_target(device_map: str, dtype: str) -> tuple[str, str, str]:
    """(device type, dtype, how it was decided) that ``nvkit.load`` would use, decided without
    starting CUDA (NVML for the GPUs, torch's build for CUDA support), so a GPU selection made
    afterwards still counts."""
    from .. import memory
    if device_map == "cpu":
        device = "cpu"
        why = "device_map='cpu'"
    else:
        import torch
        gpus = memory.visible_gpus()
        if gpus and torch.backends.cuda.is_built():
            device, why = "cuda", f"{gpus[0].label} is visible"
        else:
            device = "cpu"
            why = "no GPU visible" if not gpus else "this torch is a CPU build"
    if dtype != "auto":
        return device, dtype, why
    if device == "cpu":
        return device, "float32", f"{why}; 'auto' is float32 on the CPU"
    from ..hardware.inventory import gpus as inventory
    phys = memory.visible_gpus()[0].index
    cap = next((g.capability for g in inventory(processes=False) if g.index == phys), None)
    if cap and cap >= (8, 0):
        return device, "bfloat16", f"{why}; 'auto' is bfloat16 from Ampere (cc 8.0) on"
    return device, "float16", f"{why}; 'auto' is float16 before Ampere"


class LoadPanel(w.VBox):
    def __init__(self, model: str = "demo", device=None):
        from .. import attention_backends, quantization_methods
        self.backends = attention_backends(device)
        self.quants = quantization_methods(device)
        self.model = w.Combobox(value=model, options=["demo"], placeholder="demo, a Hub id or a local directory",
                                description="model", ensure_option=False,
                                layout=w.Layout(width="420px", max_width="100%"))
        self.model.add_class("nvkit-load-model")
        self.dtype = w.Dropdown(options=DTYPES, value="auto", description="dtype", layout=w.Layout(width="200px"))
        self.dtype.add_class("nvkit-load-dtype")
        self.device_map = w.Dropdown(options=DEVICE_MAPS, value="default", description="device map", style=_WIDE,
                                     layout=w.Layout(width="300px"))
        self.device_map.add_class("nvkit-load-device-map")
        # One toggle per backend (ipywidgets can't disable single options of a Dropdown), each
        # with its reason on one line.
        self.attn_buttons = {}
        rows = []
        choices = [("auto", True, AUTO_WHY, "")] + \
                  [(c.name, c.available, c.reason, f" ({c.source})" if c.available and c.source != "-" else "")
                   for c in self.backends]
        for name, ok, why, source in choices:
            b = w.ToggleButton(description=name, value=(name == "auto"), disabled=not ok, tooltip=why + source,
                               layout=w.Layout(width="auto", min_width="150px"))
            b.add_class("nvkit-attn-" + name.replace("_", "-"))
            b.observe(self._on_attn, "value")
            self.attn_buttons[name] = b
            note = w.HTML(why_html(why + source, prefix="" if ok else "not available: "),
                          layout=w.Layout(flex="1 1 300px"))
            note.add_class("nvkit-attn-why")
            rows.append(wrap_row([b, note]))
        self.attn_box = w.VBox(rows)
        self.kernels = w.Checkbox(value=False, description="Hub kernels (use_kernels)", indent=False,
                                  layout=w.Layout(width="auto"))
        self.kernels.add_class("nvkit-load-kernels")
        qopts = [("none", "none")] + [(c.name, c.name) for c in self.quants if c.available]
        self.quant = w.Dropdown(options=qopts, value="none", description="quantize", style=_WIDE,
                                layout=w.Layout(width="200px"))
        self.quant.add_class("nvkit-load-quant")
        self.double_quant = w.Checkbox(value=True, description="double quant", indent=False,
                                       layout=w.Layout(width="auto", margin="0 16px 0 8px"))
        self.compute_dtype = w.Dropdown(options=("same as dtype", "bfloat16", "float16", "float32"),
                                        value="same as dtype", description="compute dtype", style=_WIDE,
                                        layout=w.Layout(width="260px"))
        off = [c for c in self.quants if not c.available]
        self.quant_notes = w.HTML("".join(f"<div>{why_html(c.reason, prefix=f'{c.name} not available: ')}</div>"
                                          for c in off))
        self.quant_notes.add_class("nvkit-quant-why")
        self.estimate_html = w.HTML("")
        self.estimate_html.add_class("nvkit-load-estimate")
        self.load_button = w.Button(description="Load", button_style="primary", icon="download")
        self.load_button.add_class("nvkit-load-button")
        self.unload_button = w.Button(description="Unload", icon="eject")
        self.unload_button.add_class("nvkit-unload-button")
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="200px", visibility="hidden"))
        self.status = w.HTML("")
        self.status.add_class("nvkit-load-status")
        self.summary = w.HTML("")
        self.summary.add_class("nvkit-load-summary")
        self.code_view = CodeToggle(self.code)
        self.job = None
        self.error: str | None = None
        self._estimate_seq = 0
        self.load_button.on_click(lambda _: self.load())
        self.unload_button.on_click(lambda _: self.unload())
        observe_values([self.model, self.dtype, self.device_map, self.quant, self.double_quant, self.compute_dtype],
                       self._update_options)
        observe_values(list(self.attn_buttons.values()) + [self.kernels], self.code_view.refresh)
        super().__init__([
            style(),
            wrap_row([self.model, self.dtype, self.device_map]),
            w.HTML("<b>attention</b>"), self.attn_box, self.kernels,
            wrap_row([self.quant, self.double_quant, self.compute_dtype]), self.quant_notes,
            self.estimate_html, wrap_row([self.load_button, self.unload_button, self.progress]), self.status,
            self.summary, self.code_view,
        ])
        self.add_class("nvkit-load-panel")
        root(self)
        self._update_options()
        self._show_session()
        on_events(self._on_event)

    # --- state -----------------------------------------------------------------------------------
    @property
    def attention(self) -> str:
        for name, b in self.attn_buttons.items():
            if b.value:
                return name
        return "auto"

    def _on_attn(self, change):
        if change["new"]:
            for name, b in self.attn_buttons.items():
                if b is not change["owner"] and b.value:
                    b.value = False
        elif not any(b.value for b in self.attn_buttons.values()):
            change["owner"].value = True  # one backend is always chosen

    def select_attention(self, name: str) -> None:
        b = self.attn_buttons.get(name)
        if b is None:
            raise NvkitError(f"Unknown attention backend {name!r}: {', '.join(self.attn_buttons)}.")
        if b.disabled:
            raise NvkitError(f"{name} can't be used here: {b.tooltip}")
        b.value = True

    def _quantization(self):
        q = self.quant.value
        if q == "none":
            return None
        if q == "int8":
            return "int8"
        opts = {}
        if not self.double_quant.value:
            opts["double_quant"] = False
        if self.compute_dtype.value != "same as dtype":
            opts["compute_dtype"] = self.compute_dtype.value
        return {"method": q, **opts} if opts else q

    def kwargs(self) -> dict:
        """The keyword arguments of the nvkit.load call the panel makes (defaults left out)."""
        kw = {}
        if self.dtype.value != "auto":
            kw["dtype"] = self.dtype.value
        if self.device_map.value != "default":
            kw["device_map"] = self.device_map.value
        if self.attention != "auto":  # nvkit.load's default
            kw["attn_implementation"] = self.attention
        if self.kernels.value:
            kw["use_kernels"] = True
        q = self._quantization()
        if q is not None:
            kw["quantization"] = q
        return kw

    def code(self) -> str:
        args = [repr(self.model.value.strip() or "demo")] + [f"{k}={v!r}" for k, v in self.kwargs().items()]
        return "import nvkit\n\ns = nvkit.load(" + ", ".join(args) + ")\nprint(s.summary())\n"

    def _update_options(self):
        four_bit = self.quant.value in ("nf4", "fp4")
        self.double_quant.disabled = not four_bit
        self.compute_dtype.disabled = not four_bit
        self.code_view.refresh()
        self._estimate()

    def _estimate(self):
        self._estimate_seq += 1
        seq = self._estimate_seq
        self.estimate_html.value = "<span class='nvkit-muted'>estimating…</span>"
        # in the main thread once the kernel is free: the first estimate imports torch and
        # transformers (common.soon says why not in a worker)
        soon(lambda: self._estimate_now(seq))

    def _estimate_now(self, seq: int) -> None:
        if seq != self._estimate_seq:  # the form changed meanwhile: a newer estimate is coming
            return
        model, dtype, dm = self.model.value.strip() or "demo", self.dtype.value, self.device_map.value
        q = None if self.quant.value == "none" else self.quant.value
        try:
            from .. import estimate
            device, dt, why = auto_target(dm, dtype)
            e = estimate(model, dtype=dt, quantization=q, mode="inference", device=device)
        except Exception as err:  # an estimate is a help, never a blocker
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            self.estimate_html.value = f"<span class='nvkit-muted'>no estimate: {html.escape(msg)}</span>"
            return
        self.estimate_html.value = (
            f"estimated before loading: <b>{fmt_bytes(e.total)}</b> "
            f"<span class='nvkit-muted'>({html.escape(dt)} on {'the CPU' if device == 'cpu' else 'CUDA'}: "
            f"{html.escape(why)}; batch 1 × 1024 tokens)</span>")

    # --- following the session --------------------------------------------------------------------
    def _on_event(self, ev) -> None:
        if ev.kind in ("load", "unload", "attention", "kernels", "adapter"):
            self._show_session(loaded_elsewhere=ev.kind == "load" and (self.job is None or self.job.done))
        if ev.kind == "unload" and current_session() is None and (self.job is None or self.job.done):
            # s.unload() from a cell (or another face): the status must not go on naming a loaded
            # model. This panel's own Unload, and a load that unloads the model before it, set
            # their own status after this.
            name = getattr(ev.subject, "model_id", None) or "the model"
            self.status.value = f"{html.escape(str(name))} was unloaded; no model is loaded."

    def _show_session(self, loaded_elsewhere: bool = False) -> None:
        s = current_session()
        if s is None:
            if self.summary.value:
                self.summary.value = ""
            return
        try:
            self.summary.value = self.describe(s)
        except Exception:  # the session was unloaded while we read it
            return
        if loaded_elsewhere:
            self.status.value = f"{html.escape(s.model_id)} was loaded (outside this panel)."

    # --- actions ---------------------------------------------------------------------------------
    def load(self):
        """Start loading in a worker thread; returns the Job (``await panel.load()`` works)."""
        if self.job is not None and not self.job.settled:
            self.status.value = "already loading…"
            return self.job
        model, kw = self.model.value.strip() or "demo", self.kwargs()
        self.error = None
        self.status.value = f"loading {html.escape(model)}…"
        self.progress.layout.visibility = "visible"
        self.progress.bar_style = "info"
        self.progress.value = 0
        self.load_button.disabled = True
        # here, in the thread that starts the worker: what the load imports must be whole before
        # the worker and this thread (the estimate, a cell) can both reach it (model.imports says why)
        imports.for_load(model, kw.get("quantization"), kw.get("use_kernels", False))

        def work(job):
            # The worker sets the widgets itself before it finishes, so whoever waits on the job
            # sees the final state (done-callbacks run after the job is marked done).
            from .. import load
            try:
                s = load(model, **kw)
            except BaseException as e:
                self.error = str(e)
                self.progress.value, self.progress.bar_style = 1, "danger"
                self.status.value = f"<span class='nvkit-error'>{html.escape(self.error)}</span>"
                self.load_button.disabled = False
                raise
            self.summary.value = self.describe(s)
            self.progress.value, self.progress.bar_style = 1, "success"
            self.status.value = self.loaded_text(s, kw.get("attn_implementation", "auto"))
            self.load_button.disabled = False
            return s

        self.job = run_in_worker(work, name="nvkit-load")
        return self.job

    @staticmethod
    def loaded_text(s, asked: str) -> str:
        """The status after a load: with attention "auto", the backend it picked for this model."""
        try:
            chosen = str(s.info["attention"])
        except Exception:  # unloaded meanwhile
            return "loaded"
        if asked == "auto":
            return f"loaded · attention auto picked <b>{html.escape(chosen)}</b> for this model"
        return f"loaded · attention <b>{html.escape(chosen)}</b>"

    @staticmethod
    def describe(s) -> str:
        i = s.info
        k = i.get("kernels")
        kern = f" · kernels: {html.escape(str(k['replaced'] or 'none replaced'))}" if k else ""
        on_cpu = all(d == "cpu" for d in i["devices"])
        weights = (f"weights <b>{fmt_bytes(i['footprint_bytes'])}</b> "
                   "<span class='nvkit-muted'>(parameters and buffers, model.get_memory_footprint())</span>")
        if i.get("measured_bytes") is not None:
            if on_cpu:
                grew = (f" · the load grew this process's memory (RSS) by {fmt_bytes(i['measured_bytes'])} "
                        "<span class='nvkit-muted'>(the weights, plus the tokenizer, libraries imported on a "
                        "first load and memory the allocator keeps for reuse)</span>")
            else:
                grew = (f" · torch allocated grew by {fmt_bytes(i['measured_bytes'])} during the load "
                        "<span class='nvkit-muted'>(the weights plus buffers torch made)</span>")
        else:
            grew = ""
        return (f"<b>{html.escape(i['model'])}</b>: {html.escape(i['architecture'])} · {i['parameters'] / 1e6:.1f} M params · "
                f"{html.escape(i['dtype'])}{' · ' + html.escape(str(i['quantization'])) if i['quantization'] else ''}"
                f" · on {html.escape(', '.join(i['devices']))} · attention <b>{html.escape(str(i['attention']))}</b>"
                f"{kern}<br>{weights}{grew}")

    def unload(self) -> int:
        s = current_session()
        if s is None:
            self.status.value = "nothing is loaded"
            return 0
        try:
            weights = int(s.info["footprint_bytes"])
        except Exception:
            weights = None
        freed = s.unload()
        self.summary.value = ""
        self.status.value = self.unload_text(s, freed, weights)
        return freed

    @staticmethod
    def unload_text(s, freed: int, weights: int | None) -> str:
        rep = getattr(s, "unload_report", None)
        device = getattr(rep, "device", "cpu")
        name = html.escape(s.model_id)
        if str(device).startswith("cuda"):
            return (f"unloaded {name}: torch allocated fell by {fmt_bytes(freed)}"
                    + (f" (weights {fmt_bytes(weights)})" if weights is not None else ""))
        w_txt = f"its weights were {fmt_bytes(weights)}; " if weights is not None else ""
        return (f"unloaded {name}: {w_txt}this process's memory (RSS) fell by {fmt_bytes(freed)}. "
                "<span class='nvkit-muted'>On the CPU, RSS shows what the process holds, not what the "
                "model gave back: freed memory often stays with the allocator for the next load, so "
                "RSS can fall by less than the weights, or not at all.</span>")
