"""Everything under tests/gpu needs CUDA: marked ``gpu`` and skipped with the reason otherwise."""

import pytest


def _cuda_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _cuda_reason()
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}"))


class Kept:
    """A module's session, kept from test to test and loaded again where a test unloaded it:
    ``nvkit.load`` keeps one model, so a test that loads another (a shape) unloads the module's,
    and the tests after it would meet an unloaded session."""

    def __init__(self, load):
        self._load, self._session = load, None

    def session(self):
        if self._session is None or self._session.model is None:
            self._session = self._load()
        return self._session

    def unload(self):
        if self._session is not None and self._session.model is not None:
            self._session.unload()


def _load_demo():
    import nvkit
    from tests import demo_model
    # The trained demo model in its GPU dtype (bf16), as users get it; without it the random tiny
    # stand-in in fp32, whose near-ties bf16 would flip.
    return nvkit.load(demo_model.path(), device_map="cuda", dtype="auto" if demo_model.ready() else "float32")


def _load_qwen():
    import nvkit
    from tests import demo_model
    return nvkit.load(demo_model.shaped("qwen3-0.6b"), device_map="cuda", dtype="bfloat16")


@pytest.fixture(scope="module")
def _kept_demo():
    kept = Kept(_load_demo)
    yield kept
    kept.unload()


@pytest.fixture(scope="module")
def _kept_qwen():
    kept = Kept(_load_qwen)
    yield kept
    kept.unload()


@pytest.fixture
def demo_cuda(_kept_demo):
    """The demo model on the GPU, one session per module (``Kept``)."""
    return _kept_demo.session()


@pytest.fixture
def qwen(_kept_qwen):
    """The Qwen3-0.6B shape (random weights) in bf16 on the GPU, one session per module (``Kept``)."""
    return _kept_qwen.session()
