"""Issue 35, folders nvkit writes a model or adapter into: the marker lists what nvkit wrote, and
writing again replaces exactly that, or refuses (naming what is in the way) when the folder holds
anything else. nvkit never deletes a file it did not write. Each refusal fails on the code before
(an export over its own folder deleted whatever the user had added)."""

from __future__ import annotations

import json
import os

import pytest

import nvkit
from nvkit import NvkitError
from nvkit.model.saving import MARKER, move_into_place, save_atomic


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load("demo")
    yield sess
    sess.unload()


def _listed(folder) -> set:
    return set(json.loads((folder / MARKER).read_text())["files"])


def test_export_twice_refuses_when_the_user_added_files(s, tmp_path):
    d = tmp_path / "export"
    s.export(str(d))
    ours = sorted(os.listdir(d))
    (d / "MY_NOTES.txt").write_text("my notes")
    (d / "my_eval").mkdir()
    (d / "my_eval" / "scores.json").write_text("{}")
    with pytest.raises(NvkitError, match=r"did not write there: MY_NOTES\.txt, my_eval/"):
        s.export(str(d))
    assert (d / "MY_NOTES.txt").read_text() == "my notes"
    assert (d / "my_eval" / "scores.json").read_text() == "{}"
    assert sorted(os.listdir(d)) == sorted(ours + ["MY_NOTES.txt", "my_eval"])  # the export is intact too
    assert os.listdir(tmp_path) == ["export"]  # nothing left aside
    assert s.generate("The H200", max_new_tokens=3)  # the session stays usable


def test_export_twice_refuses_when_the_user_edited_a_file_nvkit_wrote(s, tmp_path):
    d = tmp_path / "export"
    s.export(str(d))
    (d / "README.md").write_text("my own model card")
    with pytest.raises(NvkitError, match=r"README\.md \(changed since nvkit wrote it\)"):
        s.export(str(d))
    assert (d / "README.md").read_text() == "my own model card"


def test_export_twice_replaces_exactly_its_own_files(s, tmp_path):
    d = tmp_path / "export"
    s.export(str(d))
    assert set(os.listdir(d)) == _listed(d) | {MARKER}
    assert {"model.safetensors", "config.json", "README.md"} <= _listed(d)
    before = {n: os.stat(d / n).st_ino for n in _listed(d)}
    (d / "README.md").unlink()  # one of nvkit's files gone is no reason to refuse
    assert s.export(str(d)) == str(d)
    assert set(os.listdir(d)) == _listed(d) | {MARKER} and _listed(d) == set(before)
    assert all(os.stat(d / n).st_ino != before[n] for n in before if n != "README.md")  # new files
    assert os.listdir(tmp_path) == ["export"]  # the old copy, moved aside, is gone


def test_export_into_a_new_or_empty_folder(s, tmp_path):
    assert s.export(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    (tmp_path / "empty").mkdir()
    s.export(str(tmp_path / "empty"))
    assert (tmp_path / "empty" / "config.json").is_file() and "config.json" in _listed(tmp_path / "empty")


def test_export_into_a_folder_nvkit_never_wrote_is_refused(s, tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text("my config")
    with pytest.raises(NvkitError, match="did not write"):
        s.export(str(d))
    assert os.listdir(d) == ["config.json"] and (d / "config.json").read_text() == "my config"


def test_a_folder_from_an_nvkit_that_kept_no_file_list_is_not_replaced(s, tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / MARKER).write_text(json.dumps({"nvkit": 1, "kind": "export"}))
    (d / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(NvkitError, match="model.safetensors"):
        s.export(str(d))
    assert (d / "model.safetensors").read_bytes() == b"weights"


# --- the same rule for the fine-tune's adapter and checkpoints (save_atomic, move_into_place) ----

class _Saver:
    def __init__(self, text="{}"):
        self.text = text

    def save_pretrained(self, d):
        os.makedirs(os.path.join(d, "sub"))
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            f.write(self.text)
        with open(os.path.join(d, "sub", "part.bin"), "w") as f:
            f.write("x")


def test_adapter_replaced_only_while_it_holds_nvkit_files(tmp_path):
    target = tmp_path / "adapter"
    save_atomic(_Saver(), str(target))
    assert _listed(target) == {"adapter_config.json", "sub/part.bin"}
    save_atomic(_Saver('{"r": 2}'), str(target))  # its own: replaced
    assert (target / "adapter_config.json").read_text() == '{"r": 2}'
    (target / "sub" / "mine.txt").write_text("mine")
    with pytest.raises(NvkitError, match="sub/mine.txt"):
        save_atomic(_Saver(), str(target))
    assert (target / "sub" / "mine.txt").read_text() == "mine"
    assert (target / "adapter_config.json").read_text() == '{"r": 2}'
    assert os.listdir(tmp_path) == ["adapter"]


def test_a_file_added_while_the_adapter_is_written_is_kept(tmp_path):
    """The check before writing passes; the user adds a file while the new adapter is written:
    the folder is checked again once moved aside, and put back untouched."""
    target = tmp_path / "adapter"
    save_atomic(_Saver(), str(target))

    def write(d):
        _Saver('{"new": 1}').save_pretrained(d)
        (target / "MY_NOTES.txt").write_text("added meanwhile")

    with pytest.raises(NvkitError, match="MY_NOTES.txt"):
        save_atomic(write, str(target))
    assert (target / "MY_NOTES.txt").read_text() == "added meanwhile"
    assert (target / "adapter_config.json").read_text() == "{}"
    assert os.listdir(tmp_path) == ["adapter"]


def test_checkpoint_moved_into_place_only_over_its_own(tmp_path):
    def trainer_checkpoint(name, text):
        src = tmp_path / "staging" / name
        src.mkdir(parents=True)
        (src / "optimizer.pt").write_text(text)
        return str(src)

    target = tmp_path / "out" / "checkpoint-2"
    target.parent.mkdir()
    move_into_place(trainer_checkpoint("a", "one"), str(target), "checkpoint")
    move_into_place(trainer_checkpoint("b", "two"), str(target), "checkpoint")
    assert (target / "optimizer.pt").read_text() == "two"
    (target / "my_eval").mkdir()
    with pytest.raises(NvkitError, match="my_eval/"):
        move_into_place(trainer_checkpoint("c", "three"), str(target), "checkpoint")
    assert (target / "my_eval").is_dir() and (target / "optimizer.pt").read_text() == "two"
    assert os.listdir(target.parent) == ["checkpoint-2"]


def test_finetune_refuses_before_training_when_its_adapter_folder_holds_user_files(tmp_path):
    """check_output_dir applies the rule up front: nothing trains to be refused at the end."""
    from nvkit.train.finetune import check_output_dir
    out = tmp_path / "out"
    save_atomic(_Saver(), str(out / "adapter"))
    check_output_dir(str(out))
    (out / "adapter" / "MY_NOTES.txt").write_text("mine")
    with pytest.raises(NvkitError, match="MY_NOTES.txt"):
        check_output_dir(str(out))
