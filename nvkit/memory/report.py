"""``memory_report()``: one row per GPU this process sees — NVML used, torch allocated and reserved,
the rest (CUDA context, cuBLAS workspaces, NCCL, other processes), peaks and the prediction in
force — and ``format_report()``, the same as aligned text (``%nvkit memory`` prints it)."""

from __future__ import annotations

import os

from ..checks import one_of
from ..units import fmt_bytes
from .peaks import expectation, last_comparison, main_device
from .sampling import sampler
from .usage import cuda_in_use, nvml_used, pick_devices, rss_bytes, torch_module, torch_stats


REPORT_COLUMNS = ["source", "used", "torch_allocated", "torch_reserved", "rest", "peak_used",
                  "peak_torch_allocated", "peak_torch_reserved", "total", "predicted_peak"]


_UNITS = {"bytes": 1, "MiB": 2**20, "GiB": 2**30}


def memory_report(devices=None, unit: str = "bytes"):
    """A DataFrame, one row per GPU this process sees (or one "cpu" row for the process without
    GPUs): NVML used (whole device), torch allocated / reserved (this process), the rest
    (NVML − reserved: CUDA context, cuBLAS workspaces, NCCL, other processes), peaks since the last
    ``reset_peak`` and the prediction in force. ``unit``: "bytes", "MiB" or "GiB"."""
    import pandas as pd
    one_of("unit", unit, tuple(_UNITS))
    s = sampler(start=False)
    devs = pick_devices(s.devices, devices, "report")
    est = expectation()
    main_label, main_ci = main_device()
    torch = torch_module()
    rows, index = [], []
    for d in devs:
        used = nvml_used(d.index)
        a, r = torch_stats(d.cuda_index)
        pa = pr = 0.0
        if cuda_in_use():
            try:
                pa = float(torch.cuda.max_memory_allocated(d.cuda_index))
                pr = float(torch.cuda.max_memory_reserved(d.cuda_index))
            except Exception:
                pass
        pu = s.peak("nvml_used", d.cuda_index) if s.running else None
        pu = max(used, pu) if pu is not None and used == used else used
        pred = float(est.total) if est is not None and d.cuda_index == main_ci else float("nan")
        rows.append(["NVML", used, a, r, used - r, pu, max(pa, a), max(pr, r), float(d.memory_total), pred])
        index.append(d.label)
    if not devs:
        rss = float(rss_bytes())
        pk = s.peak("rss") if s.running else None
        pred = float(est.total) if est is not None and main_ci is None else float("nan")
        rows.append(["RSS", rss, 0.0, 0.0, rss, max(rss, pk or 0.0), 0.0, 0.0, _ram_total(), pred])
        index.append("cpu")
    df = pd.DataFrame(rows, columns=REPORT_COLUMNS, index=pd.Index(index, name="device"))
    num = REPORT_COLUMNS[1:]
    df[num] = df[num].astype("float64") / _UNITS[unit]
    if unit == "bytes":
        df[num] = df[num].round(0)
    df.attrs["unit"] = unit
    return df


def _ram_total() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return float("nan")


def format_report(df=None) -> str:
    """The report as aligned text with human sizes (``%nvkit memory`` prints this)."""
    df = memory_report() if df is None else df
    scale = _UNITS.get(df.attrs.get("unit", "bytes"), 1)
    cols = ["used", "torch_allocated", "torch_reserved", "rest", "peak_used", "total", "predicted_peak"]
    head = ["device", "source", "used", "torch alloc", "torch reserved", "rest", "peak used", "total", "predicted"]
    lines = [head]
    for label, row in df.iterrows():
        lines.append([str(label), row["source"]] + ["-" if row[c] != row[c] else fmt_bytes(row[c] * scale) for c in cols])
    w = [max(len(r[i]) for r in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)) for r in lines]
    out.append("rest = used − torch reserved: CUDA context, cuBLAS workspaces, NCCL buffers, other processes.")
    c = last_comparison()
    if c is not None:
        out.append(f"last: {c}")
    return "\n".join(out)
