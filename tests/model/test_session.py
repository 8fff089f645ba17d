"""The spine: load → generate → stop → unload on the demo model, and every error leaves the
session usable."""

import asyncio
import re
import threading
import time

import pytest

import nvkit
from nvkit import NvkitError


@pytest.fixture(scope="module")
def _demo():
    box = {}
    yield box
    if box.get("s") is not None:
        box["s"].unload()


@pytest.fixture
def s(_demo):
    """The module's demo session, loaded once; loaded again after a test whose nvkit.load replaced it
    (a load unloads the current session), so no test depends on which tests ran before it."""
    if _demo.get("s") is None or not _demo["s"].loaded:
        _demo["s"] = nvkit.load("demo")
    return _demo["s"]


def test_load_demo_is_current_and_described(s):
    assert nvkit.session() is s
    info = s.info
    assert info["architecture"] == "Qwen3ForCausalLM"
    assert 1e6 <= info["parameters"] <= 10e6
    assert info["devices"] == ["cpu"] and info["attention"] == "sdpa" and info["dtype"] == "float32"
    assert info["footprint_bytes"] > 0
    assert "Qwen3ForCausalLM" in s.summary()


def test_greedy_generation_gives_real_words(s):
    out = s.generate("NVIDIA GPUs are", max_new_tokens=12)
    assert isinstance(out, str)
    words = re.findall(r"[a-zA-Z]+", out)
    assert len(words) >= 4, out
    corpus = set(re.findall(r"[a-z]+", open(nvkit.demo.CORPUS, encoding="utf-8").read().lower()))
    known = [w for w in words if w.lower() in corpus]
    assert len(known) >= 0.7 * len(words), out
    # greedy is deterministic
    assert s.generate("NVIDIA GPUs are", max_new_tokens=12) == out
    st = s.last_stats
    assert st.new_tokens > 0 and st.seconds > 0 and st.time_to_first_token is not None


def test_list_in_list_out_in_input_order(s):
    prompts = ["NVIDIA GPUs are", "A notebook", "LoRA adapters"]
    outs = s.generate(prompts, max_new_tokens=6)
    assert isinstance(outs, list) and len(outs) == 3
    # each prompt alone gives the same greedy text as inside the left-padded batch
    for p, o in zip(prompts, outs):
        alone = s.generate(p, max_new_tokens=6)
        assert alone.split()[:2] == o.split()[:2], (p, alone, o)


def test_stream_callback_gets_pieces_that_join_to_the_result(s):
    pieces = []
    out = s.generate("NVIDIA GPUs are", max_new_tokens=15, stream=pieces.append)
    assert len(pieces) >= 3
    assert "".join(pieces) == out


def test_stop_from_another_thread_ends_early(s):
    timer = threading.Timer(0.3, s.stop)
    timer.start()
    t0 = time.perf_counter()
    s.generate("NVIDIA GPUs are", max_new_tokens=5000, min_new_tokens=5000)
    elapsed = time.perf_counter() - t0
    assert s.last_stats.stopped
    assert s.last_stats.new_tokens < 5000
    assert elapsed < 10


def test_agenerate_is_awaitable_and_stoppable(s):
    async def main():
        task = asyncio.ensure_future(s.agenerate("NVIDIA GPUs are", max_new_tokens=5000, min_new_tokens=5000))
        await asyncio.sleep(0.3)
        assert not task.done()  # the loop kept running while the worker generated
        s.stop()
        return await asyncio.wait_for(task, 10)

    out = asyncio.run(main())
    assert isinstance(out, str) and s.last_stats.stopped


def test_chat_uses_the_template(s):
    out = s.generate("What is a GPU?", max_new_tokens=8, chat=True, system="You are brief.")
    assert isinstance(out, str)
    rendered = s._prompt_text("What is a GPU?", True, "You are brief.", None)
    assert "<|im_start|>system" in rendered and rendered.rstrip().endswith("assistant")


def test_sampling_with_seed_is_reproducible(s):
    a = s.generate("NVIDIA GPUs are", max_new_tokens=10, do_sample=True, temperature=1.0, seed=7)
    b = s.generate("NVIDIA GPUs are", max_new_tokens=10, do_sample=True, temperature=1.0, seed=7)
    assert a == b


@pytest.mark.parametrize("kwargs, needle", [
    (dict(prompt="x", max_new_tokens=0), "max_new_tokens"),
    (dict(prompt="x", max_new_tokens=-3), "max_new_tokens"),
    (dict(prompt="x", max_new_tokens=2.5), "max_new_tokens"),
    (dict(prompt=[]), "empty"),
    (dict(prompt=""), "empty"),
    (dict(prompt=["ok", 3]), "string"),
    (dict(prompt=42), "string"),
    (dict(prompt="x", do_sample="yes"), "do_sample"),
    (dict(prompt="x", temperature=0), "temperature"),
    (dict(prompt="x", top_p=1.5), "top_p"),
    (dict(prompt="x", stream="print"), "stream"),
    (dict(prompt=["a", "b"], stream=print), "one prompt"),
    (dict(prompt="x", fast=True), "CUDA"),
])
def test_bad_generate_arguments_raise_and_session_stays_usable(s, kwargs, needle):
    with pytest.raises(NvkitError, match=needle):
        s.generate(**kwargs)
    assert s.generate("NVIDIA GPUs are", max_new_tokens=2)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(model="Qwen/Qwen3-0.6B"), "Hub"),
    (dict(model="/no/such/dir"), "checkpoint directory"),
    (dict(model=""), "model must be"),
    (dict(model="demo", dtype="float8"), "dtype"),
    (dict(model="demo", dtype=3), "dtype"),
    (dict(model="demo", device_map="cuda"), "CUDA"),
    (dict(model="demo", device_map="tpu"), "device_map"),
    (dict(model="demo", device_map={}), "empty"),
    (dict(model="demo", attn_implementation="nonsense"), "nonsense"),
    (dict(model="demo", quantization="int3"), "quantization"),
    (dict(model="demo", max_memory="20GiB"), "max_memory"),
])
def test_bad_load_arguments_keep_the_current_session(s, kwargs, needle):
    with pytest.raises(NvkitError, match=needle):
        nvkit.load(**kwargs)
    assert nvkit.session() is s and s.loaded
    assert s.generate("NVIDIA GPUs are", max_new_tokens=2)


def test_offline_hub_message_says_how_to_load_locally(s):
    with pytest.raises(NvkitError) as e:
        nvkit.load("someone/some-model")
    msg = str(e.value)
    assert "local" in msg and "nvkit.load('demo')" in msg
    assert e.value.__cause__ is not None  # the library error is kept


def test_unload_frees_memory_and_a_second_load_works():
    first = nvkit.load("demo")
    first.generate("NVIDIA GPUs are", max_new_tokens=3)
    freed = first.unload()
    assert freed > 0
    assert not first.loaded
    with pytest.raises(NvkitError, match="unloaded"):
        first.generate("x")
    assert first.unload() == 0  # idempotent
    with pytest.raises(NvkitError, match="No model is loaded"):
        nvkit.session()
    second = nvkit.load("demo")
    assert second.generate("NVIDIA GPUs are", max_new_tokens=3)
    # loading again replaces (unloads) the current session
    third = nvkit.load("demo")
    assert not second.loaded and nvkit.session() is third
    third.unload()


def test_local_directory_goes_through_from_pretrained(tmp_path):
    src = nvkit.load("demo")
    src.model.save_pretrained(tmp_path / "ckpt")
    src.tokenizer.save_pretrained(tmp_path / "ckpt")
    local = nvkit.load(str(tmp_path / "ckpt"))
    assert local.generate("NVIDIA GPUs are", max_new_tokens=5) == nvkit.load("demo").generate("NVIDIA GPUs are", max_new_tokens=5)
    nvkit.session().unload()


def test_mark_records_an_event():
    ev = nvkit.mark("before fine-tune")
    assert ev.kind == "mark" and ev.text == "before fine-tune"
    with pytest.raises(NvkitError):
        nvkit.mark("  ")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_request_whose_worker_thread_dies_before_it_runs_ends_with_an_error_and_the_next_one_runs():
    """A hook on new threads that raises (a profiler's, a debugger's) kills the session's worker
    before the request begins: generate raises NvkitError instead of waiting for ever, and the
    next request runs on a new worker thread."""
    from tests import demo_model
    s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
    try:
        def broken_hook(*_):
            raise RuntimeError("a profiler's hook failed")
        threading.setprofile(broken_hook)
        try:
            with pytest.raises(NvkitError, match="ended before it ran this work"):
                s.generate("Hello", max_new_tokens=2)
        finally:
            threading.setprofile(None)
        assert isinstance(s.generate("Hello", max_new_tokens=2), str)
    finally:
        s.unload()
