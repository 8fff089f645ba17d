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
