"""A kernel reference names a local folder only when it is path-like: a folder in the working
directory named like a Hub repo ("org/repo") never stands in for the Hub kernel, and its code never
runs unless the user names it as a path."""

import os
import shutil

import pytest

import nvkit
from nvkit.model.kernels import plan_kernels
from tests import demo_model  # noqa: E402
from tests.refusals import refused

KDIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "kernels", "nvkit-rmsnorm")
REPO = "kernels-community/liger-kernels"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A copy of the test kernel at ./kernels-community/liger-kernels under a fresh working
    directory; importing it leaves a PLANTED_CODE_RAN file next to it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNELS_CACHE", str(tmp_path / "kernels-cache"))
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    target = tmp_path / REPO
    shutil.copytree(KDIR, target)
    init = target / "build" / "torch-universal" / "nvkit_rmsnorm" / "__init__.py"
    init.write_text(init.read_text() + "\nimport pathlib\n"
                    f"pathlib.Path({str(target)!r}, 'PLANTED_CODE_RAN').write_text('ran')\n")
    return target


def test_hub_style_name_never_takes_a_planted_folder(survivor, planted):
    msg = refused(lambda: nvkit.load("demo", kernel_config={"RMSNorm": {"cpu": f"{REPO}:RMSNorm"}}),
                  REPO, "can't be loaded", f"'./{REPO}:RMSNorm'", survivor=survivor)
    assert "exists in the working directory" in msg
    refused(lambda: survivor.session.enable_kernels({"RMSNorm": {"cpu": f"{REPO}:RMSNorm"}}), REPO,
            survivor=survivor)
    assert not (planted / "PLANTED_CODE_RAN").exists()
    assert not survivor.session.model.use_kernels


def test_the_same_folder_named_as_a_path_is_used(planted):
    plan = plan_kernels(demo_model.path(), "cpu", True, {"RMSNorm": {"cpu": f"./{REPO}:RMSNorm"}})
    assert "local kernel directory" in plan.sources["RMSNorm"]
    assert (planted / "PLANTED_CODE_RAN").exists()      # the user named it: its code is theirs to run


def test_use_local_kernel_names_a_folder_explicitly(planted):
    from transformers import KernelConfig
    kc = KernelConfig(kernel_mapping={"RMSNorm": {"cuda": f"{REPO}:RMSNorm"}}, use_local_kernel=True)
    plan = plan_kernels(demo_model.path(), "cuda", True, kc)
    assert "local kernel directory" in plan.sources["RMSNorm"] and str(planted) in plan.sources["RMSNorm"]
