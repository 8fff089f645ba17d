"""The house rules, checked on the source: no import circles, no private names taken across
modules, and arrows that run one way between the wings (docs/architecture.md draws them).

Imports inside functions count too: a lazy import hides a circle at run time, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "nvkit"

# Higher layers may import lower ones, never the other way round. Within a layer imports are
# allowed as long as they make no circle.
LAYERS = [
    ("ground", ["nvkit.errors", "nvkit.events", "nvkit.threads", "nvkit.units", "nvkit.state",
                "nvkit.checks", "nvkit.quiet", "nvkit.lazy", "nvkit.cache"]),
    ("hardware, demo", ["nvkit.hardware", "nvkit.demo"]),
    ("memory", ["nvkit.memory"]),
    ("generate", ["nvkit.generate"]),
    ("model", ["nvkit.model"]),
    ("train", ["nvkit.train"]),
    ("benchmarks", ["nvkit.benchmarks"]),
    ("faces", ["nvkit.ui", "nvkit.magics", "nvkit.cli", "nvkit.server", "nvkit.kernel_report", "nvkit"]),
]
# "nvkit" stands for the package's __init__ alone: a new top-level module must be placed above.
EXACT = {"nvkit"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in root.rglob("*.py")}


def layer_of(mod: str) -> int:
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (mod == pre or (pre not in EXACT and mod.startswith(pre + "."))) and len(pre) > best:
                best, found = len(pre), i
    assert found is not None, f"{mod} belongs to no layer: add it to LAYERS in {__file__}"
    return found


def imports_of(mod: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every nvkit import in ``path``."""
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "nvkit" or a.name.startswith("nvkit."):
                    out.append((a.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "nvkit" or target.startswith("nvkit.")):
                continue
            names = []
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in modules:          # `from package import module`
                    out.append((sub, [], node.lineno))
                else:
                    names.append(a.name)
            if names:
                out.append((target, names, node.lineno))
    return out


def graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = all_modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private = []
    for mod, path in modules.items():
        for target, names, line in imports_of(mod, path, modules):
            if target not in modules or target == mod:
                continue
            edges[mod].add(target)
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    private.append(f"{path.relative_to(ROOT.parent)}:{line} takes {n} from {target}")
    return edges, private


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    edges, _ = graph()
    found = circles(edges)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_names_across_modules():
    _, private = graph()
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_arrows_run_one_way():
    edges, _ = graph()
    upward = []
    for mod, targets in sorted(edges.items()):
        for t in sorted(targets):
            if layer_of(t) > layer_of(mod):
                upward.append(f"{mod} ({LAYERS[layer_of(mod)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})")
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)


def test_every_nvkit_import_names_a_module_that_exists():
    """A moved module leaves no import behind (a function-level import would fail only when run)."""
    modules = all_modules()
    missing = [f"{path.relative_to(ROOT.parent)}:{line} imports {target}"
               for mod, path in modules.items() for target, _, line in imports_of(mod, path, modules)
               if target not in modules]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_every_module_has_a_layer():
    for mod in all_modules():
        layer_of(mod)


@pytest.mark.parametrize("source, expected", [
    ("from . import b\n", {"nvkit.pkg.b"}),
    ("from .b import x\n", {"nvkit.pkg.b"}),
    ("def f():\n    from ..top import y\n", {"nvkit.top"}),
    ("import nvkit.top\n", {"nvkit.top"}),
])
def test_the_checker_sees_relative_and_function_local_imports(tmp_path, source, expected):
    """The rules above are only as good as this parser: relative imports and imports inside
    functions (where a circle usually hides) must be seen."""
    root = tmp_path / "nvkit"
    (root / "pkg").mkdir(parents=True)
    for p in ("__init__.py", "top.py", "pkg/__init__.py", "pkg/b.py"):
        (root / p).write_text("")
    (root / "pkg" / "a.py").write_text(source)
    mods = all_modules(root)
    assert {t for t, _, _ in imports_of("nvkit.pkg.a", root / "pkg" / "a.py", mods)} == expected


def test_the_checker_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
