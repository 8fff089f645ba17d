"""Issue 35: ``nvkit lab`` copies the tutorials only onto names where nothing is, not even a link
to a missing file (``os.path.exists`` is False for one, and the old copy created the file it points
to), and says why a tutorial is missing. Fails on the code before."""

import os

from nvkit import cli


def test_lab_does_not_copy_through_a_dangling_link(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(cli.subprocess, "call", lambda argv: started.append(argv) or 0)
    names = sorted(n for n in os.listdir(cli.tutorials_dir()) if n.endswith(".ipynb"))
    dest = tmp_path / "tutorials"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / names[0]).symlink_to(outside / "planted.ipynb")  # dangling
    (dest / names[1]).write_text("the user's edited copy")
    assert cli.main(["lab", "--dir", str(dest)]) == 0
    assert os.listdir(outside) == []  # the link's target was not created
    assert (dest / names[0]).is_symlink()
    assert (dest / names[1]).read_text() == "the user's edited copy"
    for name in names[2:]:
        assert (dest / name).is_file() and not (dest / name).is_symlink()
    err = capsys.readouterr().err
    assert f"{dest / names[0]} is a symbolic link" in err and "remove the link" in err
    assert names[1] not in err  # the user's own copy is the normal case: kept without a word
    assert started and f"--notebook-dir={dest}" in started[0]


def test_copy_new_never_opens_an_existing_name(tmp_path):
    src = tmp_path / "src.ipynb"
    src.write_text("tutorial")
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "link.ipynb").symlink_to(victim)
    assert cli.copy_new(str(src), str(tmp_path / "link.ipynb")) is False
    assert victim.read_text() == "mine"
    assert cli.copy_new(str(src), str(tmp_path / "new.ipynb")) is True
    assert (tmp_path / "new.ipynb").read_text() == "tutorial"
