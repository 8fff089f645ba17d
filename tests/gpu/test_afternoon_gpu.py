"""Issue 39's afternoon held to its targets as assertions: ``nvkit bench shape:qwen3-0.6b
--afternoon --json`` in a fresh process, on a machine that has run it once (the first run, which
may meet the machine's first Triton compiles, only warms it: the first-request target is a warm
machine's). Every row with a target must hold it. `bash scripts/gpu_session.sh afternoon-check`."""

import json
import os
import subprocess
import sys


def _afternoon() -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "nvkit.cli", "bench", "shape:qwen3-0.6b", "--afternoon", "--json"],
                         capture_output=True, text=True, timeout=400, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode in (0, 1) and "[" in out.stdout, (out.returncode, out.stderr[-3000:])
    return json.loads(out.stdout[out.stdout.index("["):])


def test_an_afternoon_on_a_warm_machine_holds_every_target():
    _afternoon()
    rows = _afternoon()
    for r in rows:
        print(f"\n{r['step']}: {r['request']}: {r['seconds']} s, first token {r['ttft_ms']} ms, {r['path']} "
              f"{r['note'] or ''} [{r['target']}: {r['ok']}]", end="")
    assert len(rows) > 20 and all(r["path"] for r in rows if r["step"] not in ("fine-tune", "compare"))
    missed = [(r["step"], r["request"], r["target"], r["note"]) for r in rows if r["ok"] is False]
    assert not missed, missed
