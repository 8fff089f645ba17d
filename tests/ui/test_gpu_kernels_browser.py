"""GPU memory by kernel in a real JupyterLab and Chromium: two notebooks with running kernels on fake
GPUs, one found by its pid, one (running nvkit) by its report file under a container-style pid.
The sidebar names both notebooks with their memory; the status bar shows the notebook's share;
"Open notebook", "Unload model" (through the kernel's comm), "Interrupt", "Restart" and "Shut down"
(both confirmed first) work through JupyterLab's own services."""

from __future__ import annotations

import re
import time

from tests.ui.conftest import cell_errors, open_notebook, run_all_cells, screenshot, write_notebook
from tests.ui.gpu_lab import gpu_lab, gpu_page  # noqa: F401  (fixtures)

GIB = 2**30
STATUS = "#jp-main-statusbar [data-nvkit=statusbar]"
SIDEBAR = "#nvkit-gpus"
HOST_PID = 4_000_042          # what NVML would list for a kernel in a container: no process here


def entry(page, kernel_id: str):
    return page.locator(f'{SIDEBAR} .nvkit-Kernel[data-kernel-id="{kernel_id}"]')


def wait_until(check, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def test_gpu_memory_by_kernel(gpu_lab, gpu_page):  # noqa: F811
    lab, page = gpu_lab, gpu_page
    write_notebook(lab.root_dir, "eval-b.ipynb", ["scores = [x * x for x in range(10)]\nsum(scores)"])
    write_notebook(lab.root_dir, "train-a.ipynb", [
        ("markdown", "# Fine-tune A\nThe demo model, loaded with nvkit."),
        "import nvkit\ns = nvkit.load('demo')\ns.generate('NVIDIA GPUs are', max_new_tokens=8)",
    ])
    for name in ("eval-b.ipynb", "train-a.ipynb"):
        open_notebook(page, lab, name)
        run_all_cells(page)
        assert not cell_errors(page), cell_errors(page)
    kernels = lab.sessions()
    kid_a, kid_b = kernels["train-a.ipynb"], kernels["eval-b.ipynb"]
    pid_a, pid_b = lab.kernel_pid(kid_a), lab.kernel_pid(kid_b)

    # B holds memory on GPU 0 under its own pid; A on GPU 1 under a host pid only its report explains
    lab.inventory([
        {"memory_used": 46 * GIB, "processes": [
            {"pid": pid_b, "used_memory": 38 * GIB},
            {"pid": HOST_PID + 1, "used_memory": 13 * GIB // 2, "name": "someone-elses-job"}]},
        {"memory_used": 14 * GIB, "processes": [
            {"pid": HOST_PID, "container_pid": pid_a, "used_memory": int(12.3 * GIB)}]},
    ])

    # the status bar: this notebook's share beside the total (A is in front)
    page.wait_for_function(
        "sel => /^this notebook 12\\.3 GiB · GPUs [\\d.]+\\/[\\d.]+ GiB$/"
        ".test(document.querySelector(sel)?.textContent || '')", arg=STATUS, timeout=30_000)
    text = page.locator(STATUS).inner_text()
    assert re.fullmatch(r"this notebook 12\.3 GiB · GPUs 60\.0/280\.8 GiB", text), text

    # a click opens the sidebar on A's entry
    page.locator(STATUS).click()
    a, b = entry(page, kid_a), entry(page, kid_b)
    a.wait_for()
    b.wait_for()
    cards = page.locator(f"{SIDEBAR} .nvkit-Gpu")
    assert cards.nth(0).locator(".nvkit-Kernel").count() == 1
    assert cards.nth(1).locator(".nvkit-Kernel").count() == 1
    assert cards.nth(0).locator(f'[data-kernel-id="{kid_b}"]').count() == 1
    assert a.locator(".nvkit-Kernel-name").inner_text() == "train-a.ipynb"
    assert a.locator(".nvkit-Kernel-memory").inner_text() == "12.3 GiB"
    assert b.locator(".nvkit-Kernel-name").inner_text() == "eval-b.ipynb"
    assert b.locator(".nvkit-Kernel-memory").inner_text() == "38.0 GiB"
    a.locator(".nvkit-Kernel-detail", has_text="model demo").wait_for()
    assert "report file" in a.locator(".nvkit-Kernel-name").get_attribute("title")
    assert f"pid {pid_b}" in b.locator(".nvkit-Kernel-name").get_attribute("title")
    width = b.locator(".nvkit-Kernel-barFill").evaluate("e => parseFloat(e.style.width)")
    assert abs(width - 100 * 38 / 140.4) < 0.2, width
    # the other user's job: its memory, not its name
    other = cards.nth(0).locator(".nvkit-Gpu-process")
    assert other.inner_text() == f"{HOST_PID + 1} · 6.5 GiB"
    assert "someone-elses-job" not in page.locator(SIDEBAR).inner_text()
    page.wait_for_timeout(300)
    screenshot(page, "gpu-memory-by-kernel")

    # "Open notebook" brings B to the front; the status bar follows
    b.get_by_role("button", name="Open notebook").click()
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget?.context?.path === 'eval-b.ipynb'")
    page.wait_for_function("sel => document.querySelector(sel)?.textContent"
                           ".startsWith('this notebook 38.0 GiB')", arg=STATUS)

    # "Unload model" asks A's kernel through its comm; the kernel answers and reports no model
    a.get_by_role("button", name="Unload model").click()
    toast = page.locator(".Toastify__toast", has_text="demo unloaded")
    toast.first.wait_for(timeout=60_000)
    assert re.search(r"demo unloaded, [\d.]+ [KMG]?i?B freed", toast.first.inner_text())
    a.get_by_role("button", name="Unload model").wait_for(state="detached")
    assert a.locator(".nvkit-Kernel-detail", has_text="model demo").count() == 0
    gpus = lab.api("nvkit/api/gpus")["gpus"]
    assert gpus[1]["kernels"][0]["model"] is None
    assert a.count() == 1                                     # the kernel itself runs on

    # "Interrupt" stops a running cell of A (its open notebook's connection is the one used)
    page.evaluate("""kid => {
        const panel = Array.from(window.jupyterapp.shell.widgets('main')).find(
            w => w.sessionContext?.session?.kernel?.id === kid);
        window.nvkitSleep = panel.sessionContext.session.kernel
            .requestExecute({code: 'import time\\nfor _ in range(600): time.sleep(0.1)'})
            .done.then(r => r.content);
    }""", kid_a)
    page.wait_for_function("""kid => Array.from(window.jupyterapp.shell.widgets('main')).some(
        w => w.sessionContext?.session?.kernel?.id === kid
             && w.sessionContext.session.kernel.status === 'busy')""", arg=kid_a)
    a.get_by_role("button", name="Interrupt").click()
    reply = page.evaluate("() => window.nvkitSleep")
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply

    # "Restart" asks first; the kernel keeps its id and gets a new process
    a.get_by_role("button", name="Restart").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert "train-a.ipynb" in dialog.inner_text()
    dialog.get_by_role("button", name="Restart").click()
    wait_until(lambda: _pid_or_none(lab, kid_a) not in (None, pid_a), 60, "a new kernel process")
    assert kid_a in {k["id"] for k in lab.api("api/kernels")}
    # the new process has not imported nvkit and is on no GPU: its entry goes
    a.wait_for(state="detached")

    # "Shut down" asks first; then the kernel ends and its entry goes
    b.get_by_role("button", name="Shut down").click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for()
    assert "eval-b.ipynb" in dialog.inner_text()
    dialog.get_by_role("button", name="Shut down").click()
    wait_until(lambda: kid_b not in {k["id"] for k in lab.api("api/kernels")}, 30,
               "the Jupyter API to drop the kernel")
    b.wait_for(state="detached")
    assert kid_a in {k["id"] for k in lab.api("api/kernels")}


def _pid_or_none(lab, kernel_id: str):
    try:
        return lab.kernel_pid(kernel_id)
    except AssertionError:
        return None
