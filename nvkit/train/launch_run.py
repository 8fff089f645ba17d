"""The running group of a launched fine-tune or generation: ``LaunchRun`` reads every rank's
output (JSON metric lines through torchrun's rank prefixes, everything else kept as bounded log
text), follows the run to its end, stops it (a ``STOP`` file the ranks agree on, then SIGTERM and
SIGKILL for the whole group after a grace period) and reports what happened. One bad line is
logged and skipped: the reader must keep draining stdout, or the ranks would block on it.
``nvkit.train.launch`` writes the run and starts it."""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import signal
import subprocess
import threading

from .. import events
from ..cache import write_atomic
from ..errors import NvkitError, require
from .worker import RECORD_START

_RANK_PREFIX = re.compile(r"^\[([A-Za-z_]*?)(\d+)\]:(.*)$")
_MAX_LOG_LINES = 5000
_INT_FIELDS = ("rank", "local_rank", "world", "step", "total_steps")
_log = logging.getLogger("nvkit.launch")

def _record(text: str) -> dict | None:
    """A rank's metric line as a dict of plain values, or None when it is not one (then the line
    is kept as log text). rank/step/world are whole numbers (or the line is not a record), other
    values plain scalars, so nothing downstream trips over a structure where a value belongs."""
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("nvkit") != 1:
        return None
    rec.pop("nvkit", None)
    out = {}
    for k, v in rec.items():
        if not isinstance(k, str):
            return None
        if k in _INT_FIELDS:
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool)):
                return None
        elif k in ("event", "adapter_dir"):
            if not isinstance(v, str):
                return None
        elif not isinstance(v, (bool, int, float, str, type(None))):
            v = None  # a structure where a value belongs: kept as missing
        out[k] = v
    if not isinstance(out.get("event"), str) or not isinstance(out.get("rank"), int):
        return None
    return out


class LaunchRun:
    """A torchrun process group started by ``nvkit.launch``.

    ``history``: metric dicts from every rank (``rank``, ``event`` = step/log/..., ``step``, ``loss``,
    ``tokens_per_s``, ``memory``...); ``logs``: (rank or None, line) pairs, bounded; ``command``: the
    shell line; ``run_dir``: script, config, data, per-rank logs and the adapter."""

    EXIT_GRACE = 60.0  # seconds between the last rank's "done" and ending a group that does not exit

    def __init__(self, command: str, argv: list, env: dict, run_dir: str, total_steps: int, *,
                 strategy: str = "ddp", launcher: str = "torchrun", mode: str = "train", notes=()):
        self.command = command
        self.strategy, self.launcher, self.mode = strategy, launcher, mode
        self.notes = list(notes)   # settings nvkit added for the strategy (QLoRA storage, the loss...)
        self.run_dir = run_dir
        self.adapter_dir = os.path.join(run_dir, "adapter")
        self.total_steps = total_steps
        self.history: list[dict] = []
        self.logs: collections.deque = collections.deque(maxlen=_MAX_LOG_LINES)
        self._argv, self._env = argv, env
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.stopped = False
        self._done = threading.Event()
        self._listeners: list = []
        self._lock = threading.Lock()
        # Every rank said "done" (adapter saved) but the group had not exited EXIT_GRACE s later:
        # nvkit ended it, and the run counts as finished (see _reap_after_done).
        self.ended_after_done = False
        self._done_ranks: set = set()
        self._partial: dict = {}  # rank -> the start of a line torchrun copied before its rank ended it

    # --- process -----------------------------------------------------------------------------
    def start(self) -> "LaunchRun":
        require(self.proc is None, "This launch has already been started.")
        log_dir = os.path.join(self.run_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        self.proc = subprocess.Popen(self._argv, env=self._env, cwd=self.run_dir, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                     encoding="utf-8", errors="replace",
                                     start_new_session=True)  # its own process group: stop() reaches every rank
        threading.Thread(target=self._read, name="nvkit-launch-reader", daemon=True).start()
        events.record("launch", self.command)
        return self

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    self._line(line.rstrip("\n"))
                except Exception as e:  # noqa: BLE001 - one bad line must not stop draining stdout
                    _log.warning("nvkit.launch: skipped an unreadable line from the run (%s: %s): %.200r",
                                 type(e).__name__, e, line)
                    self.logs.append((None, line.rstrip("\n")))
        finally:
            for rank, text in sorted(self._partial.items()):  # a rank's last line, never ended
                self._rank_line(rank, text)
            self._partial.clear()
            self.returncode = self.proc.wait()
            events.record("launch-end", f"exit {self.returncode}{' (stopped)' if self.stopped else ''}")
            self._done.set()

    def _line(self, line: str) -> None:
        m = _RANK_PREFIX.match(line)
        if not m:
            self._rank_line(None, line)
            return
        # torchrun's tee copies each rank's stdout and stderr files with readline(), which returns
        # a line the rank has not ended yet as it stands: a progress bar's "\r" updates, or half a
        # line being written. The copy then holds "[p0]:half" with no newline, and later in the
        # stream (perhaps after other ranks' lines) "[p0]:the rest\n". Pieces are joined per rank
        # until a piece ends the line we read, and a record is looked for where it starts
        # (below), so neither a split record nor one glued behind a progress bar is lost.
        name = m.group(1)
        pieces = re.split(r"\[" + re.escape(name) + r"(\d+)\]:", line)[1:]  # rank, text, rank, text, ...
        for i in range(0, len(pieces) - 2, 2):
            rank = int(pieces[i])
            self._partial[rank] = self._partial.get(rank, "") + pieces[i + 1]
        rank = int(pieces[-2])
        self._rank_line(rank, self._partial.pop(rank, "") + pieces[-1])

    def _rank_line(self, rank: int | None, line: str) -> None:
        start = line.find(RECORD_START)
        if start > 0:  # text the rank left unended (a progress bar on stderr), then a record
            if line[:start].strip():
                self.logs.append((rank, line[:start]))
            line = line[start:]
        text = line.strip()
        rec = _record(text) if text.startswith("{") and '"nvkit"' in text else None
        if rec is None:
            self.logs.append((rank, line))
            return
        with self._lock:
            self.history.append(rec)
            listeners = list(self._listeners)
        if rec.get("event") == "done":
            self._rank_done(rec)
        if rec.get("event") == "log" and rec.get("rank") == 0:
            loss = rec.get("loss")
            shown = f"{loss:.4f}" if isinstance(loss, (int, float)) and not isinstance(loss, bool) else "n/a"
            events.record("train-step", f"launch step {rec.get('step')} · loss {shown}")
        for fn in listeners:
            try:
                fn(rec)
            except Exception:  # noqa: BLE001 - a listener (a closed panel) must not stop the reader
                pass

    def _rank_done(self, rec: dict) -> None:
        if rec.get("rank") in self._done_ranks:
            return  # a repeated line must not start a second reaper
        self._done_ranks.add(rec.get("rank"))
        world = rec.get("world")
        if isinstance(world, int) and len(self._done_ranks) == world:
            threading.Thread(target=self._reap_after_done, name="nvkit-launch-reap", daemon=True).start()

    def _reap_after_done(self) -> None:
        """A process group that hangs on its way out must not hold the notebook: once every rank has
        finished and saved, wait EXIT_GRACE seconds for the exit, then end the group ourselves."""
        if self._done.wait(self.EXIT_GRACE):
            return
        self.ended_after_done = True
        events.record("launch", f"every rank finished and the adapter is saved, but the process group had not exited "
                                f"{self.EXIT_GRACE:g} s later (a teardown hang); nvkit ended it")
        self._signal(signal.SIGTERM)
        if not self._done.wait(15):
            self._signal(signal.SIGKILL)

    def subscribe(self, fn) -> None:
        """``fn(record)`` for each metric line, called in the reader thread."""
        with self._lock:
            self._listeners.append(fn)

    # --- state -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def texts(self) -> list[str]:
        """The generated texts of a ``launch_generate`` run, in prompt order (as they arrive)."""
        got = {r["index"]: r["text"] for r in self.history
               if r.get("event") == "text" and isinstance(r.get("index"), int) and isinstance(r.get("text"), str)}
        return [got[i] for i in sorted(got)]

    def setup(self, rank: int = 0) -> dict:
        """What ``rank`` set up (strategy, precision, dtype, attention, loss, QLoRA), from its first line."""
        return next((r for r in self.history if r.get("event") == "setup" and r.get("rank") == rank), {})

    def per_rank(self, key: str, event: str = "step") -> dict:
        """rank → list of (step, ``key``) for every record of ``event`` (e.g. loss per rank)."""
        out: dict = {}
        for r in list(self.history):
            if r.get("event") == event and key in r and isinstance(r.get("rank"), int):
                out.setdefault(r["rank"], []).append((r.get("step"), r[key]))
        return out

    def summary(self) -> dict:
        """Steps, steps/s, final loss, per-rank peak memory (bytes) and the adapter: the numbers a
        side-by-side comparison of strategies needs."""
        steps = [r for r in self.history if r.get("event") == "step" and r.get("rank") == 0]
        logs = [r for r in self.history if r.get("event") == "log" and r.get("rank") == 0]
        peaks: dict = {}
        for r in self.history:
            if r.get("event") in ("step", "generated") and isinstance(r.get("peak_memory"), (int, float)):
                peaks[r["rank"]] = max(peaks.get(r["rank"], 0), int(r["peak_memory"]))
        rate = None
        if len(steps) >= 2 and isinstance(steps[0].get("t"), (int, float)) and isinstance(steps[-1].get("t"), (int, float)):
            dt = steps[-1]["t"] - steps[0]["t"]
            rate = (steps[-1]["step"] - steps[0]["step"]) / dt if dt > 0 else None
        return {"strategy": self.strategy, "launcher": self.launcher, "ranks": self.ranks,
                "steps": steps[-1]["step"] if steps else 0, "steps_per_s": rate,
                "final_loss": logs[-1].get("loss") if logs else None,
                "peak_memory": dict(sorted(peaks.items())),
                "adapter_dir": self.adapter_dir if os.path.isdir(self.adapter_dir) else None,
                "returncode": self.returncode, "stopped": self.stopped}

    @property
    def ranks(self) -> list[int]:
        return sorted({r["rank"] for r in self.history if "rank" in r})

    @property
    def progress(self) -> dict:
        steps = [r["step"] for r in self.history
                 if r.get("event") == "step" and r.get("rank") == 0 and isinstance(r.get("step"), int)]
        return {"step": steps[-1] if steps else 0, "total": self.total_steps}

    def text(self, last: int = 50) -> str:
        """The last ``last`` log lines, rank-prefixed."""
        lines = list(self.logs)[-last:]
        return "\n".join(f"[{r}] {t}" if r is not None else t for r, t in lines)

    def __repr__(self):
        state = f"exit {self.returncode}" if self.done else "running"
        what = f"{self.strategy} via {self.launcher}"
        if self.mode == "generate":
            return f"<nvkit.LaunchRun generate · {what} · {state} · ranks {self.ranks} · {len(self.texts)} texts · {self.run_dir}>"
        return (f"<nvkit.LaunchRun {what} · {state} · ranks {self.ranks} · step {self.progress['step']}/{self.total_steps} · "
                f"{self.run_dir}>")

    # --- control -----------------------------------------------------------------------------
    def stop(self, grace: float = 60.0) -> None:
        """End after the current step on every rank (adapter saved); if the group has not exited
        after ``grace`` seconds, SIGTERM then SIGKILL the whole process group. Returns at once."""
        if self.proc is None or self.done:
            return
        self.stopped = True
        write_atomic(os.path.join(self.run_dir, "STOP"), "stop\n", 0o644)  # never through a link at the name
        events.record("stop", "launch stopped by the user")

        def escalate():
            if self._done.wait(grace):
                return
            self._signal(signal.SIGTERM)
            if self._done.wait(15):
                return
            self._signal(signal.SIGKILL)

        threading.Thread(target=escalate, name="nvkit-launch-stop", daemon=True).start()

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def result(self, timeout: float | None = None) -> "LaunchRun":
        """Wait for the end (Interrupt stops the group cleanly); NvkitError if it failed."""
        try:
            waited = 0.0
            while not self._done.wait(0.05):
                waited += 0.05
                if timeout is not None and waited >= timeout:
                    raise TimeoutError(f"launch still running after {timeout} s")
        except KeyboardInterrupt:
            self.stop(grace=30)
            self._done.wait(60)
            raise
        self._check()
        return self

    async def wait(self) -> "LaunchRun":
        import asyncio
        while not self._done.is_set():
            await asyncio.sleep(0.05)
        self._check()
        return self

    def __await__(self):
        return self.wait().__await__()

    @property
    def error(self) -> NvkitError | None:
        """Why the run failed (its last lines and where the per-rank logs are), or None."""
        if self.returncode not in (0, None) and not self.stopped and not self.ended_after_done:
            return NvkitError(f"The launched run failed (exit {self.returncode}). Last lines:\n{self.text(30)}\n"
                              f"Per-rank logs: {os.path.join(self.run_dir, 'logs')}")
        return None

    def _check(self) -> None:
        err = self.error
        if err is not None:
            raise err
