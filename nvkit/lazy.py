"""Lazy public names for a package: ``nvkit.load`` or ``nvkit.memory.comparisons`` import the
module that holds them on first use, so ``import nvkit`` stays cheap (no torch) and a package's
``__init__`` never imports its own modules (which would tie them into import circles)."""

from __future__ import annotations

import importlib


def lazy_names(package: str, names: dict[str, str], namespace: dict):
    """``(__getattr__, __dir__)`` for ``package``'s ``__init__``: ``names`` maps a public name to
    the module (relative to ``package``) that defines it; found values are cached in ``namespace``."""

    def __getattr__(name: str):
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where}"), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
