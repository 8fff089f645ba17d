"""Resumable checkpoints of ``nvkit.finetune`` and ``finetune(..., resume=...)``.

A checkpoint is what transformers' ``Trainer`` writes for itself (the adapter, ``optimizer.pt``,
``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``), so resuming goes through Trainer's own
``resume_from_checkpoint``: the optimizer moments, the learning-rate schedule, the random state,
the step count and the position in the data order all continue where they were. Trainer writes it
into a temporary folder inside the output folder; nvkit then moves it to ``checkpoint-N`` with its
marker (``nvkit.model.saving``), which also records the run's settings, so a resume with other
data or settings is refused instead of silently training something else.
"""

from __future__ import annotations

import json
import os
import re

from ..errors import NvkitError, require
from ..model.saving import marker, owned

_CKPT = re.compile(r"^checkpoint-(\d+)$")
#: Settings a resumed run must share with the checkpoint (max_steps/epochs may grow).
SAME = ("base_model", "data", "seq_len", "batch_size", "grad_accum", "packing", "lora", "learning_rate", "seed")
_TRAINER_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


def checkpoints(folder: str) -> list[tuple[int, str]]:
    """(step, path) of the resumable checkpoints nvkit wrote in ``folder``, by step."""
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        m = _CKPT.match(name)
        path = os.path.join(folder, name)
        if m and owned(path, "checkpoint") and resumable(path):
            out.append((int(m.group(1)), path))
    return sorted(out)


def resumable(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, n)) for n in _TRAINER_FILES) and any(
        os.path.isfile(os.path.join(path, n)) for n in ("adapter_model.safetensors", "adapter_model.bin"))


def step_of(path: str) -> int:
    with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
        return int(json.load(f)["global_step"])


def find(resume, output_dir: str | None, previous_output_dir: str | None) -> str:
    """The checkpoint folder ``resume`` names: True → the latest in ``output_dir`` (or in the
    session's previous run's folder); a path → that checkpoint folder."""
    if resume is True:
        folder = output_dir or previous_output_dir
        if folder is None:
            raise NvkitError("resume=True continues the last run of this session, and this session has none: give "
                             "output_dir= (the folder of the run to continue) or resume='path/to/checkpoint-N'.")
        found = checkpoints(folder)
        if not found:
            raise NvkitError(f"resume=True found no resumable checkpoint in {folder}. A run writes one every "
                             "save_every steps and when it is stopped (run.stop() or Interrupt).")
        return found[-1][1]
    require(isinstance(resume, (str, os.PathLike)) and str(resume).strip(),
            f"resume must be True, False or the path of a checkpoint folder, not {resume!r}.")
    path = os.path.abspath(os.path.expanduser(os.fspath(resume)))
    if not os.path.isdir(path):
        raise NvkitError(f"No checkpoint folder at {path}. Give a checkpoint-N folder a fine-tune wrote "
                         "(run.checkpoints lists them), or resume=True for the latest one.")
    if not resumable(path):
        missing = [n for n in _TRAINER_FILES if not os.path.isfile(os.path.join(path, n))]
        raise NvkitError(f"{path} is not a resumable checkpoint (missing {', '.join(missing) or 'the adapter'}). "
                         "An adapter folder alone holds no optimizer or schedule: load it with s.load_adapter().")
    return path


def check_settings(path: str, settings: dict, max_steps: int | None) -> list[str]:
    """NvkitError when the checkpoint was written with other data or settings; returns notes."""
    m = marker(path) or {}
    saved = m.get("settings")
    notes = []
    if not isinstance(saved, dict):
        notes.append(f"{path} carries no nvkit settings record: data and settings are not checked")
    else:
        diff = [f"{k}: checkpoint {saved.get(k)!r}, now {settings.get(k)!r}" for k in SAME
                if json.dumps(saved.get(k), sort_keys=True, default=str) != json.dumps(settings.get(k), sort_keys=True, default=str)]
        if diff:
            raise NvkitError("Resuming needs the same data and settings as the checkpoint, and these differ: "
                             + "; ".join(diff) + ". Pass the original values (or start a new run without resume).")
    step = step_of(path)
    if max_steps is not None and max_steps <= step:
        raise NvkitError(f"{os.path.basename(path)} is already at step {step}: give max_steps > {step} to go on.")
    if isinstance(saved, dict) and saved.get("max_steps") != settings.get("max_steps"):
        notes.append(f"max_steps {saved.get('max_steps')} → {settings.get('max_steps')}: the learning-rate schedule "
                     "now ends at the new total")
    return notes
