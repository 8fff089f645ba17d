"""The routes under hostile input on a real (in-process) Jupyter server: no write through a link that
leads outside the served root, a capped body, JSON 4xx errors that name no absolute server path,
and no absolute paths in the tutorial list. (Process names of other users: test_gpu_attribution.)"""

import json
import os

import pytest
import tornado.httpclient

from tests.server.helpers import fetch_error


def _no_absolute_paths(body: bytes, *roots) -> None:
    text = body.decode()
    for r in roots:
        assert str(r) not in text, text
        assert os.path.realpath(r) not in text, text


async def _copy(jp_fetch, body="", **params):
    return await jp_fetch("nvkit", "api", "tutorials", "00-hello.ipynb", method="POST", body=body,
                          params=params or None)


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    return d


async def test_no_write_through_a_file_link_leading_outside(jp_fetch, tutorials, jp_root_dir,
                                                            outside):
    mine = outside / "precious.ipynb"
    mine.write_text("the user's own file")
    (jp_root_dir / "00-hello.ipynb").symlink_to(mine)
    e = await fetch_error(_copy(jp_fetch, overwrite="true"))
    assert e.code == 403
    assert "outside" in json.loads(e.response.body)["message"]
    assert mine.read_text() == "the user's own file"
    _no_absolute_paths(e.response.body, jp_root_dir, outside)


async def test_no_write_through_a_dangling_link_leading_outside(jp_fetch, tutorials,
                                                                jp_root_dir, outside):
    (jp_root_dir / "00-hello.ipynb").symlink_to(outside / "new.ipynb")
    e = await fetch_error(_copy(jp_fetch))
    assert e.code == 403
    assert list(outside.iterdir()) == []


async def test_no_write_into_a_folder_link_leading_outside(jp_fetch, tutorials, jp_root_dir,
                                                           outside):
    (jp_root_dir / "work").symlink_to(outside, target_is_directory=True)
    e = await fetch_error(_copy(jp_fetch, body=json.dumps({"dir": "work"})))
    assert e.code == 403
    assert list(outside.iterdir()) == []
    _no_absolute_paths(e.response.body, jp_root_dir, outside)


async def test_a_link_inside_the_root_is_fine(jp_fetch, tutorials, jp_root_dir):
    (jp_root_dir / "real").mkdir()
    (jp_root_dir / "alias").symlink_to(jp_root_dir / "real", target_is_directory=True)
    r = await _copy(jp_fetch, body=json.dumps({"dir": "alias"}))
    assert r.code == 201
    assert (jp_root_dir / "real" / "00-hello.ipynb").is_file()


async def test_a_deeply_nested_body_is_a_4xx(jp_fetch, tutorials, jp_root_dir):
    e = await fetch_error(_copy(jp_fetch, body="[" * 100_000 + "]" * 100_000))
    assert 400 <= e.code < 500
    assert "traceback" not in json.loads(e.response.body)
    # small enough to pass the size cap, still deeper than Python's recursion limit
    e = await fetch_error(_copy(jp_fetch, body='{"dir": ' + "[" * 5000 + "]" * 5000 + "}"))
    assert e.code == 400
    assert "traceback" not in json.loads(e.response.body)
    assert list(jp_root_dir.iterdir()) == []


async def test_a_large_body_is_413(jp_fetch, tutorials, jp_root_dir):
    e = await fetch_error(_copy(jp_fetch, body=json.dumps({"dir": "x" * 100_000})))
    assert e.code == 413
    assert "message" in json.loads(e.response.body)


async def test_a_folder_with_the_tutorials_name_is_a_409_without_paths(jp_fetch, tutorials,
                                                                       jp_root_dir):
    (jp_root_dir / "00-hello.ipynb").mkdir()
    (jp_root_dir / "00-hello.ipynb" / "keep.txt").write_text("mine")
    for params in ({}, {"overwrite": "true"}):
        e = await fetch_error(_copy(jp_fetch, **params))
        assert e.code == 409, e.response.body
        body = json.loads(e.response.body)
        assert "folder" in body["message"] and "traceback" not in body
        _no_absolute_paths(e.response.body, jp_root_dir)
    assert (jp_root_dir / "00-hello.ipynb" / "keep.txt").read_text() == "mine"


async def test_a_write_the_contents_manager_refuses_is_a_4xx_without_paths(
        jp_fetch, jp_serverapp, tutorials, jp_root_dir, monkeypatch):
    cm = jp_serverapp.contents_manager

    def failing_save(model, path):
        raise tornado.web.HTTPError(500, f"Unexpected error while saving file: {path} "
                                         f"[Errno 28] No space left on device: '{jp_root_dir / path}'")
    monkeypatch.setattr(cm, "save", failing_save)
    e = await fetch_error(_copy(jp_fetch))
    assert 400 <= e.code < 500
    body = json.loads(e.response.body)
    assert "No space left" in body["message"] and "00-hello.ipynb" in body["message"]
    _no_absolute_paths(e.response.body, jp_root_dir)


async def test_the_tutorial_list_names_no_server_paths(jp_fetch, tutorials, jp_root_dir):
    r = await jp_fetch("nvkit", "api", "tutorials")
    data = json.loads(r.body)["tutorials"]
    assert [t["name"] for t in data] == ["00-hello.ipynb", "01-untitled.ipynb"]
    assert all(set(t) == {"name", "title"} for t in data), data
    _no_absolute_paths(r.body, tutorials, jp_root_dir)
    assert "/" not in r.body.decode().replace("\\/", "")
