"""A short request before anything is captured: plain generate or the fast path's capture first,
by expected time (``fast.first_request``), with the capture's seconds kept per machine and model in
a JSON file that is read back only under nvkit's cache rule."""

import copy
import json
import math
import os

import pytest

import nvkit
import nvkit.generate.fast as fast
from nvkit.generate.fast import first_request, support
from tests import demo_model


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NVKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _worth(s, n, plain_per_token=None):
    s.decoders.plain_per_token = plain_per_token
    gen = dict(max_new_tokens=n, do_sample=False)
    try:
        return support.worth_capturing(s, 3, gen, fast.resolve(s.model, gen)[0])
    finally:
        s.decoders.plain_per_token = None


def test_the_quicker_way_wins():
    slow_plain = first_request.expected(24, plain_per_token=0.09, capture=1.0, fast_per_token=0.002)
    assert slow_plain.capture_pays and slow_plain.plain == pytest.approx(2.16) and slow_plain.fast == pytest.approx(1.048)
    quick_plain = first_request.expected(8, plain_per_token=0.01, capture=1.0, fast_per_token=0.002)
    assert not quick_plain.capture_pays
    assert "0.08 s (estimated)" in quick_plain.words(8) and "(1.0 s, estimated)" in quick_plain.words(8)
    measured = first_request.expected(8, 0.01, 1.0, plain_from="measured in this session",
                                      capture_from="as measured on this machine")
    assert "measured in this session" in measured.words(8) and "as measured on this machine" in measured.words(8)


def test_a_capture_time_is_kept_per_model_and_read_back(s, cache):
    assert first_request.stored_capture(s.model, s.device) is None  # nothing on record: the prior
    first_request.remember_capture(s.model, s.device, 0.8)
    assert first_request.stored_capture(s.model, s.device) == pytest.approx(0.8)
    other = copy.deepcopy(s.model)
    other.config.rms_norm_eps = 1e-5  # another config: another entry
    assert first_request.stored_capture(other, s.device) is None  # another shape, another entry
    # the smallest counts: a process's first capture also pays one-off costs a later one may not
    first_request.remember_capture(s.model, s.device, 1.25)
    assert first_request.stored_capture(s.model, s.device) == pytest.approx(0.8)
    first_request.remember_capture(s.model, s.device, 0.6)
    assert first_request.stored_capture(s.model, s.device) == pytest.approx(0.6)
    path = cache / "fast-decode" / "first-capture.json"
    assert json.loads(path.read_text()) and oct(path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan, math.inf, 1e9])
def test_a_capture_time_that_is_not_one_is_not_kept(s, cache, seconds):
    first_request.remember_capture(s.model, s.device, seconds)
    assert first_request.stored_capture(s.model, s.device) is None


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"k": "x"}', ""])
def test_a_broken_file_means_the_prior(s, cache, text):
    first_request.remember_capture(s.model, s.device, 0.5)
    path = cache / "fast-decode" / "first-capture.json"
    key = next(iter(json.loads(path.read_text())))
    path.write_text(text if text != '{"k": "x"}' else json.dumps({key: "x"}))
    assert first_request.stored_capture(s.model, s.device) is None
    first_request.remember_capture(s.model, s.device, 0.7)  # and the next session writes a good one
    assert first_request.stored_capture(s.model, s.device) == pytest.approx(0.7)


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="file modes are POSIX")
def test_a_file_others_can_write_is_not_read(s, cache):
    first_request.remember_capture(s.model, s.device, 0.5)
    path = cache / "fast-decode" / "first-capture.json"
    os.chmod(path, 0o666)  # as a planted file in a shared cache would be
    assert first_request.stored_capture(s.model, s.device) is None


def test_the_first_short_request_takes_the_quicker_way(s, cache):
    """The demo model has few layers: with the priors plain generate is the quicker answer; a plain
    cost measured in this session and a capture on record here turn it around."""
    why = _worth(s, 24)
    assert why and "plain generate answers 24 new tokens" in why and "(estimated)" in why and "prepare" in why
    assert _worth(s, 24, plain_per_token=0.09) is None  # 2.2 s plain against a 1.5 s capture
    first_request.remember_capture(s.model, s.device, 30.0)  # a slow capture on record here
    why = _worth(s, 24, plain_per_token=0.09)
    assert why and "30.0 s, as measured on this machine" in why and "measured in this session" in why
    first_request.remember_capture(s.model, s.device, 0.3)
    assert _worth(s, 24, plain_per_token=0.05) is None
    assert _worth(s, fast.default_options().min_tokens) is None  # long requests always capture


def test_a_first_plain_request_on_this_machine_stands_in_for_the_prior(s, cache):
    """A session that has not run plain generate yet takes a first plain request's cost per token
    on this machine (one-off costs included) before the layer-count prior; its own measure wins."""
    first_request.remember_capture(s.model, s.device, 1.0)
    assert _worth(s, 24)  # the demo's few layers: plain is estimated quicker than a 1 s capture
    first_request.remember_plain(s.model, s.device, 0.1)  # a slow host: 2.4 s for 24 tokens
    e = first_request.estimate(s.model, s.device, None, 24)
    assert e.plain == pytest.approx(2.4) and "as a first request took on this machine" in e.words(24)
    assert _worth(s, 24) is None
    first_request.remember_plain(s.model, s.device, 0.02)  # the latest first request counts
    assert first_request.stored_plain(s.model, s.device) == pytest.approx(0.02) and _worth(s, 24)
    assert _worth(s, 24, plain_per_token=0.2) is None  # the session's own measure before the record
    assert first_request.stored_capture(s.model, s.device) == pytest.approx(1.0)  # two entries, one file


def test_a_session_whose_decoder_has_captured_weighs_one_more_graph(s, cache):
    """Another sampling mode or an adapter switched on (compare's two sides): the decoder exists,
    so one more graph costs what this session's graphs took, not a first capture."""
    d = fast.FastDecoder(s.model, k_steps=4, graphs=False)
    fast.swap(s, d)  # as fast.decoder(session) keeps it
    try:
        first_request.remember_capture(s.model, s.device, 30.0)  # a slow first capture on record
        assert _worth(s, 24, plain_per_token=0.05)  # no graph in this session yet: the record counts
        d.capture_seconds[(256, ("greedy", 0, False, False), False, False)] = 0.2
        d.capture_seconds[("prefill", 16, False)] = 5.0  # a prefill graph is not a decode step's capture
        assert _worth(s, 24, plain_per_token=0.05) is None  # 1.2 s plain against 0.3 s
        why = _worth(s, 2, plain_per_token=0.05)
        assert why and "(0.2 s, as this session's graphs took)" in why
    finally:
        fast.forget(s)


def _worth_list(s, prompts, steps, plain_per_token=None):
    """fast.worth_batching as the route asks it, on a session whose rows have captured nothing."""
    from types import SimpleNamespace
    decoders = fast.Decoders()
    decoders.plain_per_token = plain_per_token
    on_gpu = SimpleNamespace(model=s.model, tokenizer=s.tokenizer, device=s.device, quantization=None, decoders=decoders)
    return support.worth_batching(on_gpu, prompts, dict(max_new_tokens=steps))


def test_a_short_first_list_takes_the_quicker_way(s, cache):
    """A short list weighs padded generate's steps at the plain cost per token (about one prompt's
    host time per step, whatever its rows) against the rows path's first capture: on a slow host
    3 prompts × 32 capture the rows (the afternoon's list of 3 took 9.4 s on padded generate)."""
    why = _worth_list(s, 2, 8)  # the demo's few layers, the priors: plain is quicker
    assert why and why.startswith("not captured yet, and plain generation of 2 prompts × 8 new tokens takes about")
    assert "the batched fast path about" in why and "(1.5 s, estimated)" in why
    assert _worth_list(s, 3, 32, plain_per_token=0.29) is None           # 9.3 s against 1.6 s
    first_request.remember_capture(s.model, s.device, 20.0, what="rows")  # a slow first rows capture on record
    why = _worth_list(s, 3, 32, plain_per_token=0.29)
    assert why and "(20.0 s, as measured on this machine)" in why
    assert first_request.stored_capture(s.model, s.device) is None       # the batch-1 path's record apart
    first_request.remember_capture(s.model, s.device, 0.6, what="rows")  # the smallest counts
    assert _worth_list(s, 3, 32, plain_per_token=0.05) is None
    assert _worth_list(s, 2, fast.default_options().min_tokens) is None  # enough tokens in all: always


def test_a_capture_that_compiled_tritons_kernels_is_kept_apart(s, cache, monkeypatch):
    """A machine's first capture compiles Triton's kernels (its cache gains entries): while the
    cache still holds them the next session's capture loads them instead, so the prior stands in;
    a cache that lost entries (emptied, a fresh container) makes the compiling figure count."""
    now = {"entries": 40}
    monkeypatch.setattr(first_request, "triton_cache_entries", lambda: now["entries"])
    first_request.remember_capture(s.model, s.device, 5.9, entries_before=12, entries_after=40)
    assert first_request.stored_capture(s.model, s.device) is None  # not this machine's usual capture
    e = first_request.estimate(s.model, s.device, 0.17, 24)
    assert e.capture == pytest.approx(first_request.CAPTURE_SECONDS) and e.capture_pays
    assert "first capture took 5.9 s compiling Triton's kernels, which are on disk now" in e.words(24)
    now["entries"] = 3  # the cache was emptied since
    e = first_request.estimate(s.model, s.device, 0.17, 24)
    assert e.capture == pytest.approx(5.9) and not e.capture_pays
    assert "as measured on this machine, compiling Triton's kernels" in e.words(24)
    first_request.remember_capture(s.model, s.device, 1.3, entries_before=40, entries_after=40)  # loaded them
    e = first_request.estimate(s.model, s.device, 0.17, 24)
    assert e.capture == pytest.approx(1.3) and "(1.3 s, as measured on this machine)" in e.words(24)
    first_request.remember_capture(s.model, s.device, 0.9, what="rows", entries_before=None, entries_after=41)
    assert first_request.stored_capture(s.model, s.device, "rows") == pytest.approx(0.9)  # unknown: as measured


def test_tritons_cache_entries_are_counted_where_triton_keeps_them(tmp_path, monkeypatch):
    import triton.knobs
    folder = tmp_path / "triton"
    monkeypatch.setattr(triton.knobs.cache, "dir", str(folder))
    assert first_request.triton_cache_entries() == 0  # no folder yet: a fresh machine's, which compiles
    folder.mkdir()
    (folder / "ABC").mkdir()
    (folder / "DEF").mkdir()
    assert first_request.triton_cache_entries() == 2
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(triton.knobs.cache, "dir", str(tmp_path / "file"))
    assert first_request.triton_cache_entries() is None  # not a folder: unknown


def test_a_fresh_machines_first_capture_counts_as_compiling(s, cache, monkeypatch):
    """On a machine that never ran Triton its cache folder does not exist until the first capture
    compiles into it: that capture's seconds are the compiling
    figure, not this machine's usual capture, or every later session's first request goes plain."""
    import triton.knobs
    folder = cache / "no-triton-yet"
    monkeypatch.setattr(triton.knobs.cache, "dir", str(folder))
    before = first_request.triton_cache_entries()
    folder.mkdir(parents=True)
    for i in range(30):
        (folder / f"K{i}").mkdir()
    first_request.remember_capture(s.model, s.device, 4.8, entries_before=before,
                                   entries_after=first_request.triton_cache_entries())
    assert first_request.stored_capture(s.model, s.device) is None
    e = first_request.estimate(s.model, s.device, 0.17, 24)
    assert e.capture == pytest.approx(first_request.CAPTURE_SECONDS) and e.capture_pays


def test_only_a_capture_of_the_uncompiled_step_is_kept(s, cache):
    """A session that asked for a compiled step pays inductor's compile in its first capture: that
    is not the first request's capture, and a record of it would keep the next sessions on plain."""
    from nvkit.generate.fast.cuda_graphs import PARTS, Timings
    assert first_request.UNCOMPILED_PARTS <= set(PARTS)
    t = Timings({"set-up": 0.1, "warm-up": 0.7, "capture": 0.2})
    assert first_request.first_capture_seconds(t) == pytest.approx(1.0)
    t["prefill graphs"] += 0.3
    assert first_request.first_capture_seconds(t) == pytest.approx(1.3)
    for part in ("compile and warm-up", "compile prefill", "compile artifacts from disk", "measure"):
        assert first_request.first_capture_seconds(Timings({**t, part: 2.5})) is None, part
    assert first_request.first_capture_seconds(Timings({**t, "compile prefill": 0.0})) == pytest.approx(1.3)
    assert first_request.first_capture_seconds(Timings()) is None  # nothing prepared: nothing to keep
    # what a session keeps from its first request's decoder: the uncompiled capture, not a compiled one
    first_request.remember_first_capture(s.model, s.device, Timings({**t, "compile and warm-up": 9.0}))
    assert first_request.stored_capture(s.model, s.device) is None
    first_request.remember_first_capture(s.model, s.device, t)
    assert first_request.stored_capture(s.model, s.device) == pytest.approx(1.3)
