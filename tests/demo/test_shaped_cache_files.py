"""The shaped-model cache is nvkit's own: under a shared ``NVKIT_CACHE`` its folder is ``0700``
(other users can neither read the checkpoint nor swap it), and a planted symlink in place of that
folder is refused rather than followed."""

import os
import stat

import pytest

from nvkit import NvkitError, demo


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def shared(monkeypatch, tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    monkeypatch.setenv("NVKIT_CACHE", str(d))
    return d


def test_the_shaped_cache_folder_is_private(shared):
    built = demo.shaped("qwen3-tiny")
    assert os.path.dirname(built) == str(shared / "shaped")
    assert mode(shared / "shaped") == 0o700 and mode(built) == 0o700
    assert mode(shared) == 0o777        # the user's folder is theirs


def test_a_planted_symlink_for_the_cache_folder_is_refused(shared, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared / "shaped").symlink_to(elsewhere)
    with pytest.raises(NvkitError, match="shaped-model cache.*symlink.*NVKIT_CACHE"):
        demo.shaped("qwen3-tiny")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("marker", ["[]", "5", "null", '"x"', "{", '{"fingerprint": 1}'])
def test_a_corrupt_marker_means_rebuild_not_a_traceback(tmp_path, marker):
    import json

    from nvkit.demo.shaped import _MARKER
    built = demo.shaped("qwen3-tiny", cache_dir=tmp_path)
    (tmp_path / "qwen3-tiny" / _MARKER).write_text(marker)
    again = demo.shaped("qwen3-tiny", cache_dir=tmp_path)
    assert again == built
    assert isinstance(json.loads((tmp_path / "qwen3-tiny" / _MARKER).read_text())["fingerprint"], str)
    assert os.path.isfile(os.path.join(again, "config.json"))
