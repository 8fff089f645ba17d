"""What nvkit adds per token on the plain path (``fast=False``): the streamer decodes a short
window per token (not the whole text again), nothing at all without a stream callback, and the
stop criterion allocates nothing per token. The per-token host time of ``run_plain`` beside
``model.generate`` is printed (run with -s); no timing is asserted, only that both make the same
tokens."""

import threading
import time

import pytest
import torch

import nvkit
from nvkit.generate import paths
from tests import demo_model  # noqa: E402

NEVER = 10 ** 7


@pytest.fixture(scope="module")
def s():
    sess = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    yield sess
    sess.unload()


class _CountingTokenizer:
    """The real tokenizer, counting how many ids ``decode`` is asked to read."""

    def __init__(self, tok):
        self.tok, self.decoded = tok, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kw)


def test_streamer_pieces_make_the_text_and_decode_a_window_per_token(s):
    ids = s.tokenizer("Die Grafikkarte 🚀 rechnet schnell — très vite, 速い! " * 8)["input_ids"]
    tok = _CountingTokenizer(s.tokenizer)
    pieces = []
    st = paths.CallbackStreamer(tok, pieces.append)
    st.put(torch.tensor([[1, 2]]))  # the prompt: skipped
    for t in ids:
        st.put(torch.tensor([t]))
    st.end()
    assert "".join(pieces) == s.tokenizer.decode(ids, skip_special_tokens=True)
    assert tok.decoded < 12 * len(ids)  # a window per token; the whole text again would be ~len(ids)**2
    silent, counted = _CountingTokenizer(s.tokenizer), []
    quiet = paths.CallbackStreamer(silent, None, counted.append)
    quiet.put(torch.tensor([[1, 2]]))
    for t in ids[:10]:
        quiet.put(torch.tensor([t]))
    quiet.end()
    assert silent.decoded == 0 and counted == [1] * 10


def test_stop_criterion_answers_with_the_same_tensors():
    ev = threading.Event()
    stop = paths.StopOnEvent(ev)
    ids = torch.zeros((3, 5), dtype=torch.long)
    a, b = stop(ids, None), stop(ids, None)
    assert a is b and not a.any() and a.shape == (3,)
    ev.set()
    assert stop(ids, None).all()


def test_plain_path_per_token_host_time_beside_transformers(s):
    torch.set_num_threads(1)  # the same thread count for both, in this thread
    tok, m = s.tokenizer, s.model
    prompt, n = "NVIDIA GPUs are", 64

    class Job:
        stop_event = threading.Event()
    gen = dict(max_new_tokens=n, do_sample=False, eos_token_id=NEVER, pad_token_id=tok.pad_token_id)
    enc = tok(prompt, return_tensors="pt")

    def hf():
        with torch.inference_mode():
            return tok.decode(m.generate(**enc, **gen)[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    def ours(stream):
        req = paths.Request(Job, [prompt], dict(gen), stream=stream)
        with torch.inference_mode():
            return paths.run_plain(s, req)[0]

    assert hf() == ours(None) == ours(lambda piece: None)
    times = {"model.generate": [], "run_plain": [], "run_plain streamed": []}
    for _ in range(3):
        for name, fn in (("model.generate", hf), ("run_plain", lambda: ours(None)),
                         ("run_plain streamed", lambda: ours(lambda piece: None))):
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) / n * 1000)
    print("\nms per token (median of 3):", {k: round(sorted(v)[1], 3) for k, v in times.items()})
