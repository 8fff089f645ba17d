"""The files nvkit writes for itself (the GPU choice saved for a kernel restart, the shaped-model
cache): where they live and how they are written and read.

``NVKIT_CACHE`` may name a folder other users can write to (a shared scratch disk), and a saved
GPU choice is read back at ``import nvkit``. So:

- a folder nvkit makes is created ``0700``; a folder nvkit keeps its files in must be a real
  folder (not a symlink someone planted) owned by this user, and is narrowed to ``0700``;
- a file is written to a fresh ``mkstemp`` file (``0600``, created exclusively: never an existing
  path or a link) in the same folder and renamed over the name, so a planted symlink at the name is
  replaced rather than written through and a reader never sees half a file;
- a file is read without following a symlink, only when it is a regular file, and only up to a
  size limit (a planted FIFO or a huge file cannot hang or flood ``import nvkit``).
"""

from __future__ import annotations

import errno
import os
import stat
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


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as a ``0600`` file, atomically, never through a link at ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


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
