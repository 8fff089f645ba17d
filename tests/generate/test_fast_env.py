"""nvkit's environment variables are parsed by ``nvkit.checks``: an unusable value is an
NvkitError naming the variable and what it takes, never a ValueError from an import; fixing the
variable in the same process is enough."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvkit import NvkitError
from nvkit.checks import env_choice, env_flag, env_int, env_path

NVKIT = Path(__file__).resolve().parents[2] / "nvkit"


def _python(code: str, **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("NVKIT_FAST_")}
    e.update(HF_HUB_OFFLINE="1", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_a_bad_fast_k_is_an_nvkit_error_naming_it_and_fixing_it_is_enough():
    """The fast path reads its variables when it is first used (never at import: unload() and a
    CPU session work whatever they hold); a bad one is refused there, and fixing it is enough."""
    code = (
        "import os, nvkit\n"
        "from nvkit.generate.fast import options\n"
        "s = nvkit.load('demo')\n"
        "print('GENERATED', bool(s.generate('NVIDIA GPUs are', max_new_tokens=2)))\n"
        "try:\n"
        "    options.default_options()\n"
        "except nvkit.NvkitError as e:\n"
        "    print('REFUSED', e)\n"
        "del os.environ['NVKIT_FAST_K']\n"
        "print('K', options.default_options().k_steps)\n"
        "print('FREED', s.unload() >= 0)\n")
    r = _python(code, NVKIT_FAST_K="x")
    assert r.returncode == 0, r.stderr[-2000:]
    refused = [ln for ln in r.stdout.splitlines() if ln.startswith("REFUSED")]
    assert refused and "NVKIT_FAST_K='x'" in refused[0] and "whole number from 1 to 64" in refused[0]
    assert "GENERATED True" in r.stdout and "K 8" in r.stdout and "FREED True" in r.stdout


def test_importing_the_fast_path_with_a_bad_value_is_fine_and_using_it_names_the_variable():
    r = _python("import nvkit.generate.fast.single, nvkit.generate.fast.decoders\n"
                "from nvkit.generate.fast.options import default_options\n"
                "default_options()", NVKIT_FAST_MIN_TOKENS="-5")
    assert r.returncode != 0 and "Traceback" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("nvkit.errors.NvkitError") and "NVKIT_FAST_MIN_TOKENS='-5'" in last, last
    assert "ValueError" not in r.stderr


@pytest.mark.parametrize("value, expected", [(None, 8), ("", 8), (" 16 ", 16), ("1", 1), ("64", 64)])
def test_env_int_reads(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("NVKIT_TEST_INT", raising=False)
    else:
        monkeypatch.setenv("NVKIT_TEST_INT", value)
    assert env_int("NVKIT_TEST_INT", 8, 1, 64) == expected


@pytest.mark.parametrize("value", ["x", "0", "65", "1.5", "8 steps"])
def test_env_int_refuses(monkeypatch, value):
    monkeypatch.setenv("NVKIT_TEST_INT", value)
    with pytest.raises(NvkitError, match=re.escape(f"NVKIT_TEST_INT={value!r}") + ".*from 1 to 64.*unset"):
        env_int("NVKIT_TEST_INT", 8, 1, 64)


def test_env_flag_and_choice(monkeypatch):
    for raw, want in (("1", True), ("yes", True), ("ON", True), ("0", False), ("false", False), ("", True)):
        monkeypatch.setenv("NVKIT_TEST_FLAG", raw)
        assert env_flag("NVKIT_TEST_FLAG", True) is want
    monkeypatch.setenv("NVKIT_TEST_FLAG", "maybe")
    with pytest.raises(NvkitError, match="NVKIT_TEST_FLAG='maybe'.*1 or 0"):
        env_flag("NVKIT_TEST_FLAG", True)
    monkeypatch.setenv("NVKIT_TEST_CHOICE", "cublas")
    assert env_choice("NVKIT_TEST_CHOICE", "compiled", ("compiled", "cublas")) == "cublas"
    monkeypatch.setenv("NVKIT_TEST_CHOICE", "fastest")
    with pytest.raises(NvkitError, match="NVKIT_TEST_CHOICE='fastest'.*one of compiled, cublas"):
        env_choice("NVKIT_TEST_CHOICE", "compiled", ("compiled", "cublas"))
    monkeypatch.setenv("NVKIT_TEST_PATH", "~/x")
    assert env_path("NVKIT_TEST_PATH") == os.path.expanduser("~/x")


def test_the_core_reads_no_nvkit_variable_by_hand():
    # Every NVKIT_* variable nvkit reads goes through nvkit.checks, so a bad value is refused the
    # same way everywhere (setting one, as a benchmark does for the processes it starts, is no read).
    hand = re.compile(r"""(os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["']NVKIT_""")
    setting = re.compile(r"""os\.environ\[\s*["']NVKIT_\w*["']\s*\]\s*=[^=]""")
    found = []
    for path in NVKIT.rglob("*.py"):
        rel = path.relative_to(NVKIT).as_posix()
        if rel == "checks.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if hand.search(line) and not setting.search(line):
                found.append(f"nvkit/{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
