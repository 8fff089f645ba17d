"""What a displayed memory chart costs, measured in a real JupyterLab + Chromium.

A notebook shows ``nvkit.monitor()`` and the Fine-tune panel's chart while it generates and
fine-tunes. The Log Console and the browser console stay empty (plotly's handler of the browser's
replies raised ``ValueError: truth value of an array is ambiguous`` 2-3 times a second with numpy
traces), and generation is as fast with the chart redrawing as with it stopped. Rounds alternate
between the two; each round's speed is counted per second of CPU the kernel got (tokens per
kernel-CPU-second), so that other processes taking the machine's cores (the browser, other jobs
on a shared CI box) don't decide the result; the median of the paired ratios must be within 10 %,
and the chart's redraws must take under 2 % of a core while it is shown. The
wall-clock ratio is printed beside them and must not fall below one half (the old chart cost
10-30x; on a machine shared with other jobs wall-clock rounds vary by tens of percent). After the
timed rounds and a fine-tune, the kernel keeps generating until the chart has been shown for
five minutes and its last view has had 30 s and 10 redraws of its own, and only then are the
consoles read.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.ui.conftest import open_notebook, screenshot, wait_kernel_idle, write_notebook
from tests.ui.helpers import CELL_DONE, console_problems, log_console_entries, run_cell, wait_cell

SHOWN = ".jp-NotebookPanel:not(.lm-mod-hidden)"
POINTS = f"{SHOWN} .nvkit-memory-points"
PAIRS = 40  # the median of many pairs: single rounds on a shared 2-core machine vary by ±25 %
TOKENS = 320  # long enough rounds that the machine's own jitter averages out within each
SHOWN_S = 300  # how long the chart stays displayed, generating and fine-tuning, before the consoles are read
OWN_S = 30  # the last view generates at least this long itself, however long the phases before it took
OWN_REDRAWS = 10


def _points(page) -> int:
    m = re.match(r"(\d+) points", page.inner_text(POINTS).strip())
    assert m, page.inner_text(POINTS)
    return int(m.group(1))


@pytest.mark.timeout(SHOWN_S + OWN_S + 900)
def test_displayed_charts_cost_nothing_while_generating_and_fine_tuning(page, lab, tmp_path_factory):
    messages = []
    page.on("console", lambda m: messages.append((m.type, m.text[:300])))
    out_dir = lab.root_dir / "chart-cost-run"
    write_notebook(lab.root_dir, "chart_cost.ipynb", [
        # one torch thread: the browser redrawing the chart shares this machine's cores, and
        # that is the browser's cost, not the kernel's
        "import asyncio, json, statistics, time\nimport torch\ntorch.set_num_threads(1)\nimport nvkit\n"
        "s = nvkit.load('demo', device_map='cpu')\n"
        "s.model.generation_config.eos_token_id = None  # every round makes exactly TOKENS tokens\n"
        "async def rate(n):  # (tokens per second, tokens per CPU-second of the whole kernel process)\n"
        "    c0, t0 = time.process_time(), time.perf_counter()\n"
        "    await s.agenerate('NVIDIA GPUs are', max_new_tokens=n, min_new_tokens=n)\n"
        "    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)\n"
        f"await rate({TOKENS})  # warm up",
        "chart = nvkit.monitor()\nshown_at = time.perf_counter()\nchart",
        "with_chart, without = [], []\nu0, cpu, shown = chart.updates, 0.0, 0.0\n"
        f"for _ in range({PAIRS}):\n"
        "    chart.stop(); await asyncio.sleep(1.5)\n"
        f"    without.append(await rate({TOKENS}))\n"
        "    r0, t0 = chart.redraw_cpu_seconds, time.perf_counter()\n"
        "    chart.start(); await asyncio.sleep(1.5)\n"
        f"    with_chart.append(await rate({TOKENS}))\n"
        "    cpu += chart.redraw_cpu_seconds - r0; shown += time.perf_counter() - t0\n"
        "wall = statistics.median(a[0] / b[0] for a, b in zip(with_chart, without))\n"
        "per_cpu = statistics.median(a[1] / b[1] for a, b in zip(with_chart, without))\n"
        "print(json.dumps({'with': with_chart, 'without': without, 'wall_ratio': wall, 'cpu_ratio': per_cpu,"
        " 'redraws': chart.updates - u0, 'chart_core_share': cpu / shown}))",
        "ft = nvkit.FinetunePanel()\nft.examples.value = '\\n'.join(['The H200 has 141 GB of fast memory.'] * 32)\n"
        "ft.steps.value = 12\nft.batch.value = 2\nft.seq_len.value = 64\n"
        f"ft.output_dir.value = {str(out_dir)!r}\nft",
        "run = ft.start()\nawait run\n"
        "while ft.start_btn.disabled:  # the panel's own end: last redraw, summary\n"
        "    await asyncio.sleep(0.1)\n"
        "print(json.dumps({'steps': run.step,"
        " 'chart_steps': len(ft.chart.figure.data[ft.chart.trace_index[('loss', None)]].x),"
        " 'errors': [chart.last_error, ft.chart.last_error]}))",
        "display(chart)  # a second view, in sight below the fine-tune panel (a scrolled-away chart rests)\n"
        # the earlier phases may already fill SHOWN_S on a slow machine: this view still gets
        # OWN_S of its own and its redraws, within a bound
        "t5, rounds, u5 = time.perf_counter(), 0, chart.updates\n"
        f"while (time.perf_counter() - shown_at < {SHOWN_S} or time.perf_counter() - t5 < {OWN_S}\n"
        f"       or chart.updates - u5 < {OWN_REDRAWS}) and time.perf_counter() - t5 < {SHOWN_S + OWN_S}:\n"
        "    await s.agenerate('NVIDIA GPUs are', max_new_tokens=32); rounds += 1\n"
        "print(json.dumps({'shown_s': time.perf_counter() - shown_at, 'rounds': rounds, 'redraws': chart.updates - u5, 'skipped_hidden': chart.skipped_hidden,"
        " 'errors': [chart.last_error, ft.chart.last_error]}))",
    ])
    open_notebook(page, lab, "chart_cost.ipynb")
    run_cell(page, 0)
    wait_cell(page, 0, timeout_ms=180_000)
    run_cell(page, 1)
    page.wait_for_selector(f"{SHOWN} .nvkit-memory-chart .js-plotly-plot .main-svg", timeout=240_000)
    wait_kernel_idle(page)
    seen = {_points(page)}
    run_cell(page, 2)
    deadline = time.monotonic() + 15 * PAIRS  # a pair takes about 4 s here
    while not page.evaluate(CELL_DONE, 2) and time.monotonic() < deadline:
        seen.add(_points(page))
        time.sleep(0.5)
    assert len(seen) > 1, seen  # the chart moved in the page while the cell awaited generation
    wait_cell(page, 2, timeout_ms=10_000)
    result = json.loads(page.locator(f"{SHOWN} .jp-Cell").nth(2).locator(".jp-OutputArea-output").inner_text())
    print("generate (tok/s, tokens per kernel-CPU-second) with the chart redrawing vs stopped:", result)
    screenshot(page, "memory-chart-live")
    assert result["redraws"] >= PAIRS, result      # it really redrew during the "with" rounds
    assert result["chart_core_share"] < 0.02, result
    assert result["cpu_ratio"] > 0.9, result
    assert result["wall_ratio"] > 0.5, result

    run_cell(page, 3)
    page.locator(f"{SHOWN} button.nvkit-ft-start").wait_for(timeout=60_000)
    run_cell(page, 4)
    page.wait_for_selector(f"{SHOWN} .nvkit-ft-chart .js-plotly-plot .main-svg", timeout=240_000)
    wait_cell(page, 4, timeout_ms=300_000)
    ft = json.loads(page.locator(f"{SHOWN} .jp-Cell").nth(4).locator(".jp-OutputArea-output").last.inner_text())
    print("fine-tune:", ft)
    assert ft["steps"] == 12 and ft["chart_steps"] == 12 and ft["errors"] == [None, None], ft

    run_cell(page, 5)
    shown_again = page.locator(f"{SHOWN} .jp-Cell").nth(5).locator(".nvkit-memory-chart .js-plotly-plot")
    shown_again.wait_for(timeout=60_000)
    shown_again.scroll_into_view_if_needed()  # as a user would look at it: in sight, not below the fold
    wait_cell(page, 5, timeout_ms=(SHOWN_S + OWN_S + 120) * 1000)
    kept = json.loads(page.locator(f"{SHOWN} .jp-Cell").nth(5).locator(".jp-OutputArea-output").last.inner_text())
    print("chart shown while generating and fine-tuning:", kept)
    assert kept["shown_s"] >= SHOWN_S and kept["rounds"] > 0 and kept["redraws"] >= OWN_REDRAWS, kept
    assert kept["errors"] == [None, None], kept
    assert log_console_entries(page) == []
    assert console_problems(messages) == []
