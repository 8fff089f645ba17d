"""``GraphRunner``: what the batch-1 decoder (``single.FastDecoder``) and the rows decoder
(``rows.BatchedDecoder``) have in common — the contract a session's fast path is run
through, and the one copy of what both do around a capture.

The contract: ``describe()`` (how it runs, for the stats line), ``release()`` (graphs, caches and
compiled steps back to the allocator), ``compile_next()``, and the state a session reads
(``counts``, ``timings``, ``capture_seconds``, ``compiled``, ``compile_error``). Shared here:

- the attention choice's checks (``kernel_why``: can nvkit's Triton attention run for this model);
- the capture's fall-back ladder (``capture_or_fall_back``): a step whose nvkit kernels fail here
  is captured again on torch's operations; under ``attention="auto"`` a Triton attention step that
  fails gives way to "matmul"; a compile that fails gives way to the uncompiled step;
- the compile policy (``compile_policy``: when to compile, and keeping the faster of the compiled
  and the uncompiled step, measured on the runner's own graphs);
- the compile artifacts' key on disk (``disk_key``).

``graphs=False`` runs a runner's step code without CUDA graphs or compile, for checking its logic
on a CPU; it is not a fast path.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

from ... import events
from ...errors import NvkitError, error_summary
from ...memory.estimate import attention_dims
from . import artifacts, cuda_graphs as graphs_mod
from .compile_policy import CompilePolicy, Verdict, time_replays
from .fused_fit import qk_norm_why
from .options import FastOptions


@dataclass(frozen=True)
class StepVariant:
    """How a runner compiles its step. Users get the defaults; the decode benchmark builds the
    others to compare (``nvkit bench --decode --paths "fast+whole,fast+nopdl,..."``).

    - ``regional``: compile one decoder layer (and the head) and call it for every layer, instead
      of the whole unrolled step: the compile is about as many times shorter as the model has
      layers, and on the GPU it decodes at least as fast (docs/benchmarks.md).
    - ``tune``: inductor's coordinate-descent tuning, which turns the batch-1 matrix-vector
      products into reductions tuned to the memory bandwidth and fused with their neighbours.
    - ``pdl``: Programmatic Dependent Launch between inductor's kernels, so each kernel's launch
      overlaps the tail of the one before it (None: where this torch can emit it).
    - ``inductor``: further ``torch._inductor.config`` settings, as (name, value) pairs.
    - ``gemv``: the uncompiled batch-1 step's layers in six kernels (``gemv_step``), where they run
      (on the GPU they decoded faster than the nine-kernel layers on every shape timed:
      docs/benchmarks.md); False keeps the nine, for the decode benchmark's "+nogemv".
    - ``experts``: a mixture of experts' uncompiled steps over its own forward (batch 1 and rows)
      with its experts on nvkit's grouped kernel (``experts.GROUPED``: each picked expert read in
      place, once a step) instead of transformers' "batched_mm" copies and the dense rows; the
      decode benchmark's "+experts".
    - ``lora_merged``: the batch-1 fused step's adapters merged into a copy of the projections
      they change (``lora.MergedWeights``), where the copy fits beside the GPU's free memory; False
      keeps their products apart, the decode benchmark's "+apart"."""
    regional: bool = True
    tune: bool = True
    pdl: bool | None = None
    inductor: tuple = ()
    gemv: bool = True
    experts: bool = False
    lora_merged: bool = True

    def __post_init__(self):
        for name in ("regional", "tune", "gemv", "experts", "lora_merged"):
            if not isinstance(getattr(self, name), bool):
                raise NvkitError(f"{name} must be True or False, not {getattr(self, name)!r}.")
        if self.pdl not in (None, True, False):
            raise NvkitError(f"pdl must be True, False or None (where it fits), not {self.pdl!r}.")
        inductor = self.inductor
        if isinstance(inductor, Mapping):
            inductor = tuple(sorted(inductor.items()))
        if not isinstance(inductor, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in inductor):
            raise NvkitError(f"inductor must be a dict of torch._inductor.config settings, not {self.inductor!r}.")
        object.__setattr__(self, "inductor", inductor)

    def replace(self, **changes) -> "StepVariant":
        """A copy with ``changes`` (None values are left out: "keep what it is")."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


VARIANT_FIELDS = frozenset(f.name for f in dataclasses.fields(StepVariant))


def split_overrides(options: FastOptions, variant: StepVariant, overrides: dict) -> tuple[FastOptions, StepVariant]:
    """``FastOptions`` and ``StepVariant`` with the keyword overrides a runner was built with."""
    return (options.replace(**{k: v for k, v in overrides.items() if k not in VARIANT_FIELDS}),
            variant.replace(**{k: v for k, v in overrides.items() if k in VARIANT_FIELDS}))


def triton_cannot_run_on(device) -> str | None:
    """Why nvkit's Triton attention kernels cannot run on ``device`` (None: they can). "auto" asks
    this first; a kernel asked for by name is built anyway (Triton's interpreter runs it on a CPU
    in the tests)."""
    if device.type != "cuda":
        return f"nvkit's Triton attention kernels run on CUDA GPUs; this model is on {device.type}"
    return None


def batch1_attention(runner: "GraphRunner", fused: bool, fused_why: str | None, asked: str,
                     device_why: str | None) -> tuple[str, str | None]:
    """The batch-1 decoder's attention and why "auto" did not take triton-fused: "auto" is
    triton-fused where it fits (``device_why`` None: a CUDA GPU, ``triton_cannot_run_on``; the
    fused step, a power-of-two head size, per-head RMS q/k norms or none), matmul elsewhere; a
    Triton kind asked for by name that cannot run raises."""
    def triton_why(kind: str) -> str | None:
        if not fused:
            return (f"attention={kind!r} belongs to the fused decode step, which does not fit this model"
                    f"{': ' + fused_why if fused_why else ' (fused=False)'}")
        why = runner.kernel_why(kind, qk_norms=False)
        if why is None and kind == "triton-fused":
            why = runner.kernel_why(kind, qk_norms=True)
            return f"{why}. attention='triton-split' does" if why else None
        return why
    if asked == "auto":
        why = device_why or triton_why("triton-fused")
        return ("matmul", why) if why else ("triton-fused", None)
    why = triton_why(asked) if asked.startswith("triton") else None
    if why:
        raise NvkitError(f"{why}.")
    return asked, None


class GraphRunner:
    """The state and the shared steps of a fast-path runner (see the module docstring).
    Subclasses set ``label`` ("fast decode", "fast batch") and implement ``describe``,
    ``release``, ``_forget_kernel_steps`` and ``_forget_attention_steps``."""

    label = "fast path"

    def __init__(self, model, options: FastOptions, variant: StepVariant, graphs: bool, device, kernels: bool):
        self.model = model
        self.options = options
        self.variant = variant
        self.graphs = graphs
        self.device = device
        self.pdl = choose_pdl(variant.pdl)
        #: the uncompiled step runs its norms, activation and adapter products in nvkit's Triton kernels
        self.kernels = kernels
        text = model.config.get_text_config()
        self.vocab = int(text.vocab_size)
        self.max_positions = int(getattr(text, "max_position_embeddings", 0) or 1 << 20)
        self.policy = CompilePolicy(options)
        #: expensive captures (a step compiled, or captured eagerly), cheap ones (another sampling
        #: mode or batch class on a captured step) and prefill graphs, counted for the benchmarks
        self.counts = collections.Counter()
        self.capture_seconds: dict[tuple, float] = {}
        #: where the preparation's seconds went (artifacts, compile, capture, prefill graphs)
        self.timings = graphs_mod.Timings()
        self.attention = "matmul"
        self.attention_why: str | None = None
        self._lock = threading.Lock()
        self._restored: dict[str, bool] = {}  # artifacts digest -> whether they were on disk (looked up once)

    # --- the contract ----------------------------------------------------------------------------
    @property
    def k(self) -> int:
        return self.options.k_steps

    @property
    def compiled(self) -> bool:
        """A compiled step runs (compiled, and measured faster than the uncompiled one)."""
        return self.policy.compiled

    @property
    def compile_error(self) -> str | None:
        return self.policy.error

    @property
    def compile_detail(self) -> str | None:
        return self.policy.detail

    @property
    def uncompiled_seconds(self) -> float:
        return self.policy.uncompiled_seconds

    @uncompiled_seconds.setter
    def uncompiled_seconds(self, value: float) -> None:
        self.policy.uncompiled_seconds = value

    @property
    def compile_waiting(self) -> bool:
        """The step runs uncompiled and would compile once due."""
        return self.policy.waiting(self.graphs)

    def compile_due(self, lora_on: bool = False) -> bool:
        return self.policy.due(self.graphs, lora_on)

    def compile_next(self) -> None:
        """Compile the step at the next capture, whatever has been decoded."""
        self.policy.compile_next()

    def describe(self) -> str:  # pragma: no cover - each runner says it
        raise NotImplementedError

    def release(self) -> None:  # pragma: no cover
        raise NotImplementedError

    # --- shared steps ----------------------------------------------------------------------------
    def _how(self, regional: bool, kind=None, tokens_per_replay: int | None = None) -> str:
        """How the step runs ("compiled by layer (measured …)", "uncompiled with nvkit kernels …");
        ``kind``: the measured kind to say it for (``CompilePolicy.words``)."""
        if not self.graphs:
            return "eager, no CUDA graphs"
        how = "uncompiled" if self.options.compile else "eager"
        how += " with nvkit kernels" if self.kernels else ""
        return self.policy.words(how, regional, tokens_per_replay or self.k, kind)

    def kernel_why(self, kind: str, qk_norms: bool) -> str | None:
        """Why nvkit's Triton attention ``kind`` cannot run for this model (None: it can):
        the triton package, a power-of-two head size, and with ``qk_norms`` (the kernels that
        apply RoPE and the q/k norms themselves) per-head RMS q/k norms or none."""
        try:
            from ..kernels import decode_attention  # noqa: F401 - imports triton
        except ImportError as e:
            return f"attention={kind!r} needs the triton package ({e}); PyTorch's CUDA builds bring it"
        hd = attention_dims(self.model.config)[2]
        if hd & (hd - 1):
            return f"attention={kind!r} needs a power-of-two head_dim; this model's is {hd}"
        why = qk_norm_why(self.model, hd) if qk_norms else None
        return f"attention={kind!r} does not fit this model: {why}" if why else None

    def paged_why(self, asked: str) -> str | None:
        """Why the rows step of this model would not take the paged kernel for the attention
        ``asked`` (not "matmul", which never does): None where it would."""
        device_why = triton_cannot_run_on(self.device) if asked == "auto" else None
        return device_why or self.kernel_why("paged", qk_norms=True)

    def _forget_kernel_steps(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def _forget_attention_steps(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def capture_or_fall_back(self, capture: Callable[[bool], object], compiling: bool,
                             clean: Callable[[], None] = lambda: None):
        """``capture(compiling)``, falling back as the module docstring says until one capture
        holds; ``clean`` puts the buffers back after a failed warm-up. Returns (graph, compiled)."""
        while True:
            try:
                return capture(compiling), compiling
            except Exception as e:  # noqa: BLE001 - compile problems fall back, as said above
                kernels = not compiling and self.kernels
                retry_matmul = self.options.attention == "auto" and self.attention != "matmul"
                if not (kernels or retry_matmul or compiling):
                    raise
                if self.device.type == "cuda":
                    import torch
                    torch.cuda.synchronize(self.device)  # what the failed warm-up queued ends before the retry
                clean()
                if kernels:
                    self.kernels = False
                    self._forget_kernel_steps()
                    events.record("compile", f"{self.label}: nvkit's kernels failed here ({error_summary(e)}); "
                                             "the step runs torch's operations")
                elif retry_matmul:
                    self.attention_why = (f"attention={self.attention!r} failed on this GPU ({error_summary(e)}); "
                                          "nvkit uses 'matmul' here")
                    events.record("compile", f"{self.label}: {self.attention_why}")
                    self.attention = "matmul"
                    self._forget_attention_steps()
                else:
                    self.policy.failed(error_summary(e), str(e))
                    events.record("compile", f"{self.label}: torch.compile failed ({self.compile_error}); "
                                             "capturing the eager step")
                    compiling = False

    def measure(self, compiled: Callable[[], None], uncompiled: Callable[[], None], reset: Callable[[], None],
                replays: int | None = None) -> Verdict | None:
        """The compiled against the uncompiled graph of one shape, replayed in alternation on the
        same buffers (``compile_policy``); None when the policy does not measure."""
        if not self.policy.measure:
            return None
        import torch
        kw = {} if replays is None else {"replays": max(1, replays)}
        with self.timings.part("measure"):
            t = time_replays({"compiled": compiled, "uncompiled": uncompiled}, reset,
                             lambda: torch.cuda.synchronize(self.device), **kw)
        return Verdict(uncompiled=t["uncompiled"], compiled=t["compiled"])

    def keep_faster(self, graph, uncompiled: Callable[[], None] | None, capture_uncompiled: Callable[[], Callable],
                    reset: Callable[[], None], kind, tokens_per_replay: int, where: str, replays: int | None = None):
        """The compiled ``graph`` against the uncompiled graph of the same shape (``uncompiled``'s
        replay, or one ``capture_uncompiled`` returns when there is none yet), replayed in turn on
        the same buffers; the policy keeps the faster for ``kind``. Returns (verdict, the graph
        kept, whether it is the compiled one)."""
        if uncompiled is None:
            uncompiled = capture_uncompiled()
        verdict = self.measure(graph.replay, uncompiled, reset, replays=replays)
        if self.policy.decide(kind, verdict):
            return verdict, graph, True
        events.record("compile", f"{self.label}: the compiled step is slower {where} "
                                 f"({verdict.words(tokens_per_replay)}); the uncompiled step runs there")
        return verdict, KeptReplay(uncompiled), False

    def inductor_options(self, compiling: bool, tune: bool | None = None):
        """inductor settings around a capture that compiles: coordinate-descent tuning, PDL,
        ``variant.inductor`` (a context manager; nothing when not ``compiling``)."""
        v = self.variant
        tune = v.tune if tune is None else tune
        if not compiling or not (tune or self.pdl or v.inductor):
            return contextlib.nullcontext()
        import torch._inductor.config as inductor_config
        patch = {"coordinate_descent_tuning": True} if tune else {}
        if self.pdl:
            patch["triton.enable_pdl"] = True
        patch.update(dict(v.inductor))
        return inductor_config.patch(patch)

    def disk_key(self, lora, **extra) -> str | None:
        """The compile artifacts' key of a step on disk (None: not kept on disk). ``lora``: the
        adapter buffers the step runs (None: none); ``extra``: what else shapes the compile."""
        opts = self.options
        if not (opts.disk_cache and opts.compile):
            return None
        return artifacts.key(self.model, dict(k=self.k, attention=self.attention, pdl=self.pdl, tune=self.variant.tune,
                                              inductor=self.variant.inductor,
                                              lora=(lora.rank, str(lora.dtype)) if lora is not None else None,
                                              **extra), self.device)


    def restore_artifacts(self, digest: str | None) -> bool:
        """The compile artifacts of ``digest`` loaded from disk, once per runner; whether they were there."""
        if digest is None:
            return False
        if digest not in self._restored:
            with self.timings.part("compile artifacts from disk"):
                self._restored[digest] = artifacts.restore(digest)
        return self._restored[digest]

    def store_artifacts(self, digest: str | None) -> None:
        """The compile artifacts of ``digest`` written to disk (nothing when not kept there)."""
        if digest is not None:
            with self.timings.part("compile artifacts to disk"):
                artifacts.store(digest)

    def record_ready(self, what: str, seconds: float, compiled: bool, restored: bool, verdict: Verdict | None,
              tokens_per_replay: int, before: dict) -> None:
        """The event that says a capture is done: for what, how long, which step, from where."""
        events.record("compile", f"{self.label} ready for {what} in {seconds:.1f} s "
                                 f"({'compiled' if compiled else 'uncompiled'} step"
                                 f"{', compile artifacts from disk' if restored else ''}"
                                 f"{', ' + verdict.words(tokens_per_replay) if verdict else ''}, "
                                 f"{self.k} steps per replay; {self.timings.since(before).describe()})")

def choose_pdl(asked: bool | None) -> bool:
    """PDL where this torch's inductor can emit it (it checks the GPU itself), unless turned off."""
    import torch._inductor.config as inductor_config
    can = hasattr(inductor_config.triton, "enable_pdl")
    if asked and not can:
        import torch
        raise NvkitError(f"pdl=True needs a torch whose inductor can emit Programmatic Dependent Launch "
                         f"(torch._inductor.config.triton.enable_pdl); torch {torch.__version__} has none. "
                         "Use pdl=False.")
    return can if asked is None else bool(asked)


class KeptReplay:
    """A kept replay function where a graph object is expected (``graph.replay``)."""

    def __init__(self, replay):
        self.replay = replay


def has_inductor_option(config, dotted: str) -> bool:
    obj = config
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True
