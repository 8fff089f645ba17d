"""``memory_report``, ``monitor``, the shared sampler and ``mark`` with wrong arguments: NvkitError
naming the argument, and the demo session generating as before."""

import pytest

import nvkit
from nvkit.memory import sampling
from tests.refusals import refused


REPORT = [
    (dict(unit=[]), ["unit must be one of 'bytes', 'MiB', 'GiB'", "not []"]),
    (dict(unit={"GiB": 1}), ["unit must be one of"]),
    (dict(unit="kb"), ["unit must be one of", "'kb'"]),
    (dict(unit=None), ["unit must be one of"]),
    (dict(unit=5), ["unit must be one of"]),
    (dict(devices="0"), ["devices must be a list of cuda indices"]),
    (dict(devices=0), ["devices must be a list of cuda indices"]),
    (dict(devices=[0.5]), ["devices must be a list of cuda indices"]),
    (dict(devices=[True]), ["devices must be a list of cuda indices"]),
    (dict(devices=[99]), ["No cuda:99 to report"]),
    (dict(devices=[-1]), ["No cuda:-1 to report"]),
]


@pytest.mark.parametrize("kwargs, words", REPORT, ids=[str(k) for k, _ in REPORT])
def test_memory_report_refuses(survivor, kwargs, words):
    refused(lambda: nvkit.memory_report(**kwargs), *words, survivor=survivor)


MONITOR = [
    (dict(rate_hz=0), ["rate_hz must be a finite number in (0, 20]"]),
    (dict(rate_hz=50), ["rate_hz"]),
    (dict(rate_hz="fast"), ["rate_hz"]),
    (dict(rate_hz=float("nan")), ["rate_hz"]),
    (dict(rate_hz=True), ["rate_hz"]),
    (dict(window_s=0), ["window_s"]),
    (dict(window_s="x"), ["window_s"]),
    (dict(window_s=float("inf")), ["window_s"]),
    (dict(devices=[7]), ["No cuda:7"]),
    (dict(devices="0"), ["devices must be a list of cuda indices"]),
]


@pytest.mark.parametrize("kwargs, words", MONITOR, ids=[str(k) for k, _ in MONITOR])
def test_monitor_refuses(survivor, kwargs, words):
    refused(lambda: nvkit.monitor(**kwargs), *words, survivor=survivor)


@pytest.mark.parametrize("kwargs", [dict(window_s="x"), dict(window_s=-1), dict(window_s=10**6), dict(rate_hz="x"),
                                    dict(rate_hz=-1)], ids=str)
def test_the_shared_sampler_refuses_even_when_one_exists(survivor, kwargs):
    sampling.sampler(start=False)        # one exists: a bad value must not slip past as "no change"
    word = next(iter(kwargs))
    refused(lambda: sampling.sampler(start=False, **kwargs), word, survivor=survivor)


@pytest.mark.parametrize("text", [5, "", "   ", None, b"x", ["a"]], ids=repr)
def test_mark_refuses(survivor, text):
    refused(lambda: nvkit.mark(text), "nvkit.mark needs a non-empty text", survivor=survivor)
