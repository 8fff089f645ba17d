"""What one kernel holds between calls: the loaded session, the shared memory sampler, the
predicted-vs-measured record and whether a saved GPU choice was applied.

They hang off one object so that ``STATE.reset()`` puts a kernel back as it started (the tests do
this between cases), and so that a module low in the house (the memory tracker, the live-tensor
scan) can reach the current session without importing the module that loads it. The objects are
stored as their owners made them; this module knows nothing of their types.
"""

from __future__ import annotations

import threading
from typing import Any


class KernelState:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._clear()

    def _clear(self) -> None:
        self.session: Any = None          # nvkit.model.session.Session loaded last (nvkit.session())
        self.sampler: Any = None          # nvkit.memory.sampler.Sampler shared by the charts and the report
        self.peaks: Any = None            # nvkit.memory.peaks.Tracker: predictions beside measured peaks
        self.pending_gpus: Any = None     # nvkit.hardware.selection.Selection waiting for a kernel restart
        self.saved_gpus_applied = False   # the saved GPU choice is looked at once per process

    def reset(self) -> None:
        """Forget everything (the loaded model is not unloaded: call ``unload()`` for that); the
        sampler's thread stops and the tracker stops listening to events."""
        with self.lock:
            sampler, peaks = self.sampler, self.peaks
            self._clear()
        if sampler is not None:
            sampler.stop()
        if peaks is not None:
            peaks.close()


STATE = KernelState()
