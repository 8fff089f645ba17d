"""Every model family a user may load, as nvkit's default session runs it (``nvkit bench --families``).

For each shape (random weights of a real model's published config, ``nvkit.demo.shaped``), in one
process one after the other: which path one prompt and a list take (the stats line's words, so a
plain fallback shows with its reason), the batch-1 decode rate against plain ``generate``, that
rate's share of the HBM roofline, and a list's rate against padded plain ``generate``.

The roofline: at batch 1 every new token reads the weights once, so the fastest possible decode
is the GPU's memory bandwidth over the bytes read per token. Those are the weights' bytes, with a
mixture of experts counting only the experts a token runs (``num_experts_per_tok`` of
``num_experts``); the KV cache of a short prompt is left out (small beside the weights). The bandwidth is the
GPU's nominal figure where nvkit knows the GPU, else what NVML's memory clock and bus width give.

Each timed request is checked: it produced the tokens it claims (``min_new_tokens`` holds every
prompt to its full length), and a row says so in ``ok``.

Each row names the host's CPU (``host_cpu``): plain ``generate`` is bound by the host issuing its
kernels, so its rates, and every "× plain" column, follow the CPU as much as the GPU, where the fast
path's replayed graphs do not. Rows from two machines compare on their tok/s, not on their ratios.
"""

from __future__ import annotations

import time

from ..checks import whole_number
from ..errors import NvkitError

#: the families issue 37 measures, and the Llama/Qwen3 shapes the fast path was built on
FAMILIES = ("llama-3.2-1b", "qwen3-0.6b", "gemma-3-1b", "gemma-3-4b", "phi-4-mini", "smollm3-3b", "olmo-2-1b",
            "olmoe-1b-7b")

#: nominal HBM bandwidth (bytes/s) by the name NVML gives; NVML's clock and bus width are a
#: fallback that some HBM parts under-report
NOMINAL_BANDWIDTH = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA H100 PCIe": 2.0e12,
    "NVIDIA A100-SXM4-80GB": 2.039e12,
    "NVIDIA A100-SXM4-40GB": 1.555e12,
    "NVIDIA A100 80GB PCIe": 1.935e12,
    "NVIDIA B200": 8.0e12,
}

PROMPT = "The history of the graphics processor began with"


def host_cpu() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; else what ``platform`` says; "" where neither knows)."""
    import platform
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or ""


def bandwidth(device) -> float | None:
    """The GPU's memory bandwidth in bytes/s (None on a CPU or where NVML cannot say)."""
    import torch
    if getattr(device, "type", str(device)) != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if name in NOMINAL_BANDWIDTH:
        return NOMINAL_BANDWIDTH[name]
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.device(device).index or 0)
        clock_hz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) * 1e6
        bus_bytes = pynvml.nvmlDeviceGetMemoryBusWidth(h) / 8
        return 2 * clock_hz * bus_bytes  # double data rate
    except Exception:  # noqa: BLE001 - no NVML, or a GPU it does not describe: no roofline column
        return None


def bytes_per_token(model, rows: int = 1) -> int:
    """The weight bytes one decode step of ``rows`` rows reads: all of them, but of a mixture of
    experts only the experts its rows run, and of an input embedding that is not also the LM head
    only the rows' own (a tied one is read whole by the head, and counted once). One row runs
    ``top_k`` of ``experts``; ``rows`` rows routed independently and uniformly are expected to run
    the share ``1 - (1 - top_k / experts) ** rows`` of them (and a step that runs every expert on
    every row, ``dense_experts``, reads them all: at a list's row counts the two are close)."""
    cfg = model.config.get_text_config()
    from ..generate.fast.experts import expert_count
    experts = expert_count(cfg)
    active = int(getattr(cfg, "num_experts_per_tok", 0) or 0)
    run = 1 - (1 - active / experts) ** rows if experts and active else 1.0
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    total = 0
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        if experts and active and ".experts." in f".{name}.":
            size = size * active // experts if rows == 1 else round(size * run)
        elif p is embed and not tied:
            size = min(rows, p.shape[0]) * p.shape[-1] * p.element_size()
        total += size
    return total


def kv_bytes_read(config, itemsize: int, position: int) -> int:
    """The KV-cache bytes a batch-1 decode step at ``position`` reads (attention over the positions
    0..position): keys and values of each of them in every layer, a sliding layer's window at most."""
    from ..generate.fast.fused_fit import layer_kinds
    from ..memory.estimate import attention_dims
    cfg = config.get_text_config()
    _, kv_heads, head_dim = attention_dims(config)
    seen = position + 1
    window = getattr(cfg, "sliding_window", None) or seen
    per_position = kv_heads * head_dim * 2 * itemsize
    return sum(per_position * (min(seen, window) if kind == "sliding_attention" else seen)
               for kind in layer_kinds(cfg))


def roofline_share(bytes_read: int, seconds_per_token: float, bytes_per_second: float | None) -> float | None:
    """The achieved read rate over the bandwidth (None without a bandwidth or a time)."""
    if not bytes_per_second or not seconds_per_token or seconds_per_token <= 0:
        return None
    return bytes_read / seconds_per_token / bytes_per_second


def _decode_rate(stats) -> float | None:
    """Tokens after the first over the time after it (the stats' own figures)."""
    if stats.time_to_first_token is None or stats.new_tokens < 2 or stats.seconds <= stats.time_to_first_token:
        return None
    return (stats.new_tokens - 1) / (stats.seconds - stats.time_to_first_token)


def _timed(s, prompt, *, n: int, fast):
    """The request run once untimed (a capture it pays is the session's first-request cost, not
    its rate), then timed; returns (stats, wall seconds, whether it produced the tokens it claims)."""
    kw = dict(max_new_tokens=n, min_new_tokens=n, fast=fast)
    s.generate(prompt, **kw)
    t = time.perf_counter()
    out = s.generate(prompt, **kw)
    wall = time.perf_counter() - t
    st = s.last_stats
    rows = len(prompt) if isinstance(prompt, list) else 1
    healthy = st.new_tokens == rows * n and (len(out) == rows if isinstance(out, list) else isinstance(out, str))
    return st, wall, healthy


def run_family(model: str, *, new_tokens: int = 200, n_prompts: int = 32, list_tokens: int = 128,
               plain_tokens: int | None = None, on_step=None, settle: bool = False) -> dict:
    """One family's row (``model``: a shape name from ``nvkit.demo.SHAPES`` or a model folder).
    ``on_step(text)`` hears each step as it starts, with the seconds since the family's start: a 4B
    shape's first build and plain ``generate``'s lists take minutes, and a silent bench cannot be
    told from a stuck one. ``settle``: the same requests again once the session has settled
    (``_settled``), in the row's ``*_settled_*`` columns."""
    from ..model.session import load
    from ..demo import SHAPES
    from .decode import mixed_prompts
    from .shapes import shape_folder
    start = time.perf_counter()

    def step(text):
        if on_step is not None:
            on_step(f"{model}: {text} ({time.perf_counter() - start:.0f} s)")

    if model.lower() in SHAPES:
        step("building or finding its random checkpoint")
        path = shape_folder(model)
    else:
        path = model
    cuda = _cuda()
    step("loading")
    s = load(path, device_map="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32")
    try:
        step(f"one prompt × {new_tokens} tokens, nvkit's default")
        one, one_wall, ok_one = _timed(s, PROMPT, n=new_tokens, fast=None)
        n_plain = plain_tokens or min(new_tokens, 64)
        step(f"one prompt × {n_plain} tokens, plain generate")
        plain, plain_wall, ok_plain = _timed(s, PROMPT, n=n_plain, fast=False)
        prompts = mixed_prompts(s.tokenizer, n_prompts, seed=0)
        step(f"{n_prompts} prompts × {list_tokens} tokens, nvkit's default")
        many, many_wall, ok_many = _timed(s, prompts, n=list_tokens, fast=None)
        step(f"{n_prompts} prompts × {list_tokens} tokens, padded plain generate")
        padded, padded_wall, ok_padded = _timed(s, prompts, n=list_tokens, fast=False)
        rate, plain_rate = _decode_rate(one), _decode_rate(plain)
        read = bytes_per_token(s.model)
        later = _settled(s, prompts, new_tokens, list_tokens, plain_rate, padded.new_tokens / padded_wall, step) \
            if settle else {}
        step("done")
        return {
            "family": model,
            "model_type": s.model.config.get_text_config().model_type,
            "batch1_path": one.path,
            "batch1_tok_s": rate,
            "plain_tok_s": plain_rate,
            "batch1_vs_plain": rate / plain_rate if rate and plain_rate else None,
            "roofline": roofline_share(read, 1 / rate if rate else 0.0, bandwidth(s.device)),
            "list_path": many.path,
            "list_tok_s": many.new_tokens / many_wall,
            "padded_plain_tok_s": padded.new_tokens / padded_wall,
            "list_vs_plain": (many.new_tokens / many_wall) / (padded.new_tokens / padded_wall),
            "ok": ok_one and ok_plain and ok_many and ok_padded and later.pop("ok", True),
            "batch1_detail": one.detail,
            "list_detail": many.detail,
            "gib_read_per_token": read / 2 ** 30,
            "host_cpu": host_cpu(),
            **later,
        }
    finally:
        s.unload()


def _settled(s, prompts, new_tokens: int, list_tokens: int, plain_rate, padded_rate: float, step) -> dict:
    """The row's requests once the session has settled: what it runs after it has decoded a while,
    its compiles brought forward (the batch-1 step by ``fast.prepare``, the rows step and the
    prompts' prefill by ``decode.settle_batched``), each compiled step kept only where it measures
    faster, as the session's own policy keeps it. The young session's figures (the row's other
    columns) are what a notebook meets first; these, what it runs for the rest of the afternoon."""
    from ..errors import error_summary
    from ..generate import fast
    from .decode import settle_batched
    if not _cuda():
        return {"settled_note": "no GPU: nothing compiles"}
    out: dict = {}
    step("settling: the batch-1 step compiled and measured")
    t = time.perf_counter()
    try:
        fast.prepare(s, max_new_tokens=new_tokens, prompt_tokens=len(s.tokenizer(PROMPT)["input_ids"]))
    except NvkitError as e:  # a family the fast path does not run: nothing to settle at batch 1
        out["settled_note"] = f"batch 1 not settled: {error_summary(e)}"
    prepared = time.perf_counter() - t
    one, _, ok_one = _timed(s, PROMPT, n=new_tokens, fast=None)
    step("settling: the list's rows step and prefill compiled and measured")
    note = settle_batched(s, lambda: s.generate(prompts, max_new_tokens=list_tokens, min_new_tokens=list_tokens,
                                                fast=None))
    many, many_wall, ok_many = _timed(s, prompts, n=list_tokens, fast=None)
    rate, list_rate = _decode_rate(one), many.new_tokens / many_wall
    out.update({
        "batch1_settled_tok_s": rate,
        "batch1_settled_vs_plain": rate / plain_rate if rate and plain_rate else None,
        "list_settled_tok_s": list_rate,
        "list_settled_vs_plain": list_rate / padded_rate,
        "batch1_settled_detail": f"{one.detail}; fast.prepare took {prepared:.1f} s",
        "list_settled_detail": many.detail + note,
        "ok": ok_one and ok_many,
    })
    return out


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def run(shapes=FAMILIES, *, new_tokens: int = 200, n_prompts: int = 32, list_tokens: int = 128,
        plain_tokens: int | None = None, on_row=None, on_step=None, settle: bool = False):
    """The table, one row per shape (a DataFrame). ``on_row(row)`` hears each row as it is done,
    ``on_step(text)`` each step as it starts; a shape that fails to run gives a row with its error
    instead of stopping the others. ``settle``: each family's requests again once its session has
    settled (``run_family``)."""
    import pandas as pd
    whole_number("new_tokens", new_tokens, 2)
    whole_number("n_prompts", n_prompts, 2)
    whole_number("list_tokens", list_tokens, 2)
    if plain_tokens is not None:
        whole_number("plain_tokens", plain_tokens, 2)
    if not isinstance(settle, bool):
        raise NvkitError(f"settle must be True or False, not {settle!r}.")
    shapes = list(shapes)
    if not shapes:
        raise NvkitError("--families needs at least one shape (see nvkit.demo.SHAPES).")
    from ..demo import SHAPES
    unknown = [n for n in shapes if n.lower() not in SHAPES]
    if unknown:
        raise NvkitError(f"Unknown shape {unknown[0]!r} for --families. Known: {', '.join(sorted(SHAPES))}.")
    rows = []
    for name in shapes:
        try:
            row = run_family(name, new_tokens=new_tokens, n_prompts=n_prompts, list_tokens=list_tokens,
                             plain_tokens=plain_tokens, on_step=on_step, settle=settle)
        except Exception as e:  # noqa: BLE001 - one family's failure is that family's row
            from ..errors import error_summary
            row = {"family": name, "ok": False, "error": error_summary(e)}
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return pd.DataFrame(rows)
