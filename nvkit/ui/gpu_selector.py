"""``nvkit.GPUSelector()``: tick GPUs, order them, Apply; a view over ``nvkit.select_gpus``.

The order in which GPUs are ticked is their cuda order (tick GPU 2, then GPU 0: cuda:0 is GPU 2);
the arrow buttons move a ticked GPU earlier or later. Everything shown (env line, cuda:i mapping,
restart warning) comes from ``nvkit.selection.plan``, the same code ``select_gpus`` runs.

Widgets are created here, in the main thread; the refresh thread only sets values (~1 Hz, one
cheap NVML read per tick, a message only when a value changed).
"""

from __future__ import annotations

import html
import threading

import ipywidgets as w

from ..errors import NvkitError
from ..hardware.inventory import FAKE_ENV, gpus, nvml_status
from ..hardware.selection import launch_command, plan, select_gpus, selection, startup_env
from ..units import fmt_bytes
from .common import CodeToggle, root, style, wrap_row

_MODES = [("Chosen GPUs", "gpus"), ("All GPUs", "all"), ("CPU only", "cpu")]

# Every GPU row has the same fixed column widths, so the bars, the numbers and the arrows stand one
# under the other whatever each GPU's name and readings are; the readings use digits of one width
# and never wrap (a wrapped or wider number shifted everything after it).
ROW_CSS = """
.nvkit-gpu-row > * { flex: 0 0 auto; }
.nvkit-gpu-row .widget-html-content { white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
  font-variant-numeric: tabular-nums; }
"""
# ch is the width of a digit; letters, spaces and points are narrower
_MEM_WIDTH = "22ch"   # "1023.99 MiB / 1023.99 GiB", the longest fmt_bytes pair
_UTIL_WIDTH = "8ch"   # "util 100%"


def _arch_text(g) -> str:
    return f"{g.architecture} · cc {g.capability_str}" + (" · MIG" if g.mig_mode else "")


def _columns(found) -> dict:
    """The name and architecture column widths every row shares: room for the longest (a name
    over 32 characters is cut, and shows whole in its tooltip). A bold capital is about a digit
    wide; the architecture is in the smaller muted text."""
    def longest(texts) -> int:
        return min(max((len(t) for t in texts), default=8), 32)
    return {"name": f"{longest(g.name for g in found) + 1}ch",
            "arch": f"{int(longest(_arch_text(g) for g in found) * 0.85) + 1}ch"}


class _Row:
    """The widgets of one GPU's line (``columns``: the widths all rows share, from ``_columns``)."""

    def __init__(self, g, on_check, on_move, columns: dict | None = None):
        cols = columns or _columns([g])
        self.index = g.index
        self.check = w.Checkbox(value=False, description=f"GPU {g.index}", indent=False,
                                layout=w.Layout(width="72px"))
        self.check.add_class("nvkit-gpu-check")
        self.check.observe(lambda ch: on_check(g.index, ch["new"]), "value")
        self.slot = w.HTML("", layout=w.Layout(width="56px"))
        self.slot.add_class("nvkit-cuda-slot")
        name = w.HTML(f"<b title='{html.escape(g.name)} · bus {html.escape(g.pci_bus_id)} · {html.escape(g.uuid)}'>"
                      f"{html.escape(g.name)}</b>", layout=w.Layout(width=cols["name"]))
        name.add_class("nvkit-gpu-name")
        arch = w.HTML(f"<span class='nvkit-muted'>{html.escape(_arch_text(g))}</span>",
                      layout=w.Layout(width=cols["arch"]))
        arch.add_class("nvkit-gpu-arch")
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="140px"))
        self.bar.add_class("nvkit-mem-bar")
        self.mem = w.HTML("", layout=w.Layout(width=_MEM_WIDTH))
        self.mem.add_class("nvkit-mem-label")
        self.util = w.HTML("", layout=w.Layout(width=_UTIL_WIDTH))
        self.util.add_class("nvkit-util")
        self.up = w.Button(icon="arrow-up", tooltip="earlier in cuda order",
                           layout=w.Layout(width="36px"))
        self.up.add_class("nvkit-move-up")
        self.up.on_click(lambda _b: on_move(g.index, -1))
        self.down = w.Button(icon="arrow-down", tooltip="later in cuda order",
                             layout=w.Layout(width="36px"))
        self.down.add_class("nvkit-move-down")
        self.down.on_click(lambda _b: on_move(g.index, +1))
        self.box = wrap_row([self.check, self.slot, name, arch, self.bar, self.mem, self.util, self.up, self.down])
        self.box.add_class("nvkit-gpu-row")
        self.box.add_class(f"nvkit-gpu-{g.index}")
        self.update(g)

    def update(self, g) -> None:
        frac = g.memory_used / g.memory_total if g.memory_total else 0.0
        if abs(self.bar.value - frac) > 1e-6:
            self.bar.value = frac
        style = "danger" if frac > 0.9 else "warning" if frac > 0.7 else "info"
        if self.bar.bar_style != style:
            self.bar.bar_style = style
        mem = f"{fmt_bytes(g.memory_used)} / {fmt_bytes(g.memory_total)}"
        if self.mem.value != mem:
            self.mem.value = mem
        util = "util -" if g.utilization is None else f"util {g.utilization}%"
        if self.util.value != util:
            self.util.value = util


class GPUSelector(w.VBox):
    """One row per GPU (tick, name, architecture, capability, live memory bar, utilization),
    an order, a CPU-only choice and Apply. ``.code()`` is the Python that does the same."""

    def __init__(self, refresh_interval: float | None = 1.0, **kwargs):
        self._syncing = False
        self._order: list[int] = []
        try:
            found = gpus(processes=False)
            problem = None if found else nvml_status().reason
        except NvkitError as e:
            found, problem = [], str(e)
        self._gpus = found
        columns = _columns(found)
        self._rows = {g.index: _Row(g, self._on_check, self._on_move, columns) for g in found}
        allowed = None
        if found and startup_env().get("CUDA_VISIBLE_DEVICES") is not None:
            try:  # plan(None) lists the GPUs this kernel may use at all: its inherited set
                allowed = [d.index for d in plan(None).devices]
            except NvkitError:
                allowed = []
        for idx, r in self._rows.items():
            if allowed is not None and idx not in allowed:   # outside the kernel's inherited set
                r.check.disabled = True
                r.box.add_class("nvkit-gpu-unavailable")

        self.header = w.HTML(self._header_html(found, problem))
        self.header.add_class("nvkit-gpu-header")
        self.mode = w.ToggleButtons(options=_MODES, value="all", style={"button_width": "auto"})
        self.mode.add_class("nvkit-mode")
        self.mode.observe(self._on_mode, "value")
        self.apply_button = w.Button(description="Apply", button_style="primary", icon="check")
        self.apply_button.add_class("nvkit-apply")
        self.apply_button.on_click(lambda _b: self.apply())
        self.env_line = w.HTML()
        self.env_line.add_class("nvkit-env-line")
        self.mapping = w.HTML()
        self.mapping.add_class("nvkit-mapping")
        self.status = w.HTML()
        self.status.add_class("nvkit-status")

        self.code_view = CodeToggle(self.code)
        self._load_current()
        rows = [r.box for r in self._rows.values()]
        row_css = w.HTML(f"<style>{ROW_CSS}</style>", layout=w.Layout(height="0px", margin="0", padding="0"))
        super().__init__(children=[style(), row_css, self.header, *rows, wrap_row([self.mode, self.apply_button]),
                                   self.env_line, self.mapping, self.status, self.code_view], **kwargs)
        self.add_class("nvkit-gpu-selector")
        root(self)
        self._refresh_preview()

        self._stop = threading.Event()
        self._thread = None
        if refresh_interval and found:
            self._thread = threading.Thread(target=self._refresh_loop, args=(float(refresh_interval),),
                                            name="nvkit-gpu-selector", daemon=True)
            self._thread.start()

    # --- state -----------------------------------------------------------------------------------
    @property
    def choice(self) -> tuple[int, ...] | None:
        """What Apply would select: nvidia-smi indices in cuda order, () for CPU, None for all."""
        if self.mode.value == "all":
            return None
        if self.mode.value == "cpu":
            return ()
        return tuple(self._order)

    def code(self) -> str:
        c = self.choice
        if c is None:
            call = "nvkit.select_gpus(None)  # all GPUs"
        elif c == ():
            call = "nvkit.select_gpus([])  # CPU only"
        else:
            call = f"nvkit.select_gpus({list(c)})"
        return f"import nvkit\n{call}\n"

    def apply(self):
        """Run ``nvkit.select_gpus`` with the current choice; returns its Selection (None on error)."""
        if self.mode.value == "gpus" and not self._order:
            self._show_status("error", "Tick at least one GPU, or choose CPU only / All GPUs.")
            return None
        try:
            sel = select_gpus(self.choice)
        except NvkitError as e:
            self._show_status("error", str(e))
            return None
        if sel.restart_needed:
            saved = ("Saved: it is applied when this kernel restarts (Kernel ▸ Restart, or Restart kernel "
                     "with GPU selection), as soon as nvkit is imported." if sel.saved else
                     f"Start the process again with <code>{html.escape(sel.env_line)}</code>.")
            self._show_status("restart", "CUDA is already initialised in this kernel, so this choice "
                              f"takes effect only after a kernel restart. {saved}")
        else:
            kept = " It is also kept for this kernel's next restart." if sel.saved else ""
            self._show_status("ok", f"Applied: <code>{html.escape(sel.env_line or 'all GPUs')}</code> is in "
                              f"force for this kernel (CUDA reads it at its first use).{kept}")
        self._refresh_preview(keep_status=True)
        return sel

    def close(self):
        self._stop.set()
        for r in self._rows.values():
            r.box.close()
        super().close()

    # --- events ----------------------------------------------------------------------------------
    def _on_check(self, index: int, ticked: bool) -> None:
        if self._syncing:
            return
        if ticked and index not in self._order:
            self._order.append(index)
        elif not ticked and index in self._order:
            self._order.remove(index)
        if self.mode.value != "gpus":
            self._syncing = True
            try:
                self.mode.value = "gpus"
            finally:
                self._syncing = False
        self._refresh_preview()

    def _on_move(self, index: int, step: int) -> None:
        if index not in self._order:
            return
        i = self._order.index(index)
        j = max(0, min(len(self._order) - 1, i + step))
        self._order[i], self._order[j] = self._order[j], self._order[i]
        self._refresh_preview()

    def _on_mode(self, change) -> None:
        if self._syncing:
            return
        if change["new"] in ("all", "cpu"):
            self._order = []
            self._sync_checks()
        self._refresh_preview()

    # --- drawing ---------------------------------------------------------------------------------
    def _load_current(self) -> None:
        """Start from the choice in force (or waiting for a restart)."""
        try:
            cur = selection()
        except NvkitError:
            return
        if cur.pending is not None:
            cur = cur.pending
        env_set = cur.env.get("CUDA_VISIBLE_DEVICES") is not None
        self._syncing = True
        try:
            if cur.choice == ():
                self.mode.value = "cpu"
            elif cur.choice is not None and env_set and all(i in self._rows for i in cur.choice):
                self._order = list(cur.choice)
                self.mode.value = "gpus"
        finally:
            self._syncing = False
        self._sync_checks()

    def _sync_checks(self) -> None:
        self._syncing = True
        try:
            for idx, r in self._rows.items():
                r.check.value = idx in self._order
                pos = self._order.index(idx) if idx in self._order else None
                r.slot.value = "" if pos is None else f"<code>cuda:{pos}</code>"
                r.up.disabled = pos is None or pos == 0
                r.down.disabled = pos is None or pos == len(self._order) - 1
        finally:
            self._syncing = False

    def _header_html(self, found, problem) -> str:
        if not found:
            return (f"<b>No GPUs</b>: {html.escape(problem or 'none found')}. "
                    "CPU only is the one choice here.")
        src = (f" <i>(fake inventory from {FAKE_ENV})</i>" if found[0].fake else "")
        text = (f"<b>{len(found)} GPU(s)</b>{src}. Tick GPUs in the order you want them as "
                "cuda:0, cuda:1, …; the arrows reorder them.")
        inherited = startup_env().get("CUDA_VISIBLE_DEVICES")
        if inherited is not None:
            text += (f"<br>This kernel started with <code>CUDA_VISIBLE_DEVICES={html.escape(inherited)}"
                     "</code>: only those GPUs can be chosen; indices here are nvidia-smi's.")
        return text

    def _refresh_preview(self, keep_status: bool = False) -> None:
        self._sync_checks()
        if hasattr(self, "code_view"):
            self.code_view.refresh()
        self.apply_button.disabled = self.mode.value == "gpus" and not self._order
        if not keep_status:
            self.status.value = ""
        if self.mode.value == "gpus" and not self._order:
            self.env_line.value = "<i>Tick at least one GPU.</i>"
            self.mapping.value = ""
            return
        try:
            p = plan(self.choice)
            line = launch_command("train.py", gpus=self.choice)
        except NvkitError as e:
            self.env_line.value = ""
            self.mapping.value = ""
            self._show_status("error", str(e))
            return
        self.env_line.value = (f"<code class='nvkit-env'>{html.escape(p.env_line)}</code>"
                               + ("" if p.env.get("CUDA_VISIBLE_DEVICES") is not None
                                  else " <i>(CUDA_VISIBLE_DEVICES unset: every GPU)</i>"))
        items = "".join(f"<li>{html.escape(str(d))}</li>" for d in p.devices) \
            or "<li>no cuda devices: torch runs on the CPU</li>"
        notes = "".join(f"<li class='nvkit-muted'>{html.escape(n)}</li>" for n in p.notes)
        self.mapping.value = (f"<ul style='margin:2px 0'>{items}{notes}</ul>"
                              f"<span>for a script: <code style='overflow-wrap:anywhere'>{html.escape(line)}</code></span>")
        if p.restart_needed and not keep_status:
            self._show_status("restart", "CUDA is already initialised in this kernel: this choice "
                              "will take effect only after a kernel restart (Apply saves it for the "
                              "restart).")

    def _show_status(self, kind: str, message_html: str) -> None:
        cls = {"ok": "nvkit-applied nvkit-ok", "error": "nvkit-error",
               "restart": "nvkit-restart-warning nvkit-warn"}[kind]
        body = message_html if kind != "error" else html.escape(message_html)
        self.status.value = f"<div class='{cls}'>{body}</div>"

    # --- live values -----------------------------------------------------------------------------
    def _refresh_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                for g in gpus(processes=False):
                    row = self._rows.get(g.index)
                    if row is not None:
                        row.update(g)
            except Exception:  # NVML gone (driver reset) or widget closed: stop quietly
                return
