"""``kernels.warm``: Triton's once-a-process costs paid in a thread while a model loads onto a GPU.
Each case runs in a fresh process, the only place where those costs are still unpaid."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_warm_up_computes_tritons_key_and_imports_the_kernels_once_per_process():
    out = _run("""
        import sys
        from nvkit.generate.kernels import warm
        key = warm._triton_key()
        assert key is not None and key.cache_info().currsize == 0
        assert not any(f"nvkit.generate.kernels.{m}" in sys.modules for m in warm.MODULES)
        th = warm.start()
        th.join(240)
        assert not th.is_alive() and th.daemon
        assert key.cache_info().currsize == 1  # the next compile reads it from the cache
        assert all(f"nvkit.generate.kernels.{m}" in sys.modules for m in warm.MODULES)
        assert set(warm.seconds) >= {"triton key", *(f"import {m}" for m in warm.MODULES)}
        assert all(v >= 0 for v in warm.seconds.values())
        assert warm.start() is None  # once a process
        assert warm.words().startswith("the Triton warm-up is done: triton key ")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_a_part_that_fails_leaves_the_others():
    """A Triton release whose key function raises (or that lacks Gluon) still gets the kernels
    imported ahead of the first request."""
    out = _run("""
        import sys
        from nvkit.generate.kernels import warm
        def broken():
            raise RuntimeError("moved")
        warm._triton_key = lambda: broken
        warm.TRITON_MODULES = ("triton.no_such_module",)
        warm.start().join(240)
        assert all(f"nvkit.generate.kernels.{m}" in sys.modules for m in warm.MODULES)
        assert "triton key" not in warm.seconds and "import triton.no_such_module" not in warm.seconds
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_a_cpu_load_starts_nothing_and_a_missing_triton_is_no_error():
    out = _run("""
        import sys
        import nvkit
        from nvkit.generate.kernels import warm
        from tests import demo_model
        s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
        assert warm._thread is None and not any(t.name == "nvkit-triton-warm" for t in __import__("threading").enumerate())
        assert warm.words() == "the Triton warm-up has not started in this process"
        assert s.generate("Hello", max_new_tokens=2) is not None
        sys.modules["triton"] = None  # as where Triton is not installed: import triton raises ImportError
        assert warm.start() is None and warm._thread is None
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_the_words_say_what_is_still_compiling_ahead_and_stop_saying_it_when_it_ends():
    out = _run("""
        import threading
        from nvkit.generate.kernels import warm
        go = threading.Event()
        t = threading.Thread(target=go.wait, daemon=True)
        warm.ahead["rows step kernels"] = t
        assert warm.words() == "the Triton warm-up has not started in this process"  # not yet running
        t.start()
        said = warm.words()
        assert said == "the Triton warm-up is not started: nothing done; still compiling ahead: rows step kernels", said
        go.set()
        t.join(10)
        warm.seconds["rows step kernels (3)"] = 0.5
        assert warm.words() == "the Triton warm-up is not started: rows step kernels (3) 0.50 s", warm.words()
        print("ok")
    """)
    assert out.strip().endswith("ok")
