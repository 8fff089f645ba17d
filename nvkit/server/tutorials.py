"""Where the tutorial notebooks live, and what each one is called. No tornado here: the CLI
(``nvkit lab``) and the server extension both use it.

Wheels ship the notebooks as ``nvkit/tutorials`` (hatch force-include of ``notebooks/``); a source
checkout or an editable install has them in ``notebooks/`` next to the package.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..checks import env_path

_PKG = Path(__file__).resolve().parents[1]
# A tutorial name is a plain file name: no separators, no leading dot, nothing a path could use.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.ipynb$")


def tutorials_dir() -> Path | None:
    """The folder holding the tutorials: ``$NVKIT_TUTORIALS_DIR``, the wheel's ``nvkit/tutorials``,
    or the checkout's ``notebooks/``; None when there is none."""
    env = env_path("NVKIT_TUTORIALS_DIR")
    candidates = [Path(env)] if env else []
    candidates += [_PKG / "tutorials", _PKG.parent / "notebooks"]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    return None


def _title(path: Path) -> str:
    """The first markdown heading of the notebook, else its file name without the extension."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if cell.get("cell_type") != "markdown":
                continue
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            for line in src.splitlines():
                m = re.match(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", line)
                if m:
                    return m.group(1).strip()
    except (OSError, ValueError, AttributeError):
        pass
    return path.stem


def list_tutorials() -> list[dict]:
    """``[{name, title, path}]`` in file-name order (the numbering is the reading order). ``path``
    is where the notebook lies on the server's disk."""
    folder = tutorials_dir()
    if folder is None:
        return []
    out = []
    for p in sorted(folder.glob("*.ipynb")):
        if NAME_RE.match(p.name) and p.is_file():
            out.append({"name": p.name, "title": _title(p), "path": str(p)})
    return out


def find_tutorial(name: str) -> Path | None:
    """The tutorial file called ``name``, only if ``name`` is one of the listed tutorials (so no
    request-supplied string is ever joined into a path)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        return None
    for t in list_tutorials():
        if t["name"] == name:
            return Path(t["path"])
    return None
