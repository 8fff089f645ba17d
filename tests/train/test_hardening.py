"""Issue 17, training side: no user text in generated Python, nothing of the user's deleted or
overwritten, unique run folders, malformed data refused with file and line, a launch reader that
survives any single bad line, launch_command("") refused. Each test fails on the code before."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nvkit  # noqa: E402
from nvkit.errors import NvkitError  # noqa: E402
from nvkit.model.saving import MARKER, owned, save_atomic  # noqa: E402
from nvkit.train import data as D  # noqa: E402
from nvkit.train.launch import LaunchRun, launch  # noqa: E402

DATA = ["NVIDIA GPUs are fast.", "The H200 has 141 GB of memory."] * 4
FACT = "The H200 has 141 GB of fast memory."


# --- no user text in generated source --------------------------------------------------------------

def test_hostile_run_dir_runs_nothing_injected_and_trains(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hostile = tmp_path / 'run"""+__import__("os").system("echo INJECTED")+"""' / "run\\N"
    run = launch({"model": path, "data": DATA, "max_steps": 2, "batch_size": 4, "seq_len": 64}, gpus=[],
                 run_dir=str(hostile))
    run.result(timeout=600)
    assert run.returncode == 0 or run.ended_after_done, run.text(40)
    assert not any("INJECTED" in text for _, text in run.logs)
    assert [r["step"] for r in run.history if r.get("event") == "log"] == [1, 2]
    assert os.path.isfile(hostile / "adapter" / "adapter_model.safetensors")
    assert not list(hostile.rglob("*.py"))  # nothing written as Python
    sh = hostile / "launch.sh"
    assert subprocess.run(["sh", "-n", str(sh)]).returncode == 0  # the shell line parses
    assert shlex.quote(str(hostile)) in sh.read_text()


# --- nothing of the user's deleted or overwritten ---------------------------------------------------

def test_finetune_refuses_an_adapter_folder_it_did_not_write(s, tmp_path):
    mine = tmp_path / "out" / "adapter"
    mine.mkdir(parents=True)
    (mine / "my_notes.py").write_text("print('mine')\n")
    before = s.generate("The H200", max_new_tokens=3)
    with pytest.raises(NvkitError, match="did not write.*my_notes.py"):
        nvkit.finetune(s, [FACT] * 4, max_steps=1, seq_len=64, output_dir=str(tmp_path / "out"))
    assert (mine / "my_notes.py").read_text() == "print('mine')\n"
    assert s.generate("The H200", max_new_tokens=3) == before


def test_finetune_refuses_a_foreign_checkpoint_folder(s, tmp_path):
    (tmp_path / "out" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-3" / "weights.bin").write_bytes(b"x")
    with pytest.raises(NvkitError, match="checkpoint-3"):
        nvkit.finetune(s, [FACT] * 4, max_steps=1, seq_len=64, output_dir=str(tmp_path / "out"))
    assert (tmp_path / "out" / "checkpoint-3" / "weights.bin").read_bytes() == b"x"


def test_output_dir_that_is_a_file_is_refused(s, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    with pytest.raises(NvkitError, match="is a file"):
        nvkit.finetune(s, [FACT] * 4, max_steps=1, seq_len=64, output_dir=str(f))
    assert f.read_text() == "keep me"
    assert s.generate("The H200", max_new_tokens=3)


def test_finetune_replaces_its_own_adapter_and_leaves_the_rest(s, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my run notes")
    use_cache = s.model.config.use_cache
    first = nvkit.finetune(s, [FACT] * 4, max_steps=1, batch_size=2, seq_len=64, output_dir=str(out))
    first.result(timeout=300)
    assert s.model.config.use_cache == use_cache  # Trainer's own setting for training is not left behind
    assert owned(first.adapter_dir, "adapter")
    marker = json.loads((out / "adapter" / MARKER).read_text())
    assert marker["kind"] == "adapter" and marker["steps"] == 1
    old_weights = (out / "adapter" / "adapter_model.safetensors").read_bytes()
    second = nvkit.finetune(s, [FACT] * 4, max_steps=2, batch_size=2, seq_len=64, learning_rate=1e-2,
                            output_dir=str(out))
    second.result(timeout=300)
    assert json.loads((out / "adapter" / MARKER).read_text())["steps"] == 2
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() != old_weights
    assert (out / "README.md").read_text() == "my run notes"
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # the old adapter was moved aside, then removed


def test_save_atomic_refuses_a_folder_it_did_not_write(tmp_path):
    class Saver:
        def save_pretrained(self, d):
            (tmp_path / "called").write_text("yes")

    target = tmp_path / "adapter"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(NvkitError, match="did not write"):
        save_atomic(Saver(), str(target))
    assert (target / "keep.txt").read_text() == "mine" and not (tmp_path / "called").exists()
    assert sorted(os.listdir(tmp_path)) == ["adapter"]


@pytest.mark.parametrize("where", ["cwd", "checkpoint"])
def test_launch_refuses_a_non_empty_run_dir_it_did_not_create(path, tmp_path, monkeypatch, where):
    user = tmp_path / "work"
    user.mkdir()
    if where == "checkpoint":
        user = user / "checkpoint-100"
        user.mkdir()
        (user / "adapter_config.json").write_text("{}")
    for name in ("train.py", "config.json", "data.jsonl"):
        (user / name).write_text(f"the user's {name}")
    monkeypatch.chdir(user if where == "cwd" else tmp_path)
    with pytest.raises(NvkitError, match="did not write"):
        launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], run_dir="." if where == "cwd" else str(user),
               start=False)
    for name in ("train.py", "config.json", "data.jsonl"):
        assert (user / name).read_text() == f"the user's {name}"
    assert not (user / MARKER).exists() and not (user / "launch.sh").exists()


def test_launch_reuses_its_own_run_dir(path, tmp_path):
    d = tmp_path / "run"
    first = launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], run_dir=str(d), start=False)
    assert owned(str(d), "launch-run")
    again = launch({"model": path, "data": DATA, "max_steps": 2}, gpus=[], run_dir=str(d), start=False)
    assert again.run_dir == first.run_dir and json.loads((d / "config.json").read_text())["max_steps"] == 2


def test_default_run_folders_are_unique_within_a_second(s, path, tmp_path, monkeypatch):
    from nvkit.train.finetune import default_output_dir
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-000000")  # the same second, every call
    assert default_output_dir(s) != default_output_dir(s)
    a = launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], start=False)
    b = launch({"model": path, "data": DATA, "max_steps": 1}, gpus=[], start=False)
    assert a.run_dir != b.run_dir
    assert os.path.dirname(a.run_dir) == str(tmp_path / "nvkit-runs")


# --- data readers ------------------------------------------------------------------------------------

def test_csv_with_an_unquoted_comma_is_refused_with_file_line_and_fix(s, tmp_path):
    f = tmp_path / "facts.csv"
    f.write_text('text\n"NVIDIA makes GPUs, and more"\nGPUs are fast, and cheap\n')
    with pytest.raises(NvkitError, match=r"facts\.csv, line 3: 2 fields but the header has 1.*double quotes"):
        D.tokenize(str(f), s.tokenizer, 64)
    with pytest.raises(NvkitError, match="line 3"):
        nvkit.finetune(s, str(f), max_steps=1, seq_len=64)
    f.write_text('text\n"NVIDIA makes GPUs, and more"\n"GPUs are fast, and cheap"\n')
    rows, _ = D.tokenize(str(f), s.tokenizer, 64)
    assert s.tokenizer.decode(rows[1].input_ids, skip_special_tokens=True) == "GPUs are fast, and cheap"


@pytest.mark.parametrize("text, match", [
    ("prompt,response\nHi,Hello\nHow are you\n", r"line 3: 1 fields but the header has 2.*fill in every column"),
    ("prompt,response\nHi,Hello, world\n", r"line 2: 3 fields.*double quotes"),
    ("prompt,prompt\nHi,Hello\n", "line 1: the header"),
    ("", "empty"),
    ('prompt,response\n"Hi,Hello\n', "line"),
])
def test_malformed_csv_rows(s, tmp_path, text, match):
    f = tmp_path / "d.csv"
    f.write_text(text)
    with pytest.raises(NvkitError, match=match):
        D.tokenize(str(f), s.tokenizer, 64)


def test_bad_rows_name_their_file_and_line(s, tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c", "answer": "d"}\n')
    with pytest.raises(NvkitError, match=r"Example 1 \(d\.jsonl, line 3\) has keys"):
        D.tokenize(str(f), s.tokenizer, 64)
    t = tmp_path / "d.txt"
    t.write_text("first\n\n\nsecond\n")
    rows = D.read(str(t))
    assert list(rows) == ["first", "second"] and rows.where(1) == "Example 1 (d.txt, line 4)"
    c = tmp_path / "e.csv"
    c.write_text("prompt,response\na,b\nc,\n")
    with pytest.raises(NvkitError, match=r"Example 1 \(e\.csv, line 3\): 'response' is empty"):
        D.tokenize(str(c), s.tokenizer, 64)


# --- the launch reader ---------------------------------------------------------------------------------

def _fake_group(tmp_path, body: str) -> LaunchRun:
    code = ("import json, sys, time\n"
            "def say(**kw): print(json.dumps({'nvkit': 1, 'world': 1, 't': time.time(), **kw}), flush=True)\n" + body)
    run = LaunchRun("fake torchrun", [sys.executable, "-c", code], dict(os.environ), str(tmp_path), total_steps=2)
    return run.start()


def test_the_reader_survives_any_single_bad_line(tmp_path):
    seen = []
    run = _fake_group(tmp_path, "say(rank=0, event='log', step=1, loss=None)\n"
                                "sys.stdout.flush(); sys.stdout.buffer.write(b'\\xff\\xfe not utf-8\\n'); sys.stdout.flush()\n"
                                "say(rank=[0], event='step', step=1)\n"
                                "say(rank=0, event='step', step='two')\n"
                                "print('{\"nvkit\": 1, \"rank\": 0, \"event\": ')\n"
                                "for i in range(3000): print('x' * 60)\n"  # more than a pipe holds
                                "say(rank=0, event='log', step=2, loss=1.5)\n"
                                "say(rank=0, event='step', step=2)\n"
                                "say(rank=0, event='done', step=2)\n")
    run.subscribe(lambda rec: seen.append(rec) or (_ for _ in ()).throw(RuntimeError("broken listener")))
    run.result(timeout=60)
    assert run.returncode == 0
    logs = [r for r in run.history if r["event"] == "log"]
    assert [r["step"] for r in logs] == [1, 2] and logs[0]["loss"] is None and logs[1]["loss"] == 1.5
    assert run.progress["step"] == 2 and run.ranks == [0]
    texts = [t for _, t in run.logs]
    assert any("not utf-8" in t for t in texts) and any('"step": "two"' in t for t in texts)
    assert len(seen) >= 2
    assert "n/a" in [e.text for e in nvkit.events.events() if e.kind == "train-step" and "launch step 1 " in e.text][-1]


def test_a_record_torchrun_copied_in_two_pieces_arrives_whole(tmp_path):
    """torchrun's tee can copy half a line a rank is writing, then other ranks' lines, then the
    rest under the rank's prefix again: the reader joins the pieces per rank."""
    rec0 = json.dumps({"nvkit": 1, "rank": 0, "world": 2, "event": "setup", "precision": "fp32"})
    rec1 = json.dumps({"nvkit": 1, "rank": 1, "world": 2, "event": "setup", "precision": "fp32"})
    run = _fake_group(tmp_path, f"sys.stdout.write('[default0]:' + {rec0[:25]!r}); sys.stdout.flush(); time.sleep(0.2)\n"
                                f"print('[default1]:' + {rec1!r}, flush=True)\n"
                                f"print('[default0]:' + {rec0[25:]!r}, flush=True)\n"
                                "print('[default1]:plain text', flush=True)\n"
                                # rank 0's stderr (same prefix) leaves a progress bar unended
                                "sys.stdout.write('[default0]:Loading weights: 100%|#####| 46/46'); sys.stdout.flush()\n"
                                f"print('[default0]:' + {rec0.replace('setup', 'start')!r}, flush=True)\n"
                                "sys.stdout.write('[default1]:never ended')\n")
    run.result(timeout=60)
    assert run.setup(0)["precision"] == "fp32" and run.setup(1)["precision"] == "fp32"
    assert [r["event"] for r in run.history if r["rank"] == 0] == ["setup", "start"]
    assert (1, "plain text") in run.logs and (1, "never ended") in run.logs
    assert (0, "Loading weights: 100%|#####| 46/46") in run.logs
    assert not any("nvkit" in t for _, t in run.logs), list(run.logs)


def test_launch_command_refuses_an_empty_script():
    for bad in ("", "   ", None, 3):
        with pytest.raises(NvkitError, match="launch_command needs the script"):
            nvkit.launch_command(bad, gpus=[])
    assert nvkit.launch_command("train.py", gpus=[]).argv[-1] == "train.py"
