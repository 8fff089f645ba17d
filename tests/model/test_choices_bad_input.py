"""``attention_backends(device)`` and ``quantization_methods(device)`` with devices that are not
devices, or not here: NvkitError naming the forms a device takes; the session is untouched."""

import pytest

import nvkit
from tests.refusals import refused


FUNCTIONS = {"attention_backends": lambda d: nvkit.attention_backends(d),
             "quantization_methods": lambda d: nvkit.quantization_methods(d)}

DEVICES = [
    (-1, "a GPU number ≥ 0"), ("gpu", "'cpu', 'cuda', 'cuda:N'"), ([], "'cpu', 'cuda', 'cuda:N'"),
    (1.5, "'cpu', 'cuda', 'cuda:N'"), (True, "'cpu', 'cuda', 'cuda:N'"), ("cuda:-1", "'cpu', 'cuda', 'cuda:N'"),
    ("cuda:x", "'cpu', 'cuda', 'cuda:N'"), (b"cpu", "'cpu', 'cuda', 'cuda:N'"), ("cuda:99", "cuda:99 does not exist"),
    (99, "cuda:99 does not exist"),
]


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("device, words", DEVICES, ids=[repr(d) for d, _ in DEVICES])
def test_bad_device(survivor, fn, device, words):
    refused(lambda: FUNCTIONS[fn](device), words, survivor=survivor)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_good_devices_still_answer(fn):
    table = FUNCTIONS[fn]("cpu")
    assert table and all(isinstance(c.available, bool) for c in table)
    assert FUNCTIONS[fn](None)
