"""The GPU selector in a real JupyterLab + Chromium, on 4 fake GPUs: tick GPU 2, then GPU 0, Apply,
and the kernel's CUDA_VISIBLE_DEVICES is "2,0"."""

from tests.ui.conftest import open_and_run_notebook, screenshot, wait_kernel_idle, write_notebook

# Run code in the notebook's own kernel and return its stdout (not through a cell, so the
# notebook stays as the user sees it).
KERNEL_STDOUT = """async (code) => {
    const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    let out = '';
    const future = kernel.requestExecute({code, store_history: false});
    future.onIOPub = (msg) => {
        if (msg.header.msg_type === 'stream') out += msg.content.text;
        if (msg.header.msg_type === 'error') out += 'ERROR ' + msg.content.ename + ': ' + msg.content.evalue;
    };
    await future.done;
    return out;
}"""


def test_tick_two_gpus_apply_and_the_kernel_sees_2_0(page, lab):
    write_notebook(lab.root_dir, "gpu_selector.ipynb", [
        "import nvkit\nselector = nvkit.GPUSelector()\nselector",
    ])
    open_and_run_notebook(page, lab, "gpu_selector.ipynb")
    rows = page.locator(".nvkit-gpu-selector .nvkit-gpu-row")
    rows.first.wait_for(timeout=60_000)
    assert rows.count() == 4
    assert "NVIDIA H200 (fake)" in rows.nth(0).inner_text() and "Hopper" in rows.nth(0).inner_text()
    kernel_out = page.evaluate(KERNEL_STDOUT, "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))")
    assert kernel_out.strip() == "None"

    page.locator(".nvkit-gpu-2 .nvkit-gpu-check input[type=checkbox]").click()
    page.locator(".nvkit-gpu-2 .nvkit-cuda-slot", has_text="cuda:0").wait_for()
    page.locator(".nvkit-gpu-0 .nvkit-gpu-check input[type=checkbox]").click()
    page.locator(".nvkit-gpu-0 .nvkit-cuda-slot", has_text="cuda:1").wait_for()
    page.locator(".nvkit-env-line", has_text="CUDA_VISIBLE_DEVICES=2,0").wait_for()

    page.locator("button.nvkit-apply").click()
    page.locator(".nvkit-status .nvkit-applied").wait_for()
    mapping = page.locator(".nvkit-mapping").inner_text()
    assert "cuda:0 = GPU 2" in mapping and "cuda:1 = GPU 0" in mapping
    screenshot(page, "gpu-selector")

    kernel_out = page.evaluate(KERNEL_STDOUT, "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']), "
                                              "os.environ['CUDA_DEVICE_ORDER'], selector.code())")
    assert kernel_out.split()[:2] == ["'2,0'", "PCI_BUS_ID"], kernel_out
    assert "nvkit.select_gpus([2, 0])" in kernel_out


def test_restart_with_selection_keeps_a_choice_applied_before_cuda(page, lab):
    """Apply GPU 1 while CUDA is not started (it is in force at once), then the toolbar's Restart
    kernel with GPU selection: the restarted kernel inherits the server's environment, so the
    choice must come from what nvkit kept for this kernel."""
    write_notebook(lab.root_dir, "gpu_restart.ipynb", [
        "import nvkit\nselector = nvkit.GPUSelector()\nselector",
    ])
    open_and_run_notebook(page, lab, "gpu_restart.ipynb")
    page.locator(".nvkit-gpu-1 .nvkit-gpu-check input[type=checkbox]").click()
    page.locator(".nvkit-env-line", has_text="CUDA_VISIBLE_DEVICES=1").wait_for()
    page.locator("button.nvkit-apply").click()
    page.locator(".nvkit-status .nvkit-applied", has_text="kept for this kernel's next restart").wait_for()
    assert page.evaluate(KERNEL_STDOUT, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() == "1"

    page.evaluate("() => { window.jupyterapp.commands.execute('nvkit:restart-with-selection'); return true; }")
    page.locator(".jp-Dialog button", has_text="Restart").click()
    page.locator(".jp-Notification-Toast, .Toastify__toast",
                 has_text="CUDA_VISIBLE_DEVICES=1").first.wait_for(timeout=90_000)
    wait_kernel_idle(page)
    out = page.evaluate(KERNEL_STDOUT, "import os\nprint(os.environ.get('CUDA_VISIBLE_DEVICES'), "
                                       "'selector' in globals())")
    assert out.split() == ["1", "False"], out   # a new process (its variables are gone), GPU 1 kept
