"""Where a decode token's time goes (``nvkit bench MODEL --decode --profile``), at batch 1 or in
a list (``--n-prompts N``).

Batch-1 decode is bound by memory: each token reads every weight once, so the fastest possible
token takes the weights' bytes over the GPU's bandwidth (``families.roofline_share``). What keeps a
decoder from it is visible per token in a profile of one request on the session's fast path:

- kernels per token: each launch has a set-up and a tail in which few weights stream;
- GPU busy time per token: the union of the kernels' intervals (overlapping kernels, as
  programmatic dependent launch lets them, count once);
- the gaps: the token's wall time minus the busy time, the GPU waiting on the host;
- achieved bytes/s and its share of the bandwidth, from the token's wall time: the weights' bytes
  and, at the positions the request decodes, the KV cache's (``families.kv_bytes_read``), so a
  long prompt's profile says what its attention costs;
- the kernels by kind and the most expensive ones by name, per token.

A list's step reads the weights once for all its rows (of a mixture of experts, the experts its
rows run) and each row's KV cache; its profile says the same per step, and what the prompts'
prefill takes apart (the list asked for one new token each, profiled too, and subtracted from the
whole): the two parts a list's rate against padded ``generate`` is made of.

The arithmetic (``summarize``, ``list_summaries``) takes plain (name, start µs, end µs) kernel
records so it is tested on the CPU; ``profile`` and ``profile_list`` record them with torch's
profiler (CUPTI sees the kernels inside CUDA-graph replays) around timed requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import NvkitError

#: seconds of uncompiled decoding or eager prefill after which the profiled list would compile: never
NEVER = 1e9


def kind(name: str) -> str:
    """A kernel's kind by its name: GEMM, nvkit's attention, inductor/Triton fused, SDPA attention,
    copies, other."""
    n = name.lower()
    if "paged_rope_split" in n or "rope_split" in n or "combine_kernel" in n or "split_kernel" in n:
        return "nvkit attention"
    if any(w in n for w in ("gemm", "cutlass", "nvjet", "cublas", "sm90_xmma", "sm80_xmma", "splitk", "gemv")):
        return "GEMM"
    if n.startswith("triton_") or "triton" in n:
        return "inductor/Triton fused"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "SDPA attention"
    if "memcpy" in n or "memset" in n:
        return "copies"
    return "other"


def busy_us(intervals) -> float:
    """The length of the union of (start, end) intervals, in their unit."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


@dataclass
class Summary:
    """One profiled request, per token."""
    tokens: int
    wall_us: float            # the request's decode wall time per token
    kernels: float            # launches per token
    busy_us: float            # GPU busy time per token (the kernels' union)
    bytes_per_token: int      # the weights' bytes a token reads
    bandwidth: float | None   # bytes/s (None: unknown)
    by_kind: dict = field(default_factory=dict)  # kind -> (µs per token, launches per token)
    detail: str = ""          # how the fast path ran (its stats line's words)
    kv_bytes_per_token: int = 0  # the KV cache's bytes a token reads, on average over the request
    by_name: dict = field(default_factory=dict)  # kernel name -> (µs per token, launches per token)
    unit: str = "token"       # what one "token" of the figures is (a list's decode: a step of every row)

    @property
    def gap_share(self) -> float:
        """The share of the token's wall time the GPU ran no kernel."""
        return max(0.0, 1 - self.busy_us / self.wall_us) if self.wall_us > 0 else 0.0

    @property
    def achieved(self) -> float:
        """Weight and KV bytes read per second over the token's wall time."""
        read = self.bytes_per_token + self.kv_bytes_per_token
        return read / (self.wall_us * 1e-6) if self.wall_us > 0 else 0.0

    @property
    def roofline(self) -> float | None:
        return self.achieved / self.bandwidth if self.bandwidth else None

    def text(self) -> str:
        share = f"{self.roofline:.0%} of the HBM roofline" if self.roofline is not None else "roofline unknown"
        read = ""
        if self.bytes_per_token or self.kv_bytes_per_token:
            read = (f", {self.achieved / 1e9:,.0f} GB/s read ({share}; {self.bytes_per_token / 2 ** 20:,.0f} MiB of "
                    "weights" + (f" + {self.kv_bytes_per_token / 2 ** 20:,.1f} MiB of KV cache"
                                 if self.kv_bytes_per_token else "") + f" per {self.unit.split()[0]})")
        lines = [f"fast path: {self.detail}"] if self.detail else []
        count = f" ({self.tokens} {self.unit.split()[0]}s)" if self.tokens > 1 else ""
        lines += [f"per {self.unit}{count}: {self.wall_us:.1f} µs wall, {self.kernels:.0f} kernels, "
                  f"GPU busy {self.busy_us:.1f} µs ({self.gap_share:.0%} idle){read}", "by kind:"]
        for k, (us, n) in sorted(self.by_kind.items(), key=lambda kv: -kv[1][0]):
            lines.append(f"    {k:24s} {us:9.1f} µs  {n:6.1f} launches")
        if self.by_name:
            lines.append(f"the {len(self.by_name)} kernels that take longest:")
            for k, (us, n) in sorted(self.by_name.items(), key=lambda kv: -kv[1][0]):
                lines.append(f"    {us:9.1f} µs  {n:6.1f} launches  {k[:NAME_CHARS]}")
        return "\n".join(lines)


#: kernels listed by name in a summary, and the characters of each name shown
TOP_KERNELS, NAME_CHARS = 12, 90


def _totals(kernels) -> tuple[int, float, dict, dict]:
    """(launches, busy µs, kind -> [µs, launches], name -> [µs, launches]) of kernel records."""
    kernels = list(kernels)
    by_kind: dict = {}
    by_name: dict = {}
    for name, s, e in kernels:
        for key, into in ((kind(name), by_kind), (name, by_name)):
            k = into.setdefault(key, [0.0, 0])
            k[0] += e - s
            k[1] += 1
    return len(kernels), busy_us((s, e) for _, s, e in kernels), by_kind, by_name


def _summary(totals, tokens: int, wall_s: float, bytes_per_token: int, bandwidth: float | None,
             kv_bytes_per_token: int, unit: str) -> Summary:
    if tokens < 1 or wall_s <= 0:
        raise NvkitError(f"A profile needs at least one token and a positive time (got {tokens} tokens "
                         f"in {wall_s} s).")
    launches, busy, by_kind, by_name = totals
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
    return Summary(tokens=tokens, wall_us=wall_s * 1e6 / tokens, kernels=launches / tokens, busy_us=busy / tokens,
                   bytes_per_token=bytes_per_token, bandwidth=bandwidth,
                   by_kind={k: (us / tokens, n / tokens) for k, (us, n) in by_kind.items()},
                   kv_bytes_per_token=kv_bytes_per_token, by_name={k: (us / tokens, n / tokens) for k, (us, n) in top},
                   unit=unit)


def summarize(kernels, tokens: int, wall_s: float, bytes_per_token: int, bandwidth: float | None,
              kv_bytes_per_token: int = 0, unit: str = "token") -> Summary:
    """``kernels``: (name, start µs, end µs) of every kernel the request ran; ``wall_s``: the decode
    time of its ``tokens`` tokens; the bytes a token reads: the weights' and, on average, the KV
    cache's. ``unit``: what a token is, in the summary's words (a list's step: "step of 32 rows")."""
    return _summary(_totals(kernels), tokens, wall_s, bytes_per_token, bandwidth, kv_bytes_per_token, unit)


def mean_kv_bytes(config, itemsize: int, prompt_tokens: int, new_tokens: int) -> int:
    """The KV bytes a decode token of a request reads, on average over its decode steps (after
    the first token, which the prefill gives): the step at position p reads positions 0..p."""
    from .families import kv_bytes_read
    steps = range(prompt_tokens, prompt_tokens + max(1, new_tokens - 1))
    return sum(kv_bytes_read(config, itemsize, p) for p in steps) // len(steps)


def _kernel_records(prof) -> list[tuple[str, float, float]]:
    from torch.autograd import DeviceType
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return out


def _profiled(s, request):
    """``request()`` run under torch's profiler of CUDA kernels: (kernel records, wall seconds)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        request()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    return _kernel_records(prof), wall


def _split(records, first_token_s: float):
    """The records before and from the request's first token (its time counted from its first kernel)."""
    first = min((s0 for _, s0, _ in records), default=0.0)
    cut = first + first_token_s * 1e6
    return [r for r in records if r[1] < cut], [r for r in records if r[1] >= cut]


def _load(model: str, path: str, **overrides):
    """The session a profile runs on, the fast path's variant built (``path``; "fast": the default),
    with the ``FastOptions`` fields ``overrides`` sets."""
    import torch
    from ..model.session import load
    from .decode import fast_options, path_decoder
    opts = fast_options(path)
    if opts is None:
        raise NvkitError(f"A profile runs a fast path ('fast' or 'fast+OPT...'), not {path!r}.")
    if not torch.cuda.is_available():
        raise NvkitError("--profile times CUDA kernels: it needs a GPU (this machine has no CUDA).")
    s = load(model, device_map="cuda", dtype="bfloat16")
    if path != "fast":
        path_decoder(s, dict(opts, **overrides))
    elif overrides:
        from ..generate.fast import decoders
        decoders.decoder(s, **overrides)
    return s


def profile(model: str, *, new_tokens: int = 256, prompt_len: int | None = None, path: str = "fast",
            prompt: str = "The history of the graphics processor began with"):
    """Profile one batch-1 request of ``new_tokens`` on the session's fast path after it is prepared
    (compiled and captured, as a session runs after ``fast.prepare``); returns the ``Summary``.
    ``prompt_len``: a prompt of that many tokens instead of ``prompt`` (a long one shows what
    attention over a long cache costs). ``path``: a variant of the decode benchmark's (e.g.
    "fast+eager+gemv"), profiled as that benchmark builds it; "fast" is the session's default."""
    from ..generate import fast
    from .families import bandwidth, bytes_per_token
    s = _load(model, path)
    try:
        if prompt_len is not None:
            from .decode import corpus_prompt
            prompt = corpus_prompt(s.tokenizer, prompt_len)
        n_prompt = len(s.tokenizer(prompt)["input_ids"])
        fast.prepare(s, max_new_tokens=new_tokens, prompt_tokens=n_prompt)
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, fast=True)
        s.generate(prompt, **kw)
        records, wall = _profiled(s, lambda: s.generate(prompt, **kw))
        st = s.last_stats
        if st.path != "fast" or st.new_tokens != new_tokens:
            raise NvkitError(f"The profiled request did not run {new_tokens} tokens on the fast path: {st}")
        # the prompt's prefill and the first token are left out: the kernels from the first token on
        _, decode = _split(records, st.time_to_first_token or 0.0)
        decode_s = wall - (st.time_to_first_token or 0.0)
        itemsize = s.model.get_input_embeddings().weight.element_size()
        summary = summarize(decode, max(1, new_tokens - 1), decode_s, bytes_per_token(s.model), bandwidth(s.device),
                            mean_kv_bytes(s.model.config, itemsize, n_prompt, new_tokens))
        summary.detail = st.detail
        return summary
    finally:
        s.unload()


@dataclass
class ListProfile:
    """One profiled list: its prompts' prefill (the same list asked for one new token each) and its
    decode per step of every row (the whole list less that)."""
    rows: int
    prefill: Summary
    decode: Summary

    def text(self) -> str:
        return "\n".join([f"a list of {self.rows} prompts; its prefill (the list with one new token each):",
                          self.prefill.text(), "its decode (the whole list less the prefill):", self.decode.text()])


def list_summaries(whole, whole_s: float, first, first_s: float, rows: int, steps: int, bytes_per_step: int,
                   kv_bytes_per_step: int, bandwidth: float | None) -> ListProfile:
    """A list's profile from the kernel records and wall time of the whole list (``whole``,
    ``whole_s``) and of the same list with one new token each (``first``, ``first_s``: its prefill):
    the prefill as one unit, and the ``steps`` decode steps (the whole less the prefill) per step
    (every row's token: the weights read once, each row's KV cache)."""
    if not 0 < first_s < whole_s or steps < 1:
        raise NvkitError(f"A list's prefill takes part of its time, and it decodes at least one step (got "
                         f"{first_s} s of {whole_s} s, {steps} steps).")
    w_launch, w_busy, w_kind, w_name = _totals(whole)
    f_launch, f_busy, f_kind, f_name = _totals(first)

    def less(a: dict, b: dict) -> dict:
        out = {k: [us - b.get(k, (0.0, 0))[0], n - b.get(k, (0.0, 0))[1]] for k, (us, n) in a.items()}
        return {k: v for k, v in out.items() if v[1] > 0 or v[0] > 0}
    decode = (w_launch - f_launch, w_busy - f_busy, less(w_kind, f_kind), less(w_name, f_name))
    return ListProfile(rows=rows,
                       prefill=_summary((f_launch, f_busy, f_kind, f_name), 1, first_s, 0, None, 0,
                                        unit="prefill of every prompt"),
                       decode=_summary(decode, steps, whole_s - first_s, bytes_per_step, bandwidth,
                                       kv_bytes_per_step, unit=f"step of {rows} rows"))


def profile_list(model: str, *, prompts: int = 32, new_tokens: int = 128, path: str = "fast") -> ListProfile:
    """Profile a list of ``prompts`` prompts of 16–512 tokens (the families benchmark's list) with
    ``new_tokens`` each on the fast path, and the same list with one new token each (its prefill);
    each run once before (their captures are the session's first list's cost, not its rate).
    Returns the ``ListProfile``: where a list's time goes beside the bandwidth its steps could
    use, and what the prompts' prefill takes."""
    from ..generate.fast import decoders
    from .decode import mixed_prompts
    from .families import bandwidth, bytes_per_token
    if type(prompts) is not int or prompts < 2 or type(new_tokens) is not int or new_tokens < 2:
        raise NvkitError(f"A list profile takes at least 2 prompts and 2 new tokens each (got {prompts!r} and "
                         f"{new_tokens!r}).")
    # the session as the families bench's list meets it, its steps and prefill uncompiled (a
    # compiling variant still compiles at its first, unprofiled call): a compile that came due inside
    # a profiled run (the profiler slows the host, so the eager prefill's seconds count up faster)
    # would be timed as the list's prefill or its steps
    s = _load(model, path, compile_after=NEVER, prefill_after=NEVER)
    try:
        texts = mixed_prompts(s.tokenizer, prompts, seed=0)
        runs, replays = {}, {}
        for n in (new_tokens, 1):
            kw = dict(max_new_tokens=n, min_new_tokens=n, fast=True)
            s.generate(texts, **kw)
            runs[n] = _profiled(s, lambda: s.generate(texts, **kw))
            st = s.last_stats
            if st.path != "fast batch" or st.new_tokens != prompts * n:
                raise NvkitError(f"The profiled list did not run {prompts} × {n} tokens on the fast path: {st}")
            if n == new_tokens:
                detail = st.detail
            rows = decoders.batched_decoder(s)
            replays[n] = sum(rows.last_batches.values()) * rows.k
        # the steps the whole list ran beyond the one-token list (a replay runs its K steps whole,
        # the one-token list's one replay too): what the difference of the two is made of
        steps = max(1, replays[new_tokens] - replays[1])
        itemsize = s.model.get_input_embeddings().weight.element_size()
        lengths = [len(ids) for ids in s.tokenizer(texts)["input_ids"]]
        kv = sum(mean_kv_bytes(s.model.config, itemsize, n, new_tokens) for n in lengths)
        out = list_summaries(*runs[new_tokens], *runs[1], prompts, steps,
                             bytes_per_token(s.model, rows=prompts), kv, bandwidth(s.device))
        out.decode.detail = detail
        return out
    finally:
        s.unload()
