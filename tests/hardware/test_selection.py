"""GPU selection on 4 fake GPUs: the rules, the errors, the restart-needed path (CUDA "initialised"
by monkeypatching the one boundary), saving and re-applying a choice, and launch lines."""

import importlib
import json
import os

import pytest

from nvkit.errors import NvkitError
from nvkit.state import STATE

S = importlib.import_module("nvkit.hardware.selection")   # the module (nvkit.selection is the function)
G = importlib.import_module("nvkit.hardware.inventory")
import nvkit  # noqa: E402

REAL_KERNEL_ID = S.kernel_id
REAL_CUDA_INITIALIZED = S.cuda_initialized


@pytest.fixture(autouse=True)
def fake(fake_gpus, tmp_path):
    """4 fake H200s, no CUDA variables, a private cache, a pretend kernel id, CUDA not up."""
    fake_gpus("k-test", cache=tmp_path / "cache")


def cuda_up(monkeypatch, up=True):
    monkeypatch.setattr(S, "cuda_initialized", lambda: up)


def visible():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def saved_file():
    return S._saved_path("k-test")


# --- the rules -----------------------------------------------------------------------------------

def test_order_is_kept_and_mapped():
    gs = nvkit.gpus()
    s = nvkit.select_gpus([2, 0])
    assert visible() == "2,0" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert s.in_force and not s.restart_needed and s.choice == (2, 0)
    now = nvkit.selection()
    assert now.in_force and now.choice == (2, 0)
    m = now.mapping
    assert list(m) == ["cuda:0", "cuda:1"]
    assert (m["cuda:0"].index, m["cuda:0"].pci_bus_id) == (2, gs[2].pci_bus_id)
    assert (m["cuda:1"].index, m["cuda:1"].name) == (0, gs[0].name)
    assert now.env_line == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0"
    text = repr(now)
    assert "cuda:0 = GPU 2" in text and "cuda:1 = GPU 0" in text and "in force" in text
    json.dumps(now.to_dict())


@pytest.mark.parametrize("choice", ["2,0", "2 0", ["2", "0"], (2, 0)])
def test_choice_spellings(choice):
    assert nvkit.select_gpus(choice).choice == (2, 0)
    assert visible() == "2,0"


def test_uuids_and_gpu_objects_are_accepted():
    gs = nvkit.gpus()
    assert nvkit.select_gpus([gs[3].uuid, 1]).choice == (3, 1)
    assert nvkit.select_gpus([gs[1]]).choice == (1,)
    assert nvkit.select_gpus(gs[2].uuid[:12]).choice == (2,)       # a UUID prefix, as CUDA allows
    assert visible() == "2"


@pytest.mark.parametrize("cpu", [[], (), "cpu", "CPU", ""])
def test_cpu_only_is_an_empty_variable(cpu):
    s = nvkit.select_gpus(cpu)
    assert visible() == ""                                    # set and empty, as the guide says
    assert s.cpu_only and s.devices == ()
    assert s.env_line == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="
    assert nvkit.selection().devices == ()


@pytest.mark.parametrize("everything", [None, "all"])
def test_none_means_all(everything):
    nvkit.select_gpus([1])
    s = nvkit.select_gpus(everything)
    assert visible() is None and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert s.choice is None and [d.index for d in s.devices] == [0, 1, 2, 3]
    assert [d.index for d in nvkit.selection().devices] == [0, 1, 2, 3]


@pytest.mark.parametrize("bad,words", [
    ([7], "GPU 7 does not exist"), ([2, 2], "GPU 2 is listed twice"), ([-1], "does not exist"),
    (["GPU-ffffffff"], "no GPU has the UUID"), (["MIG-x"], "neither a GPU index nor a GPU UUID"),
    ("none", "neither"), (3.5, "not a GPU choice"), ([True], "neither"),
])
def test_errors_list_the_valid_gpus(bad, words):
    nvkit.select_gpus([1])
    with pytest.raises(NvkitError) as e:
        nvkit.select_gpus(bad)
    msg = str(e.value)
    assert words in msg
    if "not a GPU choice" not in msg:
        assert "Valid GPUs: 0 (" in msg and "3 (" in msg and "[] for CPU only" in msg
    assert visible() == "1"                                   # a failed call changes nothing


def test_no_gpus_only_cpu_or_all(monkeypatch):
    monkeypatch.delenv("NVKIT_FAKE_GPUS")
    monkeypatch.setattr(G, "_nvml_source", _NoDriver())
    with pytest.raises(NvkitError, match="no GPUs to choose from.*no NVIDIA driver"):
        nvkit.select_gpus([0])
    assert nvkit.select_gpus([]).cpu_only and visible() == ""
    assert nvkit.select_gpus(None).devices == ()
    assert nvkit.launch_command("t.py") == "CUDA_DEVICE_ORDER=PCI_BUS_ID torchrun --nproc_per_node=1 t.py"


class _NoDriver:
    kind = "nvml"

    def error(self):
        return "no NVIDIA driver (test)"

    def read(self, processes):
        return []

    def versions(self):
        return {}


def test_plan_changes_nothing():
    p = S.plan([3])
    assert not p.in_force and p.env["CUDA_VISIBLE_DEVICES"] == "3" and visible() is None
    nvkit.select_gpus([3])
    assert S.plan([3]).in_force


# --- a CUDA_VISIBLE_DEVICES the kernel started with ---------------------------------------------

def test_inherited_variable_is_shown_and_respected(monkeypatch):
    monkeypatch.setattr(S, "_STARTUP", {S.ORDER: "PCI_BUS_ID", S.VISIBLE: "1,3"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    now = nvkit.selection()
    assert [d.index for d in now.devices] == [1, 3]
    assert any("started with CUDA_VISIBLE_DEVICES=1,3" in n and "nvidia-smi" in n for n in now.notes)
    assert nvkit.select_gpus([3, 1]).choice == (3, 1) and visible() == "3,1"
    with pytest.raises(NvkitError, match=r"GPU 0 is outside .*CUDA_VISIBLE_DEVICES=1,3.*Valid GPUs: 1 \("):
        nvkit.select_gpus([0])
    s = nvkit.select_gpus(None)                     # "all" = all this kernel may use
    assert visible() == "1,3" and [d.index for d in s.devices] == [1, 3]
    assert nvkit.launch_command("t.py").startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1,3 ")


def test_inherited_uuid_and_order_note(monkeypatch):
    gs = nvkit.gpus()
    monkeypatch.setattr(S, "_STARTUP", {S.ORDER: None, S.VISIBLE: gs[2].uuid})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gs[2].uuid)
    now = nvkit.selection()
    assert [d.index for d in now.devices] == [2]
    monkeypatch.setattr(S, "_STARTUP", {S.ORDER: None, S.VISIBLE: "2"})
    assert any("without CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in nvkit.selection().notes)


def test_parse_visible_reads_like_cuda():
    gs = nvkit.gpus()
    assert S._parse_visible("0,7,1", gs)[0] == [0]            # CUDA stops at the invalid entry
    assert S._parse_visible("", gs) == ([], [])
    assert S._parse_visible(None, gs) == (None, [])
    idx, notes = S._parse_visible("MIG-1234", gs)
    assert idx == [] and "MIG" in notes[0]
    assert "twice" in S._parse_visible("1,1", gs)[1][0]


def test_in_force_order_note(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert any("fastest first" in n for n in nvkit.selection().notes)


# --- CUDA already initialised: never pretend, save for the restart -------------------------------

def test_restart_needed_changes_nothing_now_and_saves(monkeypatch, capsys):
    nvkit.select_gpus([2, 0])
    cuda_up(monkeypatch)
    s = nvkit.select_gpus([1])
    err = capsys.readouterr().err
    assert s.restart_needed and not s.in_force and s.saved
    assert visible() == "2,0"                                 # never pretend
    assert "already initialised" in err and "kernel restarts" in err and "CUDA_VISIBLE_DEVICES=1" in err
    data = json.loads(saved_file().read_text())
    assert data["choice"] == [1] and data["uuids"] == [nvkit.gpus()[1].uuid]
    assert data["pid"] == os.getpid() and data["kernel_id"] == "k-test"
    now = nvkit.selection()
    assert now.choice == (2, 0) and now.in_force               # what CUDA uses
    assert now.pending is not None and now.pending.choice == (1,)
    assert "pending, after the kernel restarts" in repr(now)
    # a launch line is for a new process: it gets the pending choice
    assert "CUDA_VISIBLE_DEVICES=1 torchrun --nproc_per_node=1" in nvkit.launch_command("t.py")
    # the restart warning shows in the preview too
    assert S.plan([3]).restart_needed


def test_restart_needed_back_to_what_is_in_force_clears_the_pending(monkeypatch):
    nvkit.select_gpus([2, 0])
    cuda_up(monkeypatch)
    nvkit.select_gpus([1])
    assert saved_file().exists()
    s = nvkit.select_gpus("2,0")
    assert s.in_force and not s.restart_needed and not saved_file().exists()
    assert nvkit.selection().pending is None


def test_restart_needed_for_all_and_cpu(monkeypatch):
    nvkit.select_gpus([2])
    cuda_up(monkeypatch)
    assert nvkit.select_gpus(None).restart_needed
    assert json.loads(saved_file().read_text())["choice"] is None
    assert nvkit.select_gpus([]).restart_needed
    assert json.loads(saved_file().read_text())["choice"] == []
    assert visible() == "2"


def test_restart_needed_outside_a_kernel_says_how(monkeypatch, capsys):
    monkeypatch.setattr(S, "kernel_id", lambda: None)
    cuda_up(monkeypatch)
    s = nvkit.select_gpus([3])
    assert s.restart_needed and not s.saved
    assert "Start the process again with: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3" in capsys.readouterr().err
    assert not saved_file().parent.exists() or not list(saved_file().parent.iterdir())


def test_in_force_comes_from_torch_when_cuda_is_up(monkeypatch):
    gs = nvkit.gpus()
    cuda_up(monkeypatch)
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"          # stale: CUDA really uses 3 and 1
    monkeypatch.setattr(S, "_torch_cuda_bus_ids", lambda: [gs[3].pci_bus_id.lower(), gs[1].pci_bus_id])
    assert nvkit.selection().choice == (3, 1)
    assert nvkit.select_gpus([3, 1]).in_force


def simulate_restart(monkeypatch, pid=1):
    """The new kernel process: same kernel id, another pid, the environment it started with."""
    data = json.loads(saved_file().read_text())
    data["pid"] = pid
    saved_file().write_text(json.dumps(data))
    monkeypatch.setattr(STATE, "pending_gpus", None)
    monkeypatch.setattr(STATE, "saved_gpus_applied", False)
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ.pop("CUDA_DEVICE_ORDER", None)
    cuda_up(monkeypatch, False)


def test_saved_choice_is_applied_once_after_the_restart(monkeypatch, capsys):
    cuda_up(monkeypatch)
    nvkit.select_gpus([2, 0])
    assert S.apply_saved() is None                            # same process: still waiting
    simulate_restart(monkeypatch)
    capsys.readouterr()
    s = S.apply_saved()
    out = capsys.readouterr().out
    assert s is not None and s.in_force and visible() == "2,0"
    assert out.startswith("nvkit: applied the GPU choice saved before this kernel restarted")
    assert "CUDA_VISIBLE_DEVICES=2,0" in out and "cuda:0=GPU 2, cuda:1=GPU 0" in out
    assert not saved_file().exists()                          # consumed
    assert S.apply_saved() is None                            # once per process


def test_a_restarted_kernel_reusing_the_pid_still_applies(monkeypatch):
    cuda_up(monkeypatch)
    nvkit.select_gpus([3])
    simulate_restart(monkeypatch, pid=os.getpid())
    data = json.loads(saved_file().read_text())
    data["process"] = f"{os.getpid()}:0"                     # same pid, another start time
    saved_file().write_text(json.dumps(data))
    assert S.apply_saved().choice == (3,) and visible() == "3"


def test_saved_choice_is_matched_by_uuid(monkeypatch, capsys):
    gs = nvkit.gpus()
    cuda_up(monkeypatch)
    nvkit.select_gpus([0])
    data = json.loads(saved_file().read_text())
    data["uuids"] = [gs[3].uuid]             # the GPU moved to index 3 after a reboot
    saved_file().write_text(json.dumps(data))
    simulate_restart(monkeypatch)
    assert S.apply_saved().choice == (3,) and visible() == "3"


def test_saved_choice_not_applied_when_cuda_came_first(monkeypatch, capsys):
    cuda_up(monkeypatch)
    nvkit.select_gpus([1])
    simulate_restart(monkeypatch)
    cuda_up(monkeypatch)
    assert S.apply_saved() is None
    err = capsys.readouterr().err
    assert "NOT applied" in err and "import nvkit" in err
    assert visible() is None and saved_file().exists()        # kept for the next restart


def test_saved_choice_that_no_longer_fits_is_dropped_with_a_message(monkeypatch, capsys):
    cuda_up(monkeypatch)
    nvkit.select_gpus([3])
    simulate_restart(monkeypatch)
    data = json.loads(saved_file().read_text())
    data["uuids"] = None
    saved_file().write_text(json.dumps(data))
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")               # fewer GPUs now
    assert S.apply_saved() is None
    assert "was not applied" in capsys.readouterr().err
    assert visible() is None and not saved_file().exists()


def test_saved_choices_never_reach_other_processes(monkeypatch, capsys):
    cuda_up(monkeypatch)
    nvkit.select_gpus([1])
    simulate_restart(monkeypatch)
    monkeypatch.setattr(S, "kernel_id", lambda: None)         # a script, a subprocess
    assert S.apply_saved() is None
    monkeypatch.setattr(STATE, "saved_gpus_applied", False)
    monkeypatch.setattr(S, "kernel_id", lambda: "another-kernel")
    assert S.apply_saved() is None
    assert visible() is None and capsys.readouterr().out == ""


def test_unreadable_saved_file(monkeypatch, capsys):
    saved_file().parent.mkdir(parents=True)
    saved_file().write_text("{not json")
    assert S.apply_saved() is None
    assert "unreadable" in capsys.readouterr().err


def test_kernel_id_outside_a_kernel_is_none():
    assert REAL_KERNEL_ID() is None


def test_real_cuda_boundary_is_false_without_cuda():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: tests/gpu covers the real boundary")
    assert S._cuda_driver_initialized() is False
    assert REAL_CUDA_INITIALIZED() is False


# --- launch lines -----------------------------------------------------------------------------

def test_launch_line_from_the_guide():
    nvkit.select_gpus([2, 0])
    line = nvkit.launch_command("train.py")
    assert line == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 torchrun --nproc_per_node=2 train.py"
    assert line.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,0"}
    assert line.argv == ["torchrun", "--nproc_per_node=2", "train.py"]


def test_launch_line_options():
    nvkit.select_gpus([2, 0])
    assert nvkit.launch_command("train.py", nproc_per_node=1) == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 torchrun --nproc_per_node=1 train.py"
    assert nvkit.launch_command("my train.py", standalone=True, nnodes=1, max_restarts=None,
                                args=["--lr", "1e-4", "--out", "a b"]) == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 torchrun --nproc_per_node=2 "
        "--standalone --nnodes=1 'my train.py' --lr 1e-4 --out 'a b'")
    assert nvkit.launch_command("train.py", gpus=[3]) == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3 torchrun --nproc_per_node=1 train.py"


def test_launch_line_accelerate():
    nvkit.select_gpus([2, 0])
    assert nvkit.launch_command("train.py", launcher="accelerate", mixed_precision="bf16") == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,0 accelerate launch --num_processes=2 "
        "--multi_gpu --mixed_precision=bf16 train.py")
    assert nvkit.launch_command("train.py", launcher="accelerate", gpus=[1]) == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 accelerate launch --num_processes=1 train.py"
    assert nvkit.launch_command("train.py", launcher="accelerate", gpus=[]) == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES= accelerate launch --num_processes=1 --cpu train.py"


def test_launch_line_all_and_cpu():
    assert nvkit.launch_command("t.py") == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --nproc_per_node=4 t.py"
    nvkit.select_gpus([])
    assert nvkit.launch_command("t.py") == \
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES= torchrun --nproc_per_node=1 t.py"


@pytest.mark.parametrize("kwargs,words", [
    (dict(nproc_per_node=0), "positive integer"), (dict(launcher="mpirun"), "torchrun' or 'accelerate"),
    (dict(gpus=[9]), "does not exist"),
])
def test_launch_line_errors(kwargs, words):
    with pytest.raises(NvkitError, match=words):
        nvkit.launch_command("t.py", **kwargs)


# --- the selector widget (its logic; tests/ui drives it in a browser) ---------------------------

def selector(**kw):
    from nvkit.ui.gpu_selector import GPUSelector
    return GPUSelector(refresh_interval=None, **kw)


def test_selector_tick_order_is_cuda_order():
    s = selector()
    assert s.mode.value == "all" and s.choice is None and len(s._rows) == 4
    s._rows[2].check.value = True
    s._rows[0].check.value = True
    assert s.mode.value == "gpus" and s.choice == (2, 0)
    assert "CUDA_VISIBLE_DEVICES=2,0" in s.env_line.value
    assert "cuda:0 = GPU 2" in s.mapping.value and "--nproc_per_node=2" in s.mapping.value
    assert s._rows[2].slot.value == "<code>cuda:0</code>" and s._rows[0].slot.value == "<code>cuda:1</code>"
    assert s.code() == "import nvkit\nnvkit.select_gpus([2, 0])\n"
    s._rows[0].up.click()
    assert s.choice == (0, 2) and s._rows[0].up.disabled and not s._rows[0].down.disabled
    s._rows[0].down.click()
    assert s.choice == (2, 0)
    s._rows[2].check.value = False
    assert s.choice == (0,)
    s.close()


def test_selector_apply_sets_the_environment():
    s = selector()
    s._rows[3].check.value = True
    s._rows[1].check.value = True
    sel = s.apply_button.click() or nvkit.selection()
    assert visible() == "3,1" and sel.choice == (3, 1)
    assert "nvkit-applied" in s.status.value
    s.mode.value = "cpu"
    assert s.choice == () and not any(r.check.value for r in s._rows.values())
    assert s.code().endswith("nvkit.select_gpus([])  # CPU only\n")
    s.apply()
    assert visible() == ""
    s.mode.value = "all"
    assert s.code().endswith("nvkit.select_gpus(None)  # all GPUs\n")
    s.apply()
    assert visible() is None


def test_selector_starts_from_the_choice_in_force():
    nvkit.select_gpus([3, 0])
    s = selector()
    assert s.mode.value == "gpus" and s.choice == (3, 0)
    assert s._rows[3].check.value and s._rows[0].check.value
    nvkit.select_gpus([])
    assert selector().mode.value == "cpu"


def test_selector_restart_warning(monkeypatch):
    nvkit.select_gpus([0])
    cuda_up(monkeypatch)
    s = selector()
    s._rows[1].check.value = True                      # now [0, 1]
    assert "nvkit-restart-warning" in s.status.value   # the preview already warns
    sel = s.apply()
    assert sel.restart_needed and sel.saved and visible() == "0"
    assert "nvkit-restart-warning" in s.status.value and "kernel restart" in s.status.value
    assert saved_file().exists()


def test_selector_nothing_ticked_and_errors():
    s = selector()
    s.mode.value = "gpus"
    assert s.apply_button.disabled and s.apply() is None and "nvkit-error" in s.status.value
    assert visible() is None


def test_selector_without_gpus(monkeypatch):
    monkeypatch.delenv("NVKIT_FAKE_GPUS")
    monkeypatch.setattr(G, "_nvml_source", _NoDriver())
    s = selector()
    assert not s._rows and "No GPUs" in s.header.value and "no NVIDIA driver" in s.header.value
    s.mode.value = "cpu"
    s.apply()
    assert visible() == ""


def test_selector_live_memory_refresh():
    import time
    from nvkit.ui.gpu_selector import GPUSelector
    s = GPUSelector(refresh_interval=0.05)
    src = G._source()
    src._t0 -= 5                                       # move the fake wave along
    deadline = time.monotonic() + 5
    first = s._rows[0].mem.value
    while s._rows[0].mem.value == first and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s._rows[0].mem.value != first and 0 < s._rows[0].bar.value < 0.05
    assert s._thread.is_alive()
    s.close()
    s._thread.join(2)
    assert not s._thread.is_alive()


def test_selector_disables_gpus_outside_the_inherited_set(monkeypatch):
    monkeypatch.setattr(S, "_STARTUP", {S.ORDER: "PCI_BUS_ID", S.VISIBLE: "1,3"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    s = selector()
    assert [i for i, r in s._rows.items() if r.check.disabled] == [0, 2]
    assert "started with <code>CUDA_VISIBLE_DEVICES=1,3" in s.header.value
    assert s.mode.value == "gpus" and s.choice == (1, 3)
