"""``nvkit.LoadPanel()``: the Model tab: what to load and how, the memory estimate before
loading, Load/Unload with progress, and what was actually loaded.

A thin view over ``nvkit.load`` / ``attention_backends`` / ``quantization_methods``: unavailable
backends and quantizations are shown disabled with the reason; ``.code()`` is the call the panel
makes. Loading runs in a worker thread; callbacks only start jobs and the worker sets values.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ..errors import NvkitError
from ..units import fmt_bytes
from ..threads import run_in_worker

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICE_MAPS = (("default (cuda if present)", None), ("cuda", "cuda"), ("auto (split over GPUs)", "auto"), ("cpu", "cpu"))


class LoadPanel(w.VBox):
    def __init__(self, model: str = "demo", device=None):
        from .. import attention_backends, quantization_methods
        self.backends = attention_backends(device)
        self.quants = quantization_methods(device)
        self.model = w.Combobox(value=model, options=["demo"], placeholder="demo, a Hub id or a local directory",
                                description="model", ensure_option=False, layout=w.Layout(width="420px"))
        self.model.add_class("nvkit-load-model")
        self.dtype = w.Dropdown(options=DTYPES, value="auto", description="dtype")
        self.device_map = w.Dropdown(options=DEVICE_MAPS, value=None, description="device map")
        self.device_map.add_class("nvkit-load-device-map")
        # One toggle per backend: ipywidgets can't disable single options of a Dropdown.
        self.attn_buttons = {}
        rows = []
        for c in [("auto", True, "the fastest available here (see nvkit.backends.AUTO_ORDER)")] + \
                 [(c.name, c.available, c.reason if not c.available else c.source) for c in self.backends]:
            name, ok, why = c
            b = w.ToggleButton(description=name, value=(name == "sdpa"), disabled=not ok, tooltip=why,
                               layout=w.Layout(width="170px"))
            b.add_class("nvkit-attn-" + name.replace("_", "-"))
            b.observe(self._on_attn, "value")
            self.attn_buttons[name] = b
            rows.append(w.HBox([b, w.HTML(f"<span style='font-size:90%;color:{'#555' if ok else '#a33'}'>"
                                         f"{html.escape(why)}</span>")]))
        self.attn_box = w.VBox(rows)
        self.kernels = w.Checkbox(value=False, description="Hub kernels (use_kernels)", indent=False)
        self.kernels.add_class("nvkit-load-kernels")
        qopts = [("none", None)] + [(c.name, c.name) for c in self.quants if c.available]
        self.quant = w.Dropdown(options=qopts, value=None, description="quantize")
        self.quant.add_class("nvkit-load-quant")
        self.double_quant = w.Checkbox(value=True, description="double quant", indent=False)
        self.compute_dtype = w.Dropdown(options=("same as dtype", "bfloat16", "float16", "float32"),
                                        value="same as dtype", description="compute")
        off = [c for c in self.quants if not c.available]
        self.quant_notes = w.HTML("".join(f"<div style='font-size:90%;color:#a33'>{html.escape(c.name)}: "
                                          f"{html.escape(c.reason)}</div>" for c in off))
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
        self.job = None
        self.error: str | None = None
        self.load_button.on_click(lambda _: self.load())
        self.unload_button.on_click(lambda _: self.unload())
        for x in (self.model, self.dtype, self.quant, self.double_quant, self.compute_dtype):
            x.observe(lambda _: self._update_options(), "value")
        self._update_options()
        super().__init__([
            w.HBox([self.model, self.dtype]), self.device_map,
            w.HTML("<b>attention</b>"), self.attn_box, self.kernels,
            w.HBox([self.quant, self.double_quant, self.compute_dtype]), self.quant_notes,
            self.estimate_html, w.HBox([self.load_button, self.unload_button, self.progress]), self.status, self.summary,
        ])
        self.add_class("nvkit-load-panel")

    # --- state -----------------------------------------------------------------------------------
    @property
    def attention(self) -> str:
        for name, b in self.attn_buttons.items():
            if b.value:
                return name
        return "sdpa"

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
        if q is None:
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
        if self.device_map.value is not None:
            kw["device_map"] = self.device_map.value
        if self.attention != "sdpa":
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
        self._estimate()

    def _estimate(self):
        try:
            from .. import estimate
        except ImportError:
            self.estimate_html.value = "<i>memory estimate unavailable (nvkit.estimate is not in this install)</i>"
            return
        model, dtype, q = self.model.value.strip() or "demo", self.dtype.value, self.quant.value

        def work(job):
            return estimate(model, dtype=dtype, quantization=q, mode="inference")

        def done(job):
            if job.error is not None:
                self.estimate_html.value = f"<i>estimate: {html.escape(str(job.error).splitlines()[0])}</i>"
            else:
                e = job.result()
                self.estimate_html.value = f"estimated before loading: <b>{fmt_bytes(e.total)}</b>"
        run_in_worker(work, name="nvkit-estimate").add_done_callback(done)

    # --- actions ---------------------------------------------------------------------------------
    def load(self):
        """Start loading in a worker thread; returns the Job (``await panel.load()`` works)."""
        if self.job is not None and not self.job.done:
            self.status.value = "already loading…"
            return self.job
        model, kw = self.model.value.strip() or "demo", self.kwargs()
        self.error = None
        self.status.value = f"loading {html.escape(model)}…"
        self.progress.layout.visibility = "visible"
        self.progress.bar_style = "info"
        self.progress.value = 0
        self.load_button.disabled = True

        def work(job):
            # The worker sets the widgets itself before it finishes, so whoever waits on the job
            # sees the final state (done-callbacks run after the job is marked done).
            from .. import load
            try:
                s = load(model, **kw)
            except BaseException as e:
                self.error = str(e)
                self.progress.value, self.progress.bar_style = 1, "danger"
                self.status.value = f"<span style='color:#a33'>{html.escape(self.error)}</span>"
                self.load_button.disabled = False
                raise
            self.summary.value = self.describe(s)
            self.progress.value, self.progress.bar_style = 1, "success"
            self.status.value = "loaded"
            self.load_button.disabled = False
            return s

        self.job = run_in_worker(work, name="nvkit-load")
        return self.job

    @staticmethod
    def describe(s) -> str:
        i = s.info
        k = i.get("kernels")
        kern = f" · kernels: {html.escape(str(k['replaced'] or 'none replaced'))}" if k else ""
        measured = f" (measured {fmt_bytes(i['measured_bytes'])})" if i.get("measured_bytes") is not None else ""
        return (f"<b>{html.escape(i['model'])}</b>: {html.escape(i['architecture'])} · {i['parameters'] / 1e6:.1f} M params · "
                f"{html.escape(i['dtype'])}{' · ' + html.escape(str(i['quantization'])) if i['quantization'] else ''}<br>"
                f"footprint {fmt_bytes(i['footprint_bytes'])} reported{measured} · devices "
                f"{html.escape(', '.join(i['devices']))} · attention in use <b>{html.escape(str(i['attention']))}</b>{kern}")

    def unload(self) -> int:
        from .. import session
        s = session(required=False)
        if s is None:
            self.status.value = "nothing is loaded"
            return 0
        freed = s.unload()
        self.summary.value = ""
        self.status.value = f"unloaded {html.escape(s.model_id)}: {fmt_bytes(freed)} freed"
        return freed
