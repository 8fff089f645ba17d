"""A tutorial written into the server's root through its contents manager: in the form the contents
API carries notebooks, all or nothing. No request data here: the route (handlers.py) has checked
the tutorial's name and the target path.

Contents managers may write more than the ``.ipynb``: jupytext's writes the paired text files its
``jupytext.toml`` names (``src/NN-name.py``), making their folders first. When such a save fails
half-way, what this copy made (files and folders that were not there before) is removed again;
anything that was there before is left as it was.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nbformat
from jupyter_server.utils import ensure_async


def read_tutorial(path: Path) -> nbformat.NotebookNode:
    """The tutorial as the contents API's models carry a notebook: nbformat's normalized form, with
    every ``source`` and text output one string. The .ipynb on disk splits them into lists of
    lines; contents managers that turn a notebook into text (jupytext) expect strings."""
    with open(path, encoding="utf-8") as f:
        return nbformat.read(f, as_version=4)


def _cells(nb) -> list:
    return [(c.get("cell_type"), c.get("source")) for c in nb.get("cells", [])]


def same_as_tutorial(copy, tutorial) -> bool:
    """Whether a copy (a contents model's notebook) is the tutorial as shipped: the same cells, and
    no outputs yet. Such a copy holds nothing of the user's, so opening it needs no question."""
    if not isinstance(copy, dict):
        return False
    if any(c.get("outputs") for c in copy.get("cells", [])):
        return False
    return _cells(copy) == _cells(tutorial)


async def _paired_paths(cm, dest: str, nb) -> list[str]:
    """The other files jupytext's contents manager writes with ``dest`` (``[]`` for any other
    manager). Asked of jupytext the way its own save asks, so its config (``jupytext.toml`` in the
    folder or above, a global one) decides. Best effort: when it cannot be worked out, a failed
    save's cleanup covers ``dest`` and its new folders only."""
    if not (hasattr(cm, "formats") and hasattr(cm, "get_config")):
        return []
    try:
        from jupytext.config import notebook_formats
        from jupytext.formats import long_form_multiple_formats
        from jupytext.paired_paths import find_base_path_and_format, full_path

        config = await ensure_async(cm.get_config(dest))
        formats = long_form_multiple_formats(notebook_formats(nb, config, dest))
        if not formats:
            return []
        base, _ = find_base_path_and_format(dest, formats)
        return [p for p in (full_path(base, f) for f in formats) if p != dest]
    except Exception:      # another jupytext version, a broken config: the save itself will say
        return []


def _os_path(real_root: str, api_path: str) -> str | None:
    """``api_path`` on disk, only when it lies inside the root (links resolved)."""
    p = os.path.join(real_root, *[x for x in api_path.split("/") if x])
    parent = os.path.realpath(os.path.dirname(p))
    if os.path.commonpath([real_root, parent]) != real_root:
        return None
    return os.path.join(parent, os.path.basename(p))


class _Undo:
    """What a save into a file-system root may create, noted before it runs; ``run()`` removes the
    files and (empty) folders among them that did not exist before."""

    def __init__(self, root: str, api_paths: list[str]):
        self.real_root = os.path.realpath(root)
        self.new_files: list[str] = []
        self.new_dirs: set[str] = set()
        # the checkpoint folder a first save makes next to the notebook (.ipynb_checkpoints)
        self.folder = _os_path(self.real_root, api_paths[0])
        self.folder = self.folder and os.path.dirname(self.folder)
        try:
            self.names_before = set(os.listdir(self.folder)) if self.folder else None
        except OSError:
            self.names_before = None
        for api_path in api_paths:
            target = _os_path(self.real_root, api_path)
            if target is None or os.path.lexists(target):
                continue
            self.new_files.append(target)
            d = os.path.dirname(target)
            while d != self.real_root and d.startswith(self.real_root + os.sep) \
                    and not os.path.lexists(d):
                self.new_dirs.add(d)
                d = os.path.dirname(d)

    def run(self) -> None:
        for f in self.new_files:
            try:
                if stat.S_ISREG(os.lstat(f).st_mode):   # a file the save wrote, never a link
                    os.unlink(f)
            except OSError:
                pass
        dirs = sorted(self.new_dirs, key=len, reverse=True)      # deepest first
        if self.names_before is not None:
            try:
                dirs += [os.path.join(self.folder, n) for n in os.listdir(self.folder)
                         if n not in self.names_before]
            except OSError:
                pass
        for d in dirs:
            try:
                if stat.S_ISDIR(os.lstat(d).st_mode):
                    os.rmdir(d)      # only when empty: something else put there stays
            except OSError:
                pass


async def save_or_undo(cm, nb, dest: str, root: str | None) -> dict:
    """Save notebook ``nb`` at ``dest`` (a contents-manager path) and return the manager's model.
    On failure, remove what this save created, then raise the manager's error. ``root`` is the
    folder a file-system manager serves (None for one that keeps files elsewhere: there only
    ``dest`` itself is removed, when this save created it)."""
    paths = [dest] + await _paired_paths(cm, dest, nb)
    undo = _Undo(root, paths) if root is not None else None
    created = not await ensure_async(cm.file_exists(dest))
    # a notebook's first save also makes a checkpoint of it: one made now is this copy's too
    had_checkpoints = True
    if created:
        try:
            had_checkpoints = bool(await ensure_async(cm.list_checkpoints(dest)))
        except Exception:    # unknown: then no checkpoint is removed
            pass
    try:
        return await ensure_async(cm.save({"type": "notebook", "format": "json", "content": nb},
                                          dest))
    except BaseException:
        # each step on its own: the save's error is the one to report, and one failed step must
        # not keep the others from running
        if created and not had_checkpoints:
            try:
                for cp in await ensure_async(cm.list_checkpoints(dest)):
                    await ensure_async(cm.delete_checkpoint(cp["id"], dest))
            except Exception:
                pass
        if undo is not None:
            undo.run()
        elif created:
            try:
                if await ensure_async(cm.file_exists(dest)):
                    await ensure_async(cm.delete_file(dest))
            except Exception:
                pass
        raise
