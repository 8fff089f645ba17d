"""``nvkit doctor`` (tutorial 00 runs it) on a machine whose Hub kernels are out of reach: the reason
and how to bring a kernel in are printed once, after the backends, and each flash backend's line
refers to it instead of repeating four wrapped lines of it."""

import os
import subprocess
import sys

FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def test_doctor_says_the_hub_kernel_reason_once(tmp_path):
    empty = tmp_path / "no-kernels"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS"}
    # 4 fake Hopper GPUs (the flash backends are judged on them), nothing cached, the Hub offline
    env.update(NVKIT_FAKE_GPUS="4", HF_HUB_OFFLINE="1", KERNELS_CACHE=str(empty), HF_HUB_CACHE=str(empty),
               NVKIT_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "nvkit.cli", "doctor"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    lines = {name: next(ln for ln in out.splitlines() if f" {name} " in ln) for name in FLASH}
    folded = [name for name, ln in lines.items() if "is not installed" in ln]
    assert folded, out  # this machine has none of the flash packages: every line falls back to a Hub kernel
    for name in folded:
        assert lines[name].endswith("is not here (see Hub kernels below)"), lines[name]
        assert "Bring" not in lines[name] and "HF_HUB_OFFLINE" not in lines[name]
    assert out.count("Bring one in") == 1 and "Bring it in" not in out, out
    assert out.count("HF_HUB_OFFLINE is set,") == 1
    note = next(ln for ln in out.splitlines() if "Bring one in" in ln)
    assert note.lstrip().startswith("Hub kernels (") and "hf download kernels-community/" in note


def test_other_reasons_pass_through_unchanged():
    from nvkit.model.backends import fold_kernel_gaps
    reasons = {"sdpa": "torch.nn.functional.scaled_dot_product_attention", "eager": ""}
    assert fold_kernel_gaps(reasons) == (reasons, None)
