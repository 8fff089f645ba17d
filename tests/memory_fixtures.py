"""Fixtures shared by the memory tests: a fake 2-GPU inventory, or none, with a fresh default sampler."""

import pytest

from nvkit import memory

@pytest.fixture
def fake_gpus(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    memory._reset_default_sampler()
    yield
    memory._reset_default_sampler()


@pytest.fixture
def no_gpus(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "[]")
    memory._reset_default_sampler()
    yield
    memory._reset_default_sampler()
