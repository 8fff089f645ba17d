"""nvkit.quiet: known third-party messages go to nvkit's debug log inside routed(), and nothing
else changes (other messages, the same message outside the block)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

from nvkit.quiet import KNOWN, routed


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _listen(name: str, level=logging.WARNING) -> _Keep:
    keep = _Keep()
    log = logging.getLogger(name)
    keep.restore = (log, log.level)
    log.addHandler(keep)
    log.setLevel(level)
    return keep


def _stop(keep: _Keep) -> None:
    log, level = keep.restore
    log.removeHandler(keep)
    log.setLevel(level)


def test_routes_only_known_messages_inside_the_block():
    name, start = KNOWN[0]
    lib = logging.getLogger(name)
    seen = _listen(name)
    debug = _listen("nvkit.quiet", logging.DEBUG)
    try:
        known = f"{start}: the Hub is offline"
        with routed():
            lib.warning("%s", known)
            lib.warning("Something else went wrong")
        lib.warning("%s", known)
        assert seen.messages == ["Something else went wrong", known]
        assert len(debug.messages) == 1 and known in debug.messages[0] and name in debug.messages[0]
    finally:
        _stop(seen)
        _stop(debug)


def test_blocks_nest_and_cover_worker_threads():
    # a fine-tune imports the training stack in its worker thread, inside the block it opened
    name, start = KNOWN[0]
    lib = logging.getLogger(name)
    seen = _listen(name)
    try:
        with routed():
            with routed():
                pass
            t = threading.Thread(target=lambda: lib.warning("%s (from a thread)", start))
            t.start()
            t.join()
        assert seen.messages == []
        lib.warning("%s (after)", start)
        assert seen.messages == [f"{start} (after)"]
    finally:
        _stop(seen)


def test_importing_bitsandbytes_inside_routed_prints_nothing():
    # The real import, in a fresh process (bitsandbytes logs once, on its first import), offline
    # as in the tests. Whether bitsandbytes tries its Hub fetch depends on the CPU (AVX512-BF16);
    # either way nothing of it may reach stderr inside routed(), and nothing else is lost.
    code = ("import logging, sys\n"
            "from nvkit.quiet import routed\n"
            "with routed():\n"
            "    import bitsandbytes\n"
            "logging.getLogger('bitsandbytes.backends.cpu.ops').warning('still heard')\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    for _, start in KNOWN:
        assert start not in r.stderr, r.stderr
    assert "still heard" in r.stderr


def test_a_cpu_fine_tune_prints_no_deepspeed_notice(tmp_path):
    # DeepSpeed announces its CPU accelerator when Trainer imports it; a fine-tune on the CPU in a
    # fresh process (DeepSpeed logs once, on its first import) prints only nvkit's own output.
    import pytest
    pytest.importorskip("deepspeed")
    code = ("import nvkit\n"
            "s = nvkit.load('demo', device_map='cpu')\n"
            "run = nvkit.finetune(s, ['NVIDIA GPUs are fast.'] * 8, max_steps=1, batch_size=4, seq_len=32)\n"
            "run.result(timeout=600)\n"
            "import logging\n"
            "logging.getLogger('DeepSpeed').warning('Setting accelerator to CPU outside nvkit')\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    # in tmp_path: the run folder goes under ./nvkit-runs, which must not be the checkout
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "nvkit-runs").is_dir()
    out = r.stdout + r.stderr
    assert "If you have GPU or other accelerator" not in out, out[-3000:]
    assert "Setting accelerator to CPU outside nvkit" in out   # the same logger, outside nvkit: heard
