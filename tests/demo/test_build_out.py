"""Issue 35: ``python -m nvkit.demo.build --out DIR`` removes the files a build writes before
writing them again; it must not do that in a folder it did not build (another model's config.json
and weights). Fails on the code before (which deleted them)."""

import pytest

from nvkit import NvkitError
from nvkit.demo import build


def test_build_refuses_a_folder_holding_another_models_files(tmp_path):
    (tmp_path / "config.json").write_text("my model's config")
    (tmp_path / "model.safetensors").write_bytes(b"my weights")
    with pytest.raises(NvkitError, match="config.json, model.safetensors and no nvkit_demo.json"):
        build.build(tmp_path, steps=1, seed=0, vocab_size=300, batch_size=1, seq_len=8, lr=1e-3, log=lambda *a: None)
    assert (tmp_path / "config.json").read_text() == "my model's config"
    assert (tmp_path / "model.safetensors").read_bytes() == b"my weights"


def test_build_accepts_a_new_folder_and_one_it_built(tmp_path):
    build._check_out(tmp_path / "new")
    (tmp_path / "notes.txt").write_text("other files are left alone anyway")
    build._check_out(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "nvkit_demo.json").write_text("{}")
    build._check_out(tmp_path)
