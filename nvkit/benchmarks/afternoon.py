"""An afternoon in one kernel (``nvkit bench MODEL --afternoon``): the requests issue 39 timed, in
one process on one session, each as the whole call a user waits for, with the target it is held to.

In order: the session's first short request; lists of many sizes, growing and shrinking; ``top_k=1``
sampling against greedy; a prompt alone against the same prompt inside lists (greedy text, batch
invariance), on the default paths and with ``deterministic=True`` (and its list throughput against the default's); ``stop_strings`` with ``tokenizer=``; a long request (the base decode rate); a short
``nvkit.finetune``; the same long request with its adapter attached; ``compare``'s two sides.

Each row has the stats line's path, the wall time, the first token and the decode rate, the
target (``target``) and whether it held (``ok``: None where it does not apply). The time targets
are the GPU's (the fast paths are CUDA's): on a CPU only the tokens and the identities are held.
A list's row also checks it produced the tokens it claims (``min_new_tokens`` holds every prompt
to its length), and a row's note says when a full pass of Python's garbage collector ran inside
its calls (``gc_passes``: a wait that is not nvkit's path).
"""

from __future__ import annotations

import tempfile
import time

from ..checks import whole_number
from ..errors import NvkitError
from .gc_passes import full_passes

LISTS = (3, 8, 64, 8, 1, 2, 3, 5, 9, 12, 17, 33, 40, 7, 2)
#: the lists a prompt is compared inside (77 rows in all)
INVARIANCE = (2, 5, 10, 20, 40)
COLUMNS = ["step", "request", "path", "seconds", "ttft_ms", "decode_tok_s", "target", "ok", "note"]
#: issue 39's targets on a GPU
FIRST_SECONDS, LIST_FIRST_TOKEN, ADAPTER_EXTRA_SECONDS, ADAPTER_RATE, COMPARE_TOK_S = 1.2, 0.2, 0.5, 0.9, 400


def run(model="qwen3-0.6b", *, first_tokens: int = 24, lists=LISTS, list_tokens: int = 32, invariance=INVARIANCE,
        invariance_tokens: int = 96, long_tokens: int = 256, finetune_steps: int = 10, compare_tokens: int = 30,
        show: bool = True):
    """Run the afternoon on ``model`` (a shape name, "demo", a directory or a Session); returns the
    rows as a DataFrame (``COLUMNS``)."""
    import pandas as pd
    for name, v in (("first_tokens", first_tokens), ("list_tokens", list_tokens), ("long_tokens", long_tokens),
                    ("invariance_tokens", invariance_tokens), ("compare_tokens", compare_tokens)):
        whole_number(name, v, 1)
    whole_number("finetune_steps", finetune_steps, 0)
    for name, sizes in (("lists", lists), ("invariance", invariance)):
        if not sizes or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 256 for n in sizes):
            raise NvkitError(f"{name} must be list sizes of 1–256 prompts, not {sizes!r}.")
    from .decode import mixed_prompts
    from .session import load_session
    s = load_session(model)
    cuda = s.device.type == "cuda"
    prompts = mixed_prompts(s.tokenizer, max(max(lists), max(invariance)), seed=39, lo=8, hi=64)
    prompt = "Tell me about GPUs."
    with full_passes() as passes:  # said in the row of a call one lands in
        rows = []

        def call(*args, **kw):
            t = time.perf_counter()
            out = s.generate(*args, **kw)
            return out, time.perf_counter() - t, s.last_stats

        def add(step, request, st=None, seconds=None, target="", ok=None, note=""):
            ttft = st.time_to_first_token if st is not None else None
            note = "; ".join(filter(None, [note, passes.words()]))  # since the row before
            passes.clear()
            rows.append(dict(step=step, request=request, path=st.how if st is not None else "",
                             seconds=round(seconds, 3) if seconds is not None else None,
                             ttft_ms=round(ttft * 1000, 1) if ttft is not None else None,
                             decode_tok_s=round(st.decode_tokens_per_second, 1)
                             if st is not None and st.decode_tokens_per_second else None,
                             target=target if cuda or ok is not None else f"{target} (GPU)" if target else "",
                             ok=ok, note=note))
            if show:
                r = rows[-1]
                parts = [f"{r['seconds']} s" if r["seconds"] is not None else "",
                         f"first token {r['ttft_ms']} ms" if r["ttft_ms"] is not None else "", r["path"], note,
                         "" if r["ok"] is None else "ok" if r["ok"] else f"MISSED: {r['target']}"]
                print(f"{step}: {request}: " + " · ".join(p for p in parts if p), flush=True)

        _, wall, st = call(prompt, max_new_tokens=first_tokens)
        add("first request", f"{first_tokens} tokens", st, wall, f"≤ {FIRST_SECONDS} s",
            wall <= FIRST_SECONDS if cuda else None)
        for j, n in enumerate(lists):
            _, wall, st = call(prompts[:n], max_new_tokens=list_tokens, min_new_tokens=list_tokens)
            whole = st.new_tokens == n * list_tokens
            later = j > 0 and cuda
            add("list", f"{n} prompts × {list_tokens}", st, wall, f"first token ≤ {LIST_FIRST_TOKEN} s" if j else "",
                (whole and st.time_to_first_token <= LIST_FIRST_TOKEN) if later else (None if whole else False),
                "; ".join(filter(None, ["" if whole else f"made {st.new_tokens} of {n * list_tokens} tokens",
                                        f"prepared first: {st.prepared}" if st.prepared else ""])))
        greedy, _, _ = call(prompt, max_new_tokens=48)
        sampled, wall, st = call(prompt, max_new_tokens=48, do_sample=True, top_k=1, seed=7)
        add("same answers", "top_k=1 sampling vs greedy", st, wall, "the same text", sampled == greedy)
        rates = {}
        for det in (False, True):  # the default paths, then deterministic=True (held to the target)
            kw = dict(max_new_tokens=invariance_tokens, min_new_tokens=invariance_tokens, deterministic=det)
            alone = [call(p, **kw)[0] for p in prompts[:max(invariance)]]
            differ, total, paths = 0, 0, set()
            for n in invariance:
                outs, wall, st = call(prompts[:n], **kw)
                paths.add(st.path)
                differ += sum(o != a for o, a in zip(outs, alone))
                total += n
            rates[det] = st.new_tokens / wall  # the largest list's, the whole call
            cost = f"; {rates[det]:,.0f} tok/s for {n} prompts, {rates[True] / rates[False]:.0%} of the default" if det else ""
            add("same answers", f"a prompt alone vs in lists of {min(invariance)}–{max(invariance)}"
                + (", deterministic=True" if det else ""), st, wall, "0 rows differ" if det else "",
                differ == 0 if det else None, f"{differ} of {total} rows differ ({', '.join(sorted(paths))}){cost}")
        try:
            _, wall, st = call(prompt, max_new_tokens=24, stop_strings=["."], tokenizer=s.tokenizer)
            add("arguments", "stop_strings with tokenizer=", st, wall, "accepted", True)
        except NvkitError as e:
            add("arguments", "stop_strings with tokenizer=", target="accepted", ok=False, note=str(e))
        _, base_wall, base = call(prompt, max_new_tokens=long_tokens)
        add("long request", f"{long_tokens} tokens, base model", base, base_wall)
        if finetune_steps:
            from .. import demo
            from ..train.finetune import finetune
            with open(demo.CORPUS, encoding="utf-8") as f:
                lines = [ln.strip() for ln in f if len(ln.strip()) > 40][:200]
            t = time.perf_counter()
            finetune(s, lines, max_steps=finetune_steps, batch_size=4, seq_len=256,
                     output_dir=tempfile.mkdtemp(prefix="nvkit-bench-afternoon-")).result()
            add("fine-tune", f"{finetune_steps} steps", seconds=time.perf_counter() - t, note="adapter left attached")
            _, wall, st = call(prompt, max_new_tokens=long_tokens)
            rates = (st.decode_tokens_per_second, base.decode_tokens_per_second)
            rate = rates[0] / rates[1] if all(rates) else None
            add("long request", f"{long_tokens} tokens, adapter attached", st, wall,
                f"≤ {ADAPTER_EXTRA_SECONDS} s more than the base's, ≥ {ADAPTER_RATE:.0%} of its decode rate",
                (wall <= base_wall + ADAPTER_EXTRA_SECONDS and (rate or 0) >= ADAPTER_RATE) if cuda else None,
                (f"{rate:.0%} of the base's decode rate" if rate is not None else "no decode rate reported")
                + (f"; prepared first: {st.prepared}" if st.prepared else ""))
            t = time.perf_counter()
            c = s.compare(prompts[:2], max_new_tokens=compare_tokens)
            low = min(min(r.base_tokens_per_s, r.tuned_tokens_per_s) for r in c)
            add("compare", f"2 prompts × {compare_tokens}, base and tuned", seconds=time.perf_counter() - t,
                target=f"both sides ≥ {COMPARE_TOK_S} tok/s", ok=low >= COMPARE_TOK_S if cuda else None,
                note="tok/s " + ", ".join(f"base {r.base_tokens_per_s:.0f} / tuned {r.tuned_tokens_per_s:.0f}" for r in c))
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update(model=s.model_id, device=str(s.device))
    return df
