"""The tutorial copy route under jupytext's contents manager (what `make lab` runs, jupytext being in
the test extra): a copy into a folder whose jupytext.toml pairs notebooks with ``src/`` writes both
files, and a copy that fails half-way leaves nothing it made behind."""

import json

import pytest

from tests.server.helpers import fetch_error

PAIRING = 'formats = "ipynb,src//py:percent"\n'


@pytest.fixture
def jp_server_config():
    # nvkit's route, and jupytext's server extension swapping in its contents manager as in a lab
    return {"ServerApp": {"jpserver_extensions": {"nvkit": True, "jupyterlab_jupytext": True}}}


async def test_jupytext_contents_manager_is_active(jp_serverapp):
    assert hasattr(jp_serverapp.contents_manager, "formats"), type(jp_serverapp.contents_manager)


async def test_copy_into_a_paired_folder_writes_both_files(jp_fetch, tutorials, jp_root_dir):
    (jp_root_dir / "paired").mkdir()
    (jp_root_dir / "paired" / "jupytext.toml").write_text(PAIRING)
    r = await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                       body=json.dumps({"dir": "paired"}))
    assert r.code == 201, r.body
    nb = json.loads((jp_root_dir / "paired" / "00-hello.ipynb").read_text())
    assert "".join(nb["cells"][0]["source"]).startswith("# Hello GPUs")
    py = (jp_root_dir / "paired" / "src" / "00-hello.py").read_text()
    assert "# # Hello GPUs" in py and "nvkit.panel()" in py


async def test_the_written_notebook_is_the_tutorial(jp_fetch, tutorials, jp_root_dir):
    # what reaches the disk reads back as the tutorial (nbformat writes the lines split again)
    import nbformat
    await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST", body="")
    copy = nbformat.read(jp_root_dir / "00-hello.ipynb", as_version=4)
    shipped = nbformat.read(tutorials / "00-hello.ipynb", as_version=4)
    assert [c.source for c in copy.cells] == [c.source for c in shipped.cells]


def _tree(root):
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


async def test_a_failed_paired_write_leaves_nothing_half_made(jp_fetch, tutorials, jp_root_dir):
    # a file named src where the pairing wants a folder: the .ipynb is written first, the .py fails
    d = jp_root_dir / "paired"
    d.mkdir()
    (d / "jupytext.toml").write_text(PAIRING)
    (d / "src").write_text("my notes, not a folder")
    before = _tree(jp_root_dir)
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body=json.dumps({"dir": "paired"})))
    assert 400 <= e.code < 500
    message = json.loads(e.response.body)["message"]
    assert message.startswith("could not write paired/00-hello.ipynb: ") and str(jp_root_dir) not in message
    assert _tree(jp_root_dir) == before                       # no .ipynb left behind
    assert (d / "src").read_text() == "my notes, not a folder"
    # and the next click does not say "already copied"
    (d / "src").unlink()
    r = await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                       body=json.dumps({"dir": "paired"}))
    assert r.code == 201 and (d / "src" / "00-hello.py").is_file()


async def test_a_failure_after_making_the_folder_removes_it(jp_fetch, tutorials, jp_root_dir,
                                                            monkeypatch):
    import jupytext.async_contentsmanager as jcm

    def boom(*a, **k):
        raise RuntimeError("the text writer failed")
    monkeypatch.setattr(jcm, "writes", boom)
    d = jp_root_dir / "paired"
    d.mkdir()
    (d / "jupytext.toml").write_text(PAIRING)
    before = _tree(jp_root_dir)
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body=json.dumps({"dir": "paired"})))
    assert "the text writer failed" in json.loads(e.response.body)["message"]
    assert _tree(jp_root_dir) == before                       # neither the .ipynb nor src/


async def test_a_failure_keeps_what_was_there_before(jp_fetch, tutorials, jp_root_dir, monkeypatch):
    import jupytext.async_contentsmanager as jcm

    def boom(*a, **k):
        raise RuntimeError("the text writer failed")
    monkeypatch.setattr(jcm, "writes", boom)
    d = jp_root_dir / "paired"
    (d / "src").mkdir(parents=True)
    (d / "jupytext.toml").write_text(PAIRING)
    (d / "src" / "00-hello.py").write_text("# my own script of that name\n")
    (d / "src" / "other.py").write_text("x = 1\n")
    before = _tree(jp_root_dir)
    await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                               body=json.dumps({"dir": "paired"})))
    assert _tree(jp_root_dir) == before
    assert (d / "src" / "00-hello.py").read_text() == "# my own script of that name\n"


async def test_an_unchanged_copy_says_so(jp_fetch, tutorials, jp_root_dir):
    await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST", body="")
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body=""))
    assert e.code == 409 and json.loads(e.response.body)["unchanged"] is True
    # once run (outputs) or edited, it is the user's: the page asks
    copy = json.loads((jp_root_dir / "00-hello.ipynb").read_text())
    copy["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "hi\n"}]
    (jp_root_dir / "00-hello.ipynb").write_text(json.dumps(copy))
    e = await fetch_error(jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST",
                                   body=""))
    assert json.loads(e.response.body)["unchanged"] is False
