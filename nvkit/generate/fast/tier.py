"""When a decoder's step compiles (``FastOptions.compile_after``), for both decoders: the batch-1
``FastDecoder`` and the ``BatchedDecoder``.

A decoder captures its uncompiled step first (seconds) and counts the seconds it decodes on it;
the compile (many seconds cold, fewer from artifacts on disk) waits until that decoding has shown
the compiled step's speed will pay for it, or until asked for (``compile_next``). Once a step is
compiled, the decoder's later steps (another cache, the adapters' step) compile too.
"""

from __future__ import annotations


class CompileTier:
    """Mixed into a decoder that has ``options``, ``graphs``, ``compiled``, ``compile_error`` and
    ``kernels`` (whether its uncompiled step runs nvkit's Triton kernels)."""

    #: seconds of requests decoded on graphs of the uncompiled step
    uncompiled_seconds: float = 0.0
    _compile_next: bool = False

    @property
    def compile_waiting(self) -> bool:
        """The step runs uncompiled and would compile once due (not compiled yet, not turned off,
        no failed compile)."""
        return bool(self.options.compile and self.graphs and not self.compiled and not self.compile_error)

    def _uncompiled_words(self) -> str:
        """How the uncompiled step runs, for the stats line (``describe``)."""
        how = "uncompiled" if self.options.compile else "eager"
        how += " with nvkit kernels" if self.kernels else ""
        return how + (f" (compiled once it has decoded {self.options.compile_after:g} s)" if self.options.compile else "")

    def compile_due(self) -> bool:
        """Whether the next capture compiles the step: the uncompiled one has decoded
        ``FastOptions.compile_after`` seconds, ``compile_next`` asked for it, or a step was
        compiled already."""
        if not (self.options.compile and self.graphs) or self.compile_error:
            return False
        return self._compile_next or self.compiled or self.uncompiled_seconds >= self.options.compile_after

    def compile_next(self) -> None:
        """Compile the step at the next capture, whatever has been decoded."""
        self._compile_next = True

    def _settle(self, compiling: bool) -> bool:
        """After a capture asked to compile or not: whether it runs the compiled step."""
        compiled = compiling and not self.compile_error
        if compiled:
            self.compiled = True
            self._compile_next = False
        return compiled
