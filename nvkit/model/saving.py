"""Folders nvkit writes for the user (adapters, checkpoints, exports, launch runs) and the one rule
they follow: nvkit never deletes or overwrites a file it did not write.

Each such folder holds a marker file, ``nvkit.json`` (what wrote it, when, and the facts worth
keeping: the run's settings, its data, its final evaluation). An adapter, checkpoint or export
folder's marker also lists every file nvkit wrote there, with its size and time, because writing
it again replaces the folder: that is allowed only while it holds exactly those files, unchanged.
A folder without the marker, one that holds anything else (a notes file, an eval folder the user
added, a file they edited), or a file where a folder should go, is refused with an ``NvkitError``
that names what is in the way. A replacement is written to a temporary sibling first and renamed
into place; the old folder is moved aside until the new one is complete, so an interrupted save
never leaves a half-written adapter and a reader sees the old or the new one; then only the files
its marker lists are removed from it.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import stat
import tempfile
import warnings

from ..cache import write_atomic
from ..errors import NvkitError, require

MARKER = "nvkit.json"
#: What nvkit writes: a finetune's adapter, a resumable checkpoint, an export (merged model or
#: adapter with a model card), a launch's run folder.
KINDS = ("adapter", "checkpoint", "export", "launch-run")
#: The kinds nvkit replaces as a whole folder, and so records file by file. A launch's run folder
#: is never replaced: nvkit rewrites its own named files in it and leaves everything else alone.
REPLACED = ("adapter", "checkpoint", "export")
MARKER_FORMAT = 1


def marker(folder) -> dict | None:
    """The marker nvkit left in ``folder`` (a dict), or None when nvkit did not write it."""
    path = os.path.join(os.fspath(folder), MARKER)
    if os.path.islink(path) or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("nvkit") and data.get("kind") in KINDS else None


def owned(folder, kinds=KINDS) -> bool:
    """True when ``folder`` is one nvkit wrote (its marker names one of ``kinds``)."""
    m = marker(folder)
    return m is not None and m.get("kind") in (kinds if not isinstance(kinds, str) else (kinds,))


def write_marker(folder, kind: str, facts: dict | None = None) -> str:
    require(kind in KINDS, f"unknown marker kind {kind!r}")
    data = {"nvkit": MARKER_FORMAT, "kind": kind,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **(facts or {})}
    path = os.path.join(os.fspath(folder), MARKER)
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n", 0o644)
    return path


def _entries(folder: str, rel: str = ""):
    """(relative path, lstat) of everything under ``folder``, links not followed, folders last."""
    here = os.path.join(folder, rel) if rel else folder
    for entry in sorted(os.scandir(here), key=lambda e: e.name):
        name = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        if entry.is_dir(follow_symlinks=False):
            yield from _entries(folder, name)
        yield name, st


def written(folder: str) -> dict:
    """What nvkit just wrote into ``folder``, for its marker: every file (and link) below it but
    the marker, as relative path → [size, mtime in ns]."""
    return {rel: [st.st_size, st.st_mtime_ns] for rel, st in _entries(folder)
            if not stat.S_ISDIR(st.st_mode) and rel != MARKER}


def foreign(folder: str) -> list[str]:
    """What ``folder`` holds that nvkit did not write there (per its marker's file list): new
    files, files changed since, and folders holding no file of nvkit's (named once, with a
    trailing /). A folder without a file list (no marker, or one from an nvkit that kept none)
    has nothing nvkit may remove."""
    m = marker(folder)
    files = m.get("files") if m is not None else None
    files = files if isinstance(files, dict) else {}
    ours_dirs = {rel.rsplit("/", i)[0] for rel in files for i in range(1, rel.count("/") + 1)}
    out: list[str] = []

    def scan(rel: str) -> None:
        here = os.path.join(folder, rel) if rel else folder
        for entry in sorted(os.scandir(here), key=lambda e: e.name):
            name = f"{rel}/{entry.name}" if rel else entry.name
            if name == MARKER and m is not None:
                continue
            if entry.is_dir(follow_symlinks=False):
                if name in ours_dirs:
                    scan(name)
                else:
                    out.append(name + "/")
                continue
            st = entry.stat(follow_symlinks=False)
            if name not in files:
                out.append(name)
            elif list(files[name]) != [st.st_size, st.st_mtime_ns]:
                out.append(f"{name} (changed since nvkit wrote it)")

    scan("")
    return out


def _refuse_foreign(path: str, what: str, found: list[str]) -> None:
    if not found:
        return
    shown = ", ".join(found[:8]) + (f", ... ({len(found)} in all)" if len(found) > 8 else "")
    raise NvkitError(f"{path} holds files nvkit did not write there: {shown}. Writing the {what} again would "
                     "replace the folder, and nvkit never deletes what is not its own: move them out of the "
                     f"folder (or choose another folder for the {what}).")


def _remove_written(folder: str) -> None:
    """Remove from ``folder`` (an old copy moved aside) exactly the files its marker lists, then
    the folders they leave empty; anything else stays, and a warning says where."""
    m = marker(folder) or {}
    files = m.get("files") if isinstance(m.get("files"), dict) else {}
    for rel, (size, mtime) in files.items():
        p = os.path.join(folder, *rel.split("/"))
        try:
            st = os.lstat(p)
            if not stat.S_ISDIR(st.st_mode) and [st.st_size, st.st_mtime_ns] == [size, mtime]:
                os.unlink(p)
        except OSError:
            pass
    if m:
        try:
            os.unlink(os.path.join(folder, MARKER))
        except OSError:
            pass
    for rel, st in list(_entries(folder)):  # folders come after their contents
        p = os.path.join(folder, *rel.split("/"))
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(p)
            except OSError:
                pass
    try:
        os.rmdir(folder)
        os.rmdir(os.path.dirname(folder))
    except OSError:
        warnings.warn(f"{folder} keeps files nvkit did not write (they appeared while it replaced the folder); "
                      "nvkit left them there: move them back where you want them.", stacklevel=3)


def _listing(folder: str, limit: int = 4) -> str:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return ""
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f" ({shown})" if shown else ""


def check_target(target, kinds=KINDS, what: str = "folder") -> str:
    """The absolute path of ``target`` when nvkit may write a folder there: it does not exist, is
    an empty folder, or is a folder nvkit wrote (of one of ``kinds``) that holds, for a folder nvkit
    replaces whole (``REPLACED``), only the files its marker lists. NvkitError otherwise."""
    require(isinstance(target, (str, os.PathLike)) and str(target).strip(),
            f"{what} must be a folder path, not {target!r}.")
    path = os.path.abspath(os.path.expanduser(os.fspath(target)))
    if os.path.islink(path):
        raise NvkitError(f"{path} is a symbolic link: nvkit writes its {what} only into a real folder. "
                         "Choose another path.")
    if os.path.exists(path) and not os.path.isdir(path):
        raise NvkitError(f"{path} is a file, not a folder: nvkit will not replace it with its {what}. "
                         "Choose another path.")
    if os.path.isdir(path) and os.listdir(path) and not owned(path, kinds):
        raise NvkitError(f"{path} already holds files nvkit did not write{_listing(path)}: nvkit never deletes or "
                         f"overwrites them. Choose another (new or empty) folder for the {what}, or move them away.")
    if os.path.isdir(path) and owned(path, REPLACED):
        _refuse_foreign(path, what, foreign(path))
    return path


def make_folder(path: str, what: str = "folder") -> str:
    """``os.makedirs`` with an NvkitError that says why it failed."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise NvkitError(f"Cannot create the {what} {path}: {e.strerror or e}. Choose a writable folder.") from e
    return path


def save_atomic(model, target, extra_files: dict[str, str] | None = None, *, kind: str = "adapter",
                facts: dict | None = None) -> str:
    """Write a folder atomically: ``model.save_pretrained(tmp)`` (or ``model(tmp)`` when ``model``
    is a function that writes into a folder), the ``extra_files`` (name → text) and nvkit's marker
    (listing every file written) into a temporary sibling, then rename it to ``target``. An existing
    ``target`` is replaced only when nvkit wrote it and it holds nothing else (see ``check_target``);
    it is moved aside until the new one is in place, then only its listed files are removed."""
    target = check_target(target, (kind,), kind)
    parent = os.path.dirname(target)
    make_folder(parent, f"parent folder of the {kind}")
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-tmp-", dir=parent)
    try:
        if callable(getattr(model, "save_pretrained", None)):
            model.save_pretrained(tmp)
        else:
            model(tmp)
        for name, text in (extra_files or {}).items():
            write_atomic(os.path.join(tmp, name), text, 0o644)
        write_marker(tmp, kind, {**(facts or {}), "files": written(tmp)})
        _put_in_place(tmp, target, kind)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # nvkit's own temporary folder, made above
        raise
    return target


def _put_in_place(src: str, target: str, kind: str) -> None:
    """Rename ``src`` to ``target``; a ``target`` already there is moved aside first and checked
    again once it is aside (nothing can be added to it any more), put back when it holds anything
    nvkit did not write, else emptied of nvkit's files once ``src`` is in place."""
    parent = os.path.dirname(target)
    aside = None
    if os.path.lexists(target):
        if os.path.islink(target) or not os.path.isdir(target):
            check_target(target, (kind,), kind)  # a link or file appeared meanwhile: it says which
        aside = os.path.join(tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-old-", dir=parent), "x")
        os.replace(target, aside)
        found = foreign(aside) if owned(aside, (kind,)) else sorted(os.listdir(aside))
        if found:
            os.replace(aside, target)
            os.rmdir(os.path.dirname(aside))
            _refuse_foreign(target, kind, found)
    try:
        os.replace(src, target)
    except BaseException:
        if aside is not None:  # put the previous one back
            os.replace(aside, target)
            os.rmdir(os.path.dirname(aside))
        raise
    if aside is not None:
        _remove_written(aside)


def move_into_place(src: str, target: str, kind: str, facts: dict | None = None) -> str:
    """Rename the finished folder ``src`` (written by someone else's saver, e.g. Trainer's
    checkpoint) to ``target`` with nvkit's marker listing its files, under the same rule as
    ``save_atomic``."""
    target = check_target(target, (kind,), kind)
    write_marker(src, kind, {**(facts or {}), "files": written(src)})
    _put_in_place(src, target, kind)
    return target
