"""The fast-path runners a session owns (``Decoders``, the session's ``decoders``): the batch-1
decoder and the rows decoder, built on first use, replaced when asked for other options, and
released with the session's model (``Session.unload``). ``prepare`` warms them up on purpose.

They live on the session, not on the ``nn.Module``: the session is what loads, unloads and
attaches adapters, so it is what decides when its runners are made and dropped. Both run the
model's base (the causal LM under a PEFT wrapper), so attaching, merging or removing adapters
keeps them and their captures.
"""

from __future__ import annotations

import threading
from typing import Callable

from ...errors import NvkitError, require
from . import compile_ahead, support
from .options import default_options
from .paged_cache import FIRST_WIDTH, PAGE
from .schedule import pages_for
from .model_rows import ModelRowsDecoder
from .rows import BatchedDecoder
from .rows_invariant import InvariantRowsDecoder
from .runner import StepVariant, split_overrides
from .single import FastDecoder


class Decoders:
    """One session's runners: ``single`` (batch 1) and ``rows`` (lists), each None until used."""

    def __init__(self):
        self.single: FastDecoder | None = None
        self.rows: BatchedDecoder | None = None  # a ModelRowsDecoder where the fused step does not fit
        self.same: InvariantRowsDecoder | None = None  # deterministic=True requests (built on first use)
        #: seconds per new token of the session's last plain request on the GPU (None: none yet),
        #: what a short first request weighs against the fast path's capture (first_request)
        self.plain_per_token: float | None = None
        self._lock = threading.Lock()

    def decoder(self, model, **overrides) -> FastDecoder:
        """The batch-1 decoder for ``model`` (created on first use). Keywords are ``FastOptions``
        fields (``k_steps=4``, ``attention="matmul"``, ...) or ``StepVariant`` fields (the decode
        benchmark's variants): a decoder built otherwise, or for another model, is replaced by one
        built that way (its captures are paid again)."""
        base = support.base_model(model)
        with self._lock:
            d = self.single
            if d is not None and d.model is not base:
                self._release_all()
                d = None
            wanted = split_overrides(d.options if d is not None else default_options(),
                                     d.variant if d is not None else StepVariant(), overrides)
            if d is not None and (d.options, d.variant) == wanted:
                return d
            if d is not None:
                d.release()  # its graphs and caches go before the new one captures
            self.single = FastDecoder(base, wanted[0], variant=wanted[1])
            return self.single

    def compile_ahead(self) -> None:
        """Start compiling the kernels a first list's prompt prefill and decode steps would
        otherwise compile while it waits (``compile_ahead``), where the lists run the fused step
        with nvkit's kernels. Called once the batch-1 decoder has answered its first request, so
        the compile does not share the host with that request."""
        d = self.single
        if d is not None and d.kernels and d.fused:
            # the rows decode step's kernels too, for the page tables of the session's first pool
            # (``rows.BatchedDecoder._arena_for``), where that step takes the paged attention
            paged = d.options.attention != "matmul" and d.paged_why(d.options.attention) is None
            compile_ahead.start(d.weights()[0], pages_for(min(d.max_positions, FIRST_WIDTH), PAGE) if paged else 0)

    def batched(self, model) -> BatchedDecoder:
        """The rows decoder (created on first use beside the batch-1 decoder whose weights it
        shares; a new batch-1 decoder gets a new one)."""
        return self._lists(model, "rows", lambda d: BatchedDecoder(d) if d.fused else ModelRowsDecoder(d))

    def invariant(self, model) -> InvariantRowsDecoder:
        """The batch-invariant rows decoder (``deterministic=True``), as ``batched``; an NvkitError
        says why where it cannot run."""
        return self._lists(model, "same", InvariantRowsDecoder)

    def _lists(self, model, slot: str, make: Callable):
        """The list decoder in ``slot``: the one there if it was built on the current batch-1
        decoder, else ``make(that decoder)`` (the old one released first)."""
        d = self.decoder(model)
        with self._lock:
            bd = getattr(self, slot)
            if bd is not None and bd.single is d:
                return bd
            setattr(self, slot, None)
            if bd is not None:
                bd.release()
            setattr(self, slot, make(d))
            return getattr(self, slot)

    def batched_ready(self) -> bool:
        """The rows decoder has captured something for the current batch-1 decoder."""
        return self.rows is not None and self.rows.single is self.single and bool(self.rows.counts)

    def swap(self, model, d: FastDecoder | None) -> FastDecoder | None:
        """Make ``d`` the batch-1 decoder and return the one it replaces, without releasing either
        (the decode benchmark keeps several captured side by side to time them in alternation).
        The caller owns the returned decoder: ``release()`` it, or swap it back."""
        if d is not None and d.model is not support.base_model(model):
            raise NvkitError("This decoder was built for another model; nvkit.generate.fast.decoder(session) "
                             "builds one for it.")
        with self._lock:
            old, self.single = self.single, d
            return old

    def release_lists(self) -> int:
        """Release the list decoders (their KV pools and graphs) and the batch-1 decoder's merged
        adapter copy (the rest of it stays) for work that needs the memory more, a fine-tune; the
        next list builds its pool and captures again, the next request with adapters makes its
        copy again. Returns the bytes the allocator got back (0 where nothing was held)."""
        import torch
        with self._lock:
            dev = next((d.device for d in (self.rows, self.same, self.single) if d is not None), None)
            before = torch.cuda.memory_allocated(dev) if dev is not None and dev.type == "cuda" else None
            self._drop_lists()
            if self.single is not None:
                self.single.release_merged()
            return 0 if before is None else max(0, before - torch.cuda.memory_allocated(dev))

    def _drop_lists(self) -> list:
        """Release the list decoders; returns those there were."""
        held = [bd for bd in (self.rows, self.same) if bd is not None]
        self.rows = self.same = None
        for bd in held:
            bd.release()
        return held

    def release(self) -> None:
        """Release both runners (``Session.unload`` calls this before dropping the model)."""
        with self._lock:
            self._release_all()

    def _release_all(self) -> None:
        lists = self._drop_lists()
        d, self.single = self.single, None
        if d is not None:
            d.release()
        if (d is not None and d.compiled) or any(bd.compiled for bd in lists):
            # Dropping the compiled steps can leave the weights referenced by dynamo's and
            # inductor's own state; the model is going away, so clear all of it.
            try:
                import torch._dynamo
                torch._dynamo.reset()
            except Exception:  # noqa: BLE001
                pass


def of(session) -> Decoders:
    """The session's ``Decoders``."""
    return session.decoders


def decoder(session, **overrides) -> FastDecoder:
    """The session's batch-1 decoder (``Decoders.decoder``)."""
    return of(session).decoder(session.model, **overrides)


def batched_decoder(session) -> BatchedDecoder:
    """The session's rows decoder (``Decoders.batched``)."""
    return of(session).batched(session.model)


def invariant_decoder(session) -> InvariantRowsDecoder:
    """The session's batch-invariant rows decoder (``Decoders.invariant``)."""
    return of(session).invariant(session.model)


def start_compile_ahead(session) -> None:
    """``Decoders.compile_ahead`` for the session."""
    of(session).compile_ahead()


def current(session) -> FastDecoder | None:
    """The session's batch-1 decoder, if one was built."""
    return of(session).single


def swap(session, d: FastDecoder | None) -> FastDecoder | None:
    """``Decoders.swap`` for the session's model."""
    return of(session).swap(session.model, d)


def forget(session) -> None:
    """Release the session's runners."""
    of(session).release()


def prepare(session, max_new_tokens: int = 256, prompt_tokens: int = 64, do_sample: bool = False,
            on_progress: Callable[[float], None] | None = None, prefill_up_to: int = 512, compile: bool = True,
            **generation_kwargs) -> float:
    """Compile and capture the session's fast path now (a tutorial's warm-up cell), so that the
    first request does not wait for it; returns the seconds it took (≈ 0 when already done).

    One cache size class serves every request that fits it, so the sizes here only need to be
    no larger than the requests to come; the prefill graphs of prompts up to ``prefill_up_to``
    tokens come too (0: none, each is captured at its class's second prompt). ``compile=False``:
    capture the step a request would run now (compiled only where the session already compiled it).
    Raises NvkitError saying why when the fast path cannot run this session's requests."""
    require(isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens > 0,
            f"max_new_tokens must be a whole number ≥ 1, not {max_new_tokens!r}.")
    require(isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and prompt_tokens > 0,
            f"prompt_tokens must be a whole number ≥ 1, not {prompt_tokens!r}.")
    require(isinstance(compile, bool), f"compile must be True or False, not {compile!r}.")
    gen = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, **generation_kwargs)
    why = support.single_why(session, gen)
    if why:
        raise NvkitError(f"The fast path cannot run here: {why}.")
    sampling, _ = support.resolve(support.base_model(session.model), gen)
    import torch
    with torch.inference_mode():
        return decoder(session).prepare(prompt_tokens, sampling, on_progress=on_progress, prefill_up_to=prefill_up_to,
                                        compile=compile)
