"""How nvkit's kernels are launched: ``launch(kernel, grid, *args, **meta)`` is
``kernel[grid](*args, **meta)``, except in a thread inside ``compile_only()``, where it compiles what
that launch would run and launches nothing.

Why: a kernel's first launch on a machine whose Triton cache does not hold it (a new machine or
container) compiles it first, on the thread that launched it, while a request waits. Where the
launches to come are known before the request (``fast.compile_ahead``: the rows prefill's, from the
model's shapes), a background thread can run the same wrapper code on meta tensors (shapes and
dtypes, no memory) inside ``compile_only()``: each launch becomes Triton's ``warmup``, which binds
the arguments as the launch would (a tensor by its dtype, at an aligned address as fresh
allocations are; the other arguments as they are), compiles that specialisation into Triton's
caches and returns, and its launcher is built (``build_launcher``). The same code path builds the
arguments either way, so what is compiled ahead is what the request launches. Every launch site
goes through here: a wrapper that launched directly would, in that thread, launch on meta
tensors' null addresses."""

from __future__ import annotations

import contextlib
import threading

import torch

_local = threading.local()


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)``; inside ``compile_only()`` (this thread) the compile only."""
    names = getattr(_local, "names", None)
    if names is None:
        return kernel[grid](*args, **meta)
    compiled = kernel.warmup(*(a.dtype if isinstance(a, torch.Tensor) else a for a in args), grid=grid, **meta)
    build_launcher(compiled)
    names.append(getattr(kernel, "__name__", None) or repr(kernel))
    return None


def build_launcher(compiled) -> None:
    """Build the launcher of a compiled kernel (Triton's ``warmup`` result) into Triton's on-disk
    cache, which its first launch otherwise builds on the launching thread. Why: the Triton that
    torch 2.11 brings compiles a small C module per kernel signature with the system's C compiler
    when a kernel is first launched (a few tenths of a second each, a list's first token waiting
    on them on a new machine); a Triton whose launcher is generic builds nothing here. The launcher
    object is dropped: the first launch makes its own, from the cache. Nothing touches the GPU,
    and a launcher that cannot be built here is left to the launch (a head start only)."""
    src, metadata = getattr(compiled, "src", None), getattr(compiled, "metadata", None)
    if src is None or metadata is None:  # Triton's interpreter compiles nothing
        return
    try:
        from triton.runtime import driver
        driver.active.launcher_cls(src, metadata)
    except Exception:  # noqa: BLE001 - the launch builds it, and reports what is wrong, itself
        pass


@contextlib.contextmanager
def compile_only():
    """In this thread, each ``launch`` compiles its kernel for its arguments and launches nothing;
    yields the list of the kernels' names it was asked for, in order (Triton's interpreter, which
    compiles nothing, still names them)."""
    if getattr(_local, "names", None) is not None:
        raise RuntimeError("compile_only() is on in this thread already")
    names: list[str] = []
    _local.names = names
    try:
        yield names
    finally:
        _local.names = None
