"""The files nvkit writes for itself (compile artifacts, the fast path's compile artifacts, shaped
models, the GPU choice saved for a kernel restart): where they live, how they are written, and the
one rule for reading them back.

``NVKIT_CACHE`` may name a folder other users can write to (a shared scratch disk), and some of
these files run code when loaded (torch's compile artifacts hold pickles; a saved GPU choice is
applied at ``import nvkit``). So:

- a folder nvkit makes is created ``0700``; a folder nvkit keeps its files in (:func:`own_dir`)
  must be a real folder (not a symlink someone planted) owned by this user, and is narrowed to
  ``0700``;
- a file is written to a fresh ``mkstemp`` file (``0600``, created exclusively: never an existing
  path or a link) in the same folder and renamed over the name, so a planted symlink at the name is
  replaced rather than written through and a reader never sees half a file;
- a file is read back (:func:`read_trusted_bytes`, :func:`trusted_file`) only from a folder that
  is a real folder of this user with no group or other write bit, and only when the file itself is
  a regular file of this user with no group or other write bit and one name (no hard link to a
  file planted elsewhere), opened without following a link and up to a size limit (a planted FIFO
  or a huge file cannot hang or flood ``import nvkit``). Anything else is ignored: nvkit says why
  and how to fix it in one line, once per folder per process, and carries on as if the file were
  not there (a compile runs in full, a shaped model is built, no saved choice is applied).

Why the folders above the one holding the file are not checked: the folder is opened once (no
link followed), checked on that descriptor, and the file is opened relative to it, so what is
checked is what is read. Renaming a folder higher up can only make nvkit open another folder, which
must then pass the same checks, and only this user can make a folder of theirs or put files in
it. A shared scratch folder (mode ``1777``, like ``/tmp``) is therefore fine as ``NVKIT_CACHE``:
a ``compile`` folder another user made first in it is theirs and refused; one this user made is
``0700``, and the sticky bit keeps anyone else from renaming or removing it. Checking the parents
too would refuse that normal set-up, and group-writable home folders (umask 002), for nothing.

A shaped model is the one cache handed on by its path (to transformers), which is looked up again
when loaded; :func:`trusted_folder` checks that folder and the marker file is read as above. Below
a sticky or private folder the path still names what was checked; below a folder others can write
to *without* the sticky bit, they could rename the user's folder away between the check and the
load, which is why such a folder should never be ``NVKIT_CACHE`` (``chmod +t`` it).

nvkit runs on Linux; these are POSIX calls.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

from .checks import env_path

ENV = "NVKIT_CACHE"


def root() -> Path:
    """``$NVKIT_CACHE``, else ``~/.cache/nvkit`` (not created here)."""
    base = env_path(ENV)
    return Path(base) if base else Path.home() / ".cache" / "nvkit"


def own_dir(name: str) -> Path:
    """The folder ``name`` under :func:`root`, made private (see :func:`private_dir`). The root
    itself is created ``0700`` when missing; an existing one is the user's choice and left as it
    is (it may be a link to a larger disk, or shared on purpose)."""
    base = root()
    if not base.is_dir():
        base.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
    return private_dir(base / name)


def private_dir(path: Path) -> Path:
    """``path`` as a folder only this user can use: made ``0700`` when missing (its parent must
    exist), else checked to be a real folder of this user and narrowed to ``0700``. An ``OSError``
    says why not."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, f"{path} is a symlink; nvkit keeps its own files only in a real folder "
                                   f"(remove the link, or set {ENV} to a folder of yours)")
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{path} is not a folder (move it away, or set {ENV} to a folder of yours)")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise OSError(errno.EPERM, f"{path} belongs to another user; nvkit keeps its own files only in a folder "
                                   f"of yours (set {ENV} to one)")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


# --- reading back: one rule for every cache ------------------------------------------------------

_warned: set[str] = set()


def _warn(folder: Path, what: str, where: Path, why: str, fix: str) -> None:
    """One line on stderr, once per folder per process (an import, every decode step and every
    fine-tune may ask for the same refused folder)."""
    key = os.path.abspath(folder)
    if key in _warned:
        return
    _warned.add(key)
    print(f"nvkit: {what} are not read from {where}: it {why}. {fix}", file=sys.stderr)


def _folder_fault(st: os.stat_result) -> tuple[str, str] | None:
    """(why, fix) when a folder of this ``lstat``/``fstat`` must not be read from; None when it may."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder", f"Move it away, or point {ENV} at a private folder."
    if st.st_uid != os.getuid():
        return (f"belongs to another user (uid {st.st_uid})",
                f"Point {ENV} at a folder of yours that only you can write to.")
    if stat.S_IMODE(st.st_mode) & 0o022:
        return (f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})",
                f"Make it private (chmod 700), or point {ENV} at a private folder.")
    return None


def _file_fault(st: os.stat_result, limit: int | None) -> tuple[str, str] | None:
    """(why, fix) when a file of this ``fstat`` must not be read; None when it may."""
    remove = "Remove it; nvkit writes a fresh one of its own."
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file", remove
    if st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})", remove
    if stat.S_IMODE(st.st_mode) & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})", remove
    if st.st_nlink != 1:
        # a hard link gives a file of this user a second name in a folder someone else may control
        return f"has {st.st_nlink} names (hard links)", remove
    if limit is not None and st.st_size > limit:
        return f"is larger than {limit} bytes", remove
    return None


def _open_folder(folder: Path, what: str) -> int | None:
    """A descriptor of ``folder`` when it passes the folder rule; None when there is none (quietly)
    or it fails the rule (with the warning)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP) and os.path.islink(folder):
            why, fix = "is a symlink", f"Remove the link, or point {ENV} at a private folder."
        elif e.errno in (errno.ENOTDIR, errno.ELOOP):
            why, fix = "is not a folder", f"Move it away, or point {ENV} at a private folder."
        else:
            why, fix = f"cannot be opened ({e.strerror})", f"Point {ENV} at a private folder."
        _warn(folder, what, folder, why, fix)
        return None
    fault = _folder_fault(os.fstat(fd))
    if fault:
        os.close(fd)
        _warn(folder, what, folder, *fault)
        return None
    return fd


def _open_trusted(path, what: str, limit: int | None) -> int | None:
    """A read descriptor of the file ``path`` when its folder and the file pass the rule (module
    docstring); None when there is none (quietly) or either fails the rule (with the warning)."""
    path = Path(path)
    dfd = _open_folder(path.parent, what)
    if dfd is None:
        return None
    try:
        try:
            # O_NONBLOCK: opening a planted FIFO returns at once (and is then refused) instead of hanging
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            link = e.errno == errno.ELOOP
            _warn(path.parent, what, path, "is a symlink" if link else f"cannot be opened ({e.strerror})",
                  "Remove it; nvkit reads only files it wrote, never through a link." if link
                  else "Remove it; nvkit writes a fresh one of its own.")
            return None
    finally:
        os.close(dfd)
    fault = _file_fault(os.fstat(fd), limit)
    if fault:
        os.close(fd)
        _warn(path.parent, what, path, *fault)
        return None
    return fd


def trusted_folder(path, what: str) -> Path | None:
    """``path`` when nvkit may read ``what`` (e.g. "shaped models") from it: a real folder, not a
    link, of this user, with no group or other write bit. None when there is none, or (with one
    warning saying why and how to fix it) when it is something else."""
    fd = _open_folder(Path(path), what)
    if fd is None:
        return None
    os.close(fd)
    return Path(path)


def trusted_file(path, what: str) -> Path | None:
    """``path`` when :func:`read_trusted_bytes` would read it (checked without reading it), else None."""
    fd = _open_trusted(path, what, None)
    if fd is None:
        return None
    os.close(fd)
    return Path(path)


def read_trusted_bytes(path, what: str, limit: int = 1 << 20) -> bytes | None:
    """The bytes of the file ``path`` when its folder is a :func:`trusted_folder` and it is a
    regular file of this user, with no group or other write bit and one name, at most ``limit``
    bytes, opened without following a link. None when there is no such file, or (with one warning
    per folder and process saying why and how to fix it) when it fails any of that. ``what`` names
    the cache in that warning, e.g. "compile caches"."""
    fd = _open_trusted(path, what, limit)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as a ``0600`` file, atomically, never through a link at ``path``."""
    return write_atomic(path, text, 0o600)


def read_private(path: Path, limit: int = 1 << 20) -> str:
    """The text of the regular file ``path`` (at most ``limit`` bytes), not following a symlink.
    ``FileNotFoundError`` when there is none; another ``OSError`` when it is a link, not a regular
    file, or larger than ``limit``."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symlink, not a file nvkit wrote") from e
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"{path} is larger than {limit} bytes")
        return f.read(limit).decode("utf-8")


def write_atomic(path, data: bytes | str, mode: int = 0o600) -> Path:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` with permission ``mode``, atomically
    and never through a link: a fresh ``mkstemp`` file in the same folder gets the data and the
    mode, then is renamed over the name, so whatever sits at ``path`` (a planted symlink, a file
    of someone else's) is replaced, not written through or chmod-ed. Every file nvkit writes for
    the user (run folders, model-folder markers) goes through here."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
