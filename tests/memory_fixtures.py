"""Fixtures shared by the memory tests: a fake 2-GPU inventory, or none, with a fresh default sampler."""

import pytest

import nvkit.memory.sampling
from nvkit import memory

@pytest.fixture
def fake_gpus(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    memory.sampling.forget_shared()
    yield
    memory.sampling.forget_shared()


@pytest.fixture
def no_gpus(monkeypatch):
    monkeypatch.setenv("NVKIT_FAKE_GPUS", "[]")
    memory.sampling.forget_shared()
    yield
    memory.sampling.forget_shared()
