"""Nothing another user plants in nvkit's caches is ever loaded (issue 35): compile artifacts (torch
unpickles them), the fast path's artifacts, shaped models and the saved GPU choice are read back
only from a folder of this user that no one else can write, only from a regular file of this user,
never through a link (``nvkit.cache``); anything else is ignored with one line saying why and how
to fix it.

The planted compile blob is a real attack: ``test_the_planted_blob_runs_code_when_torch_loads_it``
shows that torch runs its pickle, so a missing marker file below means nvkit refused it. The
cross-user cases drop a subprocess to a second uid to plant the files in a mode-1777 folder, as on a
shared scratch disk; they need root (CI runs the suite as root) and skip without it."""

from __future__ import annotations

import base64
import importlib
import json
import os
import pickle
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from nvkit import NvkitError, cache, demo
from nvkit.generate.fast import artifacts
from nvkit.train.compile import CompileCache

S = importlib.import_module("nvkit.hardware.selection")

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="planting files as a second user needs root (os.setuid); "
                                                 "CI runs the suite as root")


def _other_uid() -> int:
    """nobody's uid, or a number no account uses."""
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        used = {p.pw_uid for p in pwd.getpwall()}
        return next(u for u in range(54321, 1 << 20) if u not in used)


OTHER = _other_uid() if ROOT else None


# --- the attack: a compile-artifact blob whose pickle runs a command --------------------------------

class _RunsACommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def evil_blob(marker: Path) -> bytes:
    """What ``torch.compiler.save_cache_artifacts`` writes, holding one inductor artifact whose
    content is a pickle that runs ``touch marker``: ``load_cache_artifacts`` unpickles an inductor
    artifact's content (to unpack its triton bundle) while loading it."""
    from torch._inductor.codecache import InductorCacheArtifact
    from torch.compiler._cache import _serialize_single_cache
    from torch.utils._appending_byte_serializer import AppendingByteSerializer

    s = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    s.append(("inductor", [InductorCacheArtifact("planted", pickle.dumps(_RunsACommand(marker)))]))
    return s.to_bytes()


@pytest.fixture
def marker(tmp_path, monkeypatch):
    # torch writes a loaded artifact into its own cache folder: keep that inside the test too
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    return tmp_path / "the-planted-pickle-ran"


def test_the_planted_blob_runs_code_when_torch_loads_it(marker):
    import torch
    try:
        torch.compiler.load_cache_artifacts(evil_blob(marker))
    except Exception:  # noqa: BLE001 - the pickle has run by the time torch trips over what it returned
        pass
    assert marker.exists(), "the test blob no longer runs code in this torch: the tests below prove nothing"


# --- the rule itself ---------------------------------------------------------------------------------

def _folder(tmp_path, name="c", mode=0o700) -> Path:
    d = tmp_path / name
    d.mkdir()
    d.chmod(mode)
    return d


def _warnings(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("nvkit: ")]


def test_a_file_of_ours_in_a_private_folder_is_read(tmp_path, capsys):
    f = _folder(tmp_path) / "a.bin"
    f.write_bytes(b"artifacts")
    assert cache.read_trusted_bytes(f, "test caches") == b"artifacts"
    assert cache.trusted_file(f, "test caches") == f and cache.trusted_folder(f.parent, "test caches") == f.parent
    assert cache.read_trusted_bytes(f.parent / "missing", "test caches") is None   # none: quietly
    assert cache.trusted_folder(tmp_path / "no-such-folder", "test caches") is None
    assert _warnings(capsys) == []


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702], ids=lambda m: f"{m:04o}")
def test_a_folder_others_can_write_is_not_read_from(tmp_path, capsys, mode):
    d = _folder(tmp_path, mode=mode)
    (d / "a.bin").write_bytes(b"x")
    (d / "b.bin").write_bytes(b"y")
    assert cache.read_trusted_bytes(d / "a.bin", "compile caches") is None
    assert cache.read_trusted_bytes(d / "b.bin", "compile caches") is None
    assert cache.trusted_folder(d, "compile caches") is None
    said = _warnings(capsys)
    assert said == [f"nvkit: compile caches are not read from {d}: it is writable by others (mode {mode:04o}). "
                    "Make it private (chmod 700), or point NVKIT_CACHE at a private folder."]   # once per folder


def test_a_symlinked_folder_is_not_read_from(tmp_path, capsys):
    real = _folder(tmp_path, "real")
    (real / "a.bin").write_bytes(b"x")
    (tmp_path / "link").symlink_to(real)
    assert cache.read_trusted_bytes(tmp_path / "link" / "a.bin", "compile caches") is None
    assert cache.trusted_folder(tmp_path / "link", "compile caches") is None
    [said] = _warnings(capsys)
    assert "is a symlink" in said and "NVKIT_CACHE" in said


def test_a_symlink_or_a_hard_link_at_the_name_is_not_read(tmp_path, capsys):
    d, elsewhere = _folder(tmp_path), _folder(tmp_path, "elsewhere")
    (elsewhere / "theirs").write_bytes(b"x")
    (d / "sym.bin").symlink_to(elsewhere / "theirs")
    assert cache.read_trusted_bytes(d / "sym.bin", "compile caches") is None
    d2 = _folder(tmp_path, "d2")
    os.link(elsewhere / "theirs", d2 / "hard.bin")
    assert cache.read_trusted_bytes(d2 / "hard.bin", "compile caches") is None
    said = _warnings(capsys)
    assert len(said) == 2 and "is a symlink" in said[0] and "has 2 names (hard links)" in said[1]


def test_a_fifo_is_not_read_and_does_not_hang(tmp_path, capsys):
    f = _folder(tmp_path) / "a.bin"
    os.mkfifo(f, 0o600)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("v", cache.read_trusted_bytes(f, "compile caches")),
                         daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a planted FIFO blocked"
    assert got["v"] is None and "is not a regular file" in _warnings(capsys)[0]


def test_a_file_others_can_write_or_too_large_is_not_read(tmp_path, capsys):
    f = _folder(tmp_path) / "a.bin"
    f.write_bytes(b"x" * 100)
    f.chmod(0o666)
    assert cache.read_trusted_bytes(f, "compile caches") is None
    g = _folder(tmp_path, "d2") / "b.bin"
    g.write_bytes(b"x" * 100)
    assert cache.read_trusted_bytes(g, "compile caches", limit=10) is None
    said = _warnings(capsys)
    assert "is writable by others (mode 0666)" in said[0] and "is larger than 10 bytes" in said[1]


@needs_root
def test_a_file_or_folder_of_another_user_is_not_read(tmp_path, capsys):
    d = _folder(tmp_path)
    (d / "a.bin").write_bytes(b"x")
    os.chown(d / "a.bin", OTHER, OTHER)
    assert cache.read_trusted_bytes(d / "a.bin", "compile caches") is None
    d2 = _folder(tmp_path, "d2")
    (d2 / "a.bin").write_bytes(b"x")
    os.chown(d2, OTHER, OTHER)
    assert cache.read_trusted_bytes(d2 / "a.bin", "compile caches") is None
    said = _warnings(capsys)
    assert len(said) == 2 and all(f"belongs to another user (uid {OTHER})" in s for s in said)
    assert said[0].startswith(f"nvkit: compile caches are not read from {d / 'a.bin'}")


# --- the callers, planted by this same user where a folder is open to others -----------------------

def _facts():
    return {"config": {"model_type": "qwen3", "hidden_size": 64}, "planted": True}


def test_compile_cache_in_a_folder_others_can_write_is_not_loaded(tmp_path, monkeypatch, marker, capsys):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "nvkit"))
    _folder(tmp_path, "nvkit")
    _folder(tmp_path / "nvkit", "compile", mode=0o777)
    cc = CompileCache(_facts())
    Path(cc.path).write_bytes(evil_blob(marker))
    got = cc.load()
    assert not marker.exists(), "nvkit ran a pickle from a folder others can write"
    assert got == "cold (no saved artifacts)" and not cc.warm
    [said] = _warnings(capsys)
    assert said.startswith(f"nvkit: compile caches are not read from {tmp_path / 'nvkit' / 'compile'}: "
                           "it is writable by others")


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_fast_decode_artifacts_through_a_link_are_not_loaded(tmp_path, monkeypatch, marker, capsys, link):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "nvkit"))
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(evil_blob(marker))
    elsewhere.chmod(0o600)
    d = cache.own_dir("fast-decode")
    (d / "abc.bin").symlink_to(elsewhere) if link == "symlink" else os.link(elsewhere, d / "abc.bin")
    assert artifacts.restore("abc") is False
    assert not marker.exists(), f"nvkit ran a pickle through a {link}"
    [said] = _warnings(capsys)
    assert ("is a symlink" if link == "symlink" else "has 2 names (hard links)") in said


def test_fast_decode_folder_is_made_private(tmp_path, monkeypatch, marker):
    import torch
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "nvkit"))
    torch.compiler.reset()
    torch.compile(lambda x: (x.tan() * 3).sum())(torch.randn(8))
    assert artifacts.store("abc") == tmp_path / "nvkit" / "fast-decode" / "abc.bin"
    for p, want in ((tmp_path / "nvkit", 0o700), (tmp_path / "nvkit" / "fast-decode", 0o700),
                    (tmp_path / "nvkit" / "fast-decode" / "abc.bin", 0o600)):
        assert stat.S_IMODE(os.lstat(p).st_mode) == want, p


def _plant_shaped(folder: Path, fingerprint: str) -> dict:
    from nvkit.demo.shaped import _MARKER
    return {folder: None, folder / _MARKER: json.dumps({"fingerprint": fingerprint}).encode(),
            folder / "config.json": b'{"planted": true}'}


def test_a_shaped_model_folder_others_can_write_is_rebuilt_not_loaded(tmp_path, monkeypatch, capsys):
    from nvkit.demo.shaped import _fingerprint
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "nvkit"))
    shaped = _folder(_folder(tmp_path, "nvkit"), "shaped")
    for p, data in _plant_shaped(shaped / "qwen3-tiny", _fingerprint("qwen3-tiny")).items():
        p.mkdir() if data is None else p.write_bytes(data)
    (shaped / "qwen3-tiny").chmod(0o777)
    got = Path(demo.shaped("qwen3-tiny"))
    assert json.loads((got / "config.json").read_text()).get("model_type") == "qwen3", "the planted model was used"
    assert "shaped models are not read from" in capsys.readouterr().err
    assert demo.shaped("qwen3-tiny") == str(got)   # nvkit's own build is reused


# --- the same, planted by another user in a shared (1777) NVKIT_CACHE --------------------------------

_PLANT = """
import base64, json, os, sys
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
assert os.getuid() == uid and os.geteuid() == uid
for path, data in json.load(sys.stdin):
    if data is None:
        os.mkdir(path, 0o755)
    else:
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
"""


def plant(files: dict) -> None:
    """Create ``files`` (path -> bytes, or None for a folder, in order) as the other user."""
    todo = [[str(p), None if d is None else base64.b64encode(d).decode()] for p, d in files.items()]
    r = subprocess.run([sys.executable, "-I", "-S", "-c", _PLANT, str(OTHER), str(OTHER)],
                       input=json.dumps(todo), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"planting as uid {OTHER} failed: {r.stderr}"
    for p in files:
        assert os.lstat(p).st_uid == OTHER


@pytest.fixture
def shared(monkeypatch):
    """A scratch folder everyone can write to, like /tmp, as NVKIT_CACHE (outside pytest's own
    tmp folder, which the other user cannot enter)."""
    d = Path(tempfile.mkdtemp(prefix="nvkit-shared-"))
    d.chmod(0o1777)
    monkeypatch.setenv("NVKIT_CACHE", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
def test_another_users_compile_cache_is_not_loaded(shared, marker, capsys):
    cc = CompileCache(_facts())
    plant({shared / "compile": None, Path(cc.path): evil_blob(marker)})
    got = cc.load()
    assert not marker.exists(), "the victim ran the other user's pickle"
    assert got.startswith("cold") and not cc.warm
    [said] = _warnings(capsys)
    assert f"compile caches are not read from {shared / 'compile'}: it belongs to another user" in said
    assert "NVKIT_CACHE" in said


@needs_root
def test_another_users_fast_decode_artifacts_are_not_loaded(shared, marker, capsys):
    plant({shared / "fast-decode": None, shared / "fast-decode" / "abc.bin": evil_blob(marker)})
    assert artifacts.restore("abc") is False
    assert not marker.exists(), "the victim ran the other user's pickle"
    assert "belongs to another user" in capsys.readouterr().err


@needs_root
def test_another_users_shaped_model_is_not_loaded(shared, capsys):
    from nvkit.demo.shaped import _fingerprint
    plant({shared / "shaped": None, **_plant_shaped(shared / "shaped" / "qwen3-tiny", _fingerprint("qwen3-tiny"))})
    with pytest.raises(NvkitError, match="belongs to another user"):
        demo.shaped("qwen3-tiny")
    assert f"shaped models are not read from {shared / 'shaped' / 'qwen3-tiny'}" in capsys.readouterr().err


@needs_root
def test_another_users_shaped_model_in_our_open_folder_is_replaced(shared, capsys):
    from nvkit.demo.shaped import _fingerprint
    (shared / "shaped").mkdir()
    (shared / "shaped").chmod(0o777)            # ours, left open (an old umask)
    plant(_plant_shaped(shared / "shaped" / "qwen3-tiny", _fingerprint("qwen3-tiny")))
    got = Path(demo.shaped("qwen3-tiny"))
    assert json.loads((got / "config.json").read_text()).get("model_type") == "qwen3", "the planted model was used"
    assert os.lstat(got).st_uid == os.getuid() and stat.S_IMODE(os.lstat(shared / "shaped").st_mode) == 0o700


@pytest.fixture
def kernel(fake_gpus):
    """A kernel restarting with 4 (fake) GPUs and CUDA not yet started: a saved choice is applied.
    The path its saved choice is read from."""
    return fake_gpus("k-victim")


_CHOICE = json.dumps({"kernel_id": "k-victim", "pid": 1, "process": "1:0", "choice": [2], "uuids": None}).encode()


def test_a_saved_choice_in_a_folder_others_can_write_is_ignored(tmp_path, monkeypatch, kernel, capsys):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "nvkit"))
    d = _folder(_folder(tmp_path, "nvkit"), "selections", mode=0o777)
    (d / kernel.name).write_bytes(_CHOICE)
    assert S.apply_saved() is None
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None, "the planted choice was applied"
    assert "saved GPU choices are not read from" in capsys.readouterr().err


@needs_root
def test_another_users_saved_choice_is_ignored(shared, kernel, capsys):
    plant({shared / "selections": None, kernel: _CHOICE})
    assert S.apply_saved() is None
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None, "the other user chose this kernel's GPUs"
    [said] = _warnings(capsys)
    assert said.startswith(f"nvkit: saved GPU choices are not read from {shared / 'selections'}: "
                           "it belongs to another user")
