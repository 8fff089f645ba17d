"""binder/ stays in step with pyproject.toml: mybinder installs binder/requirements.txt, then
postBuild installs nvkit with --no-deps, so every runtime dependency of pyproject must be in the
requirements with the same version range (or a narrower one), and torch must come from the CPU index."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


def _pyproject_deps() -> dict[str, Requirement]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {canonicalize_name(r.name): r for r in map(Requirement, data["project"]["dependencies"])}


def _binder_lines() -> list[str]:
    out = []
    for raw in (BINDER / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = raw.split(" #")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _binder_reqs(lines=None) -> dict[str, Requirement]:
    lines = _binder_lines() if lines is None else lines
    return {canonicalize_name(r.name): r for r in (Requirement(x) for x in lines if not x.startswith("-"))}


def _narrower_or_equal(binder: SpecifierSet, project: SpecifierSet) -> bool:
    """True when every version binder may install also satisfies pyproject's range. Checked on the
    versions the two ranges mention (and a little around them): enough for the >=, <, == ranges
    used here, and an equal range always passes."""
    if str(binder) == str(project):
        return True
    probes = set()
    for spec in list(binder) + list(project):
        v = spec.version.rstrip(".*")
        parts = [int(p) for p in re.findall(r"\d+", v)[:3]] + [0, 0, 0]
        major, minor, micro = parts[:3]
        for d in (-1, 0, 1):
            probes |= {f"{major}.{minor}.{max(0, micro + d)}", f"{major}.{max(0, minor + d)}.0",
                       f"{max(0, major + d)}.0.0"}
        probes.add(v)
    return all(project.contains(p, prereleases=True) for p in probes if binder.contains(p, prereleases=True))


def unsatisfied(project: dict[str, Requirement], binder: dict[str, Requirement]) -> list[str]:
    problems = []
    for name, req in project.items():
        got = binder.get(name)
        if got is None:
            problems.append(f"{req} is a runtime dependency of nvkit but binder/requirements.txt does not install it")
        elif not _narrower_or_equal(got.specifier, req.specifier):
            problems.append(f"binder/requirements.txt has {got}, which allows versions outside pyproject's {req}")
    return problems


def test_every_runtime_dependency_is_installed_by_binder():
    assert unsatisfied(_pyproject_deps(), _binder_reqs()) == []


def test_binder_installs_nothing_nvkit_does_not_declare():
    extra = set(_binder_reqs()) - set(_pyproject_deps())
    assert not extra, f"binder/requirements.txt installs {sorted(extra)} that pyproject.toml does not declare"


def test_the_check_catches_a_missing_or_looser_dependency():
    project = _pyproject_deps()
    lines = [x for x in _binder_lines() if not x.lower().startswith("peft")]
    assert any("peft" in p for p in unsatisfied(project, _binder_reqs(lines)))
    looser = [("transformers>=5.0" if x.startswith("transformers") else x) for x in _binder_lines()]
    assert any("transformers" in p for p in unsatisfied(project, _binder_reqs(looser)))
    narrower = [("transformers==5.22.2" if x.startswith("transformers") else x) for x in _binder_lines()]
    assert unsatisfied(project, _binder_reqs(narrower)) == []


def test_torch_is_the_cpu_build():
    lines = _binder_lines()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines


def test_post_build_installs_nvkit_and_checks_the_extension():
    post = BINDER / "postBuild"
    assert post.is_file() and os.access(post, os.X_OK), "binder/postBuild must be an executable script"
    text = post.read_text(encoding="utf-8")
    assert text.startswith("#!")
    assert re.search(r"pip install .*--no-deps \.(\s|$)", text), "postBuild installs nvkit (with its lab extension)"
    assert "jupyter labextension list" in text and "nvkit" in text


def test_the_binder_start_notebook_exists():
    # the README's Binder link opens ?urlpath=lab/tree/notebooks/00-start-here.ipynb
    assert (ROOT / "notebooks" / "00-start-here.ipynb").is_file()
