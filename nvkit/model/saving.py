"""Folders nvkit writes for the user (adapters, checkpoints, exports, launch runs) and the one rule
they follow: nvkit never deletes or overwrites a file it did not write.

Each such folder holds a marker file, ``nvkit.json`` (what wrote it, when, and the facts worth
keeping: the run's settings, its data, its final evaluation). A folder is replaced only when it
carries that marker; a folder without it, or a file where a folder should go, is refused with an
``NvkitError`` that says what to do. A replacement is written to a temporary sibling first and
renamed into place; the old folder is moved aside until the new one is complete, so an interrupted
save never leaves a half-written adapter and a reader sees the old or the new one.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import tempfile

from ..errors import NvkitError, require

MARKER = "nvkit.json"
#: What nvkit writes: a finetune's adapter, a resumable checkpoint, an export (merged model or
#: adapter with a model card), a launch's run folder.
KINDS = ("adapter", "checkpoint", "export", "launch-run")
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
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    return path


def _listing(folder: str, limit: int = 4) -> str:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return ""
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f" ({shown})" if shown else ""


def check_target(target, kinds=KINDS, what: str = "folder") -> str:
    """The absolute path of ``target`` when nvkit may write a folder there: it does not exist, is
    an empty folder, or is a folder nvkit wrote (of one of ``kinds``). NvkitError otherwise."""
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
    into a temporary sibling, then rename it to ``target``. An existing ``target`` is replaced only
    when nvkit wrote it (see ``check_target``); it is moved aside until the new one is in place."""
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
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
        write_marker(tmp, kind, facts)
        old = None
        if os.path.exists(target):
            check_target(target, (kind,), kind)  # still ours (nothing replaced it meanwhile)
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-old-", dir=parent)
            os.replace(target, os.path.join(old, "x"))
        try:
            os.replace(tmp, target)
        except BaseException:
            if old is not None:  # put the previous one back
                os.replace(os.path.join(old, "x"), target)
                shutil.rmtree(old, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def move_into_place(src: str, target: str, kind: str, facts: dict | None = None) -> str:
    """Rename the finished folder ``src`` (written by someone else's saver, e.g. Trainer's
    checkpoint) to ``target`` with nvkit's marker, under the same rule as ``save_atomic``."""
    target = check_target(target, (kind,), kind)
    write_marker(src, kind, facts)
    parent = os.path.dirname(target)
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-old-", dir=parent)
        os.replace(target, os.path.join(old, "x"))
    os.replace(src, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target
