"""The GPU choice saved for a kernel restart is nvkit's own file in ``NVKIT_CACHE``, which may be a
shared folder: it is written ``0600`` in a ``0700`` folder through a fresh temporary file (a planted
symlink is replaced, never written through), read without following links, and a file that is not
one nvkit wrote is ignored with one warning, never an exception at ``import nvkit`` or
``%load_ext nvkit`` (checked in real IPython kernels)."""

import importlib
import json
import os
import stat
import threading

import nbformat
import pytest
from nbclient import NotebookClient

import nvkit
from nvkit import cache

S = importlib.import_module("nvkit.hardware.selection")


@pytest.fixture(autouse=True)
def fake(fake_gpus, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)                      # a scratch folder everyone can write to
    fake_gpus("k-files", cache=shared, cuda_up=True)      # CUDA up: a choice now waits for a restart
    return shared


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def saved():
    return S._saved_path("k-files")


# --- writing -----------------------------------------------------------------------------------

def test_the_saved_choice_is_private(fake):
    assert nvkit.select_gpus([1]).saved
    assert mode(saved()) == 0o600 and mode(saved().parent) == 0o700
    assert json.loads(saved().read_text())["choice"] == [1]
    assert mode(fake) == 0o777                                  # the user's own folder is left as it is
    assert not [p.name for p in saved().parent.iterdir() if p.name != saved().name]   # no temp file left


def test_a_missing_cache_root_is_created_private(monkeypatch, tmp_path):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "new" / "nvkit"))
    assert nvkit.select_gpus([2]).saved
    assert mode(tmp_path / "new" / "nvkit") == 0o700 and mode(saved()) == 0o600


def test_an_existing_open_folder_of_ours_is_narrowed(fake):
    (fake / "selections").mkdir()
    (fake / "selections").chmod(0o777)
    assert nvkit.select_gpus([1]).saved
    assert mode(fake / "selections") == 0o700


def test_planted_symlinks_at_the_file_names_are_not_written_through(fake, tmp_path):
    d = fake / "selections"
    d.mkdir(mode=0o700)
    victims = []
    for name in (saved().name, saved().with_suffix(".tmp").name):   # the file, and the old fixed temp name
        victim = tmp_path / f"victim-{len(victims)}"
        victim.write_text("the user's data")
        (d / name).symlink_to(victim)
        victims.append(victim)
    assert nvkit.select_gpus([3]).saved
    for victim in victims:
        assert victim.read_text() == "the user's data"
    assert not saved().is_symlink() and json.loads(saved().read_text())["choice"] == [3]
    assert mode(saved()) == 0o600


def test_a_planted_symlink_folder_is_refused(fake, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (fake / "selections").symlink_to(elsewhere)
    s = nvkit.select_gpus([1])
    assert s.restart_needed and not s.saved
    err = capsys.readouterr().err
    assert "could not save the GPU choice" in err and "symlink" in err
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to plant another user's folder")
def test_another_users_folder_is_refused(fake, capsys):
    d = fake / "selections"
    d.mkdir()
    os.chown(d, 65534, 65534)
    assert not nvkit.select_gpus([1]).saved
    assert "belongs to another user" in capsys.readouterr().err
    assert list(d.iterdir()) == []


# --- reading -----------------------------------------------------------------------------------

CORRUPT = ["[1, 2]", "5", '"2,0"', "null", '{"choice": "2,0"}', '{"choice": [1.5]}', '{"choice": [1], "uuids": 5}',
           '{"choice": [1], "pid": "x"}', "{not json", "", b"\xff\xfe\x00"]


@pytest.mark.parametrize("content", CORRUPT, ids=[repr(c)[:24] for c in CORRUPT])
def test_a_corrupt_saved_choice_is_ignored_with_one_warning(content, capsys):
    saved().parent.mkdir(parents=True)
    if isinstance(content, bytes):
        saved().write_bytes(content)
    else:
        saved().write_text(content)
    assert S.apply_saved() is None
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("nvkit: ignoring an unreadable saved GPU choice"), cap.err
    assert cap.out == "" and os.environ.get("CUDA_VISIBLE_DEVICES") is None


def _valid_choice_elsewhere(tmp_path, choice):
    f = tmp_path / "elsewhere.json"
    f.write_text(json.dumps({"kernel_id": "k-files", "pid": 1, "process": "1:0", "choice": choice, "uuids": None}))
    return f


def test_a_symlink_at_the_saved_file_is_not_followed(tmp_path, capsys):
    saved().parent.mkdir(parents=True)
    saved().symlink_to(_valid_choice_elsewhere(tmp_path, [2]))
    assert S.apply_saved() is None
    assert "symlink" in capsys.readouterr().err and os.environ.get("CUDA_VISIBLE_DEVICES") is None


def test_a_fifo_at_the_saved_file_does_not_hang(capsys):
    saved().parent.mkdir(parents=True)
    os.mkfifo(saved())
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("v", S.apply_saved()), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading the saved choice blocked on a FIFO"
    assert result["v"] is None and "not a regular file" in capsys.readouterr().err


def test_cache_helpers_refuse_what_they_cannot_vouch_for(tmp_path):
    f = tmp_path / "big"
    f.write_text("x" * 100)
    with pytest.raises(OSError, match="larger than"):
        cache.read_private(f, limit=10)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="is not a folder"):
        cache.private_dir(tmp_path / "file")


# --- import nvkit / %load_ext nvkit in real kernels --------------------------------------------

PLANT = """
import os, pathlib, re
from ipykernel.kernelapp import IPKernelApp
name = pathlib.Path(IPKernelApp.instance().connection_file).name
kid = re.sub(r"[^A-Za-z0-9_.-]", "_", name[7:-5] if name.startswith("kernel-") else name[:-5])
d = pathlib.Path(os.environ["NVKIT_CACHE"]) / "selections"
d.mkdir(parents=True, exist_ok=True)
(d / f"kernel-{kid}.json").write_text(%r)
print("planted", sorted(p.name for p in d.iterdir()))
"""


def run_cells(*sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
    NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True).execute()
    return nb


def outputs(cell, kind):
    if kind == "error":
        return [f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"]
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == kind)


@pytest.mark.parametrize("content, first", [("[1, 2]", "import nvkit\nprint('imported')"),
                                            ("5", "%load_ext nvkit\nprint('imported')")])
def test_corrupt_saved_choice_in_a_real_kernel(fake, content, first):
    nb = run_cells(PLANT % content, first, "%load_ext nvkit", '%nvkit generate -n 3 "NVIDIA GPUs are"', "%nvkit gpus")
    assert "planted" in outputs(nb.cells[0], "stdout")
    for cell in nb.cells:
        assert outputs(cell, "error") == [], outputs(cell, "error")
    assert outputs(nb.cells[1], "stdout").strip() == "imported"
    warnings = [ln for c in nb.cells for ln in outputs(c, "stderr").splitlines()
                if "saved GPU choice" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("nvkit: ignoring an unreadable saved GPU choice")
    assert "\nNVIDIA GPUs are" in outputs(nb.cells[3], "stdout")
    assert "NVIDIA H200 (fake)" in outputs(nb.cells[4], "stdout")
