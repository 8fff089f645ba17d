"""Session benchmark: generation as a notebook user meets it (``nvkit bench --session``).

One process, one model, plain ``s.generate(prompt, max_new_tokens=n)`` calls in a row — the
request lengths of ``REQUESTS``, then the same after a short ``nvkit.finetune`` (the adapter stays
attached), then a list of prompts — timed per request with nvkit's defaults, against
transformers' plain ``model.generate`` and ``generate(cache_implementation="static")`` (which
compiles), and nvkit's own plain path (``fast=False``) beside transformers' on the same requests.
Compiles are counted. ``run_phases`` runs it in fresh processes sharing one nvkit cache folder:
"cold" (nothing on disk), "warm" (the cold process's compile artifacts on disk, torch's and
Triton's own caches empty: what only nvkit's artifacts give, e.g. a new machine or container with
nvkit's cache folder carried over) and "restart" (every cache on disk as the cold process left it:
a restarted kernel or a second notebook on the same machine).

Plain ``generate`` runs at a steady rate per token, so by default it runs a few of the requests
and the others are estimated from its measured rate (the table marks them "est."). EOS is set
to an id the model cannot produce so every path makes exactly the tokens asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from ..errors import NvkitError, require
from .tables import table_text

REQUESTS = (256, 256, 40, 100, 200, 300, 600, 1000, 30)
PHASES = ("cold", "warm", "restart")
COLUMNS = ["phase", "part", "path", "request", "new_tokens", "seconds", "tokens_per_s", "ttft_ms", "compiles",
           "ran", "note"]


def _prompt(tok, n_tokens: int, seed: int = 0) -> str:
    from .. import demo
    with open(demo.CORPUS, encoding="utf-8") as f:
        words = f.read().split()
    start = (seed * 997) % max(1, len(words) - 4 * n_tokens)
    ids = tok(" ".join(words[start:start + 2 * n_tokens]))["input_ids"][:n_tokens]
    return tok.decode(ids, skip_special_tokens=True)


def load_session(model):
    from ..model.session import Session, load
    if isinstance(model, Session):
        return model
    require(isinstance(model, str) and model.strip(), f"model must be a shape name such as 'qwen3-0.6b', 'demo', a "
                                                      f"local directory or a Session, not {model!r}.")
    from .. import demo
    key = model.strip().lower()
    return load(demo.shaped(key) if key in demo.SHAPES else model)


def _compiles(s) -> int:
    d = s.decoders.single
    return int(d.counts["compiles"]) if d is not None else 0


def _parse(requests) -> tuple[int, ...]:
    if isinstance(requests, str):
        requests = [r for r in requests.split(",") if r.strip()]
    try:
        out = tuple(int(r) for r in requests)
    except (TypeError, ValueError):
        raise NvkitError(f"requests must be whole numbers of new tokens, e.g. '256,40', not {requests!r}.") from None
    require(all(r > 0 for r in out), f"requests must be ≥ 1 new token each, not {requests!r}.")
    return out


def _chosen(name: str, value, requests: tuple[int, ...]) -> set[int]:
    """The requests ``value`` ("all", "" for none, or new-token counts out of ``requests``) names."""
    if value == "all":
        return set(requests)
    chosen = set(_parse(value or ()))
    require(not chosen - set(requests), f"{name} must be 'all', '' (none) or requests of the sequence "
                                        f"{list(requests)}, not {value!r}.")
    return chosen


def run(model="qwen3-0.6b", requests=REQUESTS, plain="100,200", static="all", finetune_steps: int = 20,
        n_prompts: int = 64, list_new_tokens: int = 128, prompt_len: int = 64, phase: str = "cold",
        show: bool = True):
    """Run the session sequence in this process and return a pandas DataFrame (printed when ``show``).

    ``model``: a shape name such as "qwen3-0.6b" (random weights), "demo", a local directory or a
    loaded Session. ``plain`` / ``static``: the requests (new-token counts out of ``requests``)
    those paths really run (plain ``generate`` beside nvkit's ``fast=False``, in alternating
    pairs; static + compile on CUDA only); ``"all"`` runs them all, ``""`` none. Plain runs two
    mid-length requests by default: on a GPU it is host-bound at a steady rate per token, and
    running all of it would take most of the benchmark's time. ``finetune_steps=0`` skips the
    fine-tune part, ``n_prompts=0`` the list."""
    import pandas as pd
    import torch

    requests = _parse(requests)
    plain_set, static_set = _chosen("plain", plain, requests), _chosen("static", static, requests)
    for name, v in (("finetune_steps", finetune_steps), ("n_prompts", n_prompts), ("list_new_tokens", list_new_tokens),
                    ("prompt_len", prompt_len)):
        require(isinstance(v, int) and not isinstance(v, bool) and v >= 0, f"{name} must be a whole number ≥ 0, not {v!r}.")
    s = load_session(model)
    tok = s.tokenizer
    never = int(s.model.config.get_text_config().vocab_size)
    prompt = _prompt(tok, prompt_len)
    cuda = s.device.type == "cuda"
    if not cuda:
        static_set = set()  # transformers compiles the static cache's step on CUDA only
    rows: list[dict] = []

    def add(part, path, i, n, seconds, ttft=None, ran="", note=""):
        rows.append(dict(phase=phase, part=part, path=path, request=i, new_tokens=n, seconds=round(seconds, 3),
                         tokens_per_s=round(n / seconds, 1) if seconds else None,
                         ttft_ms=round(ttft * 1000, 1) if ttft is not None else None,
                         compiles=_compiles(s), ran=ran, note=note))

    def hf_generate(n, **kw):
        enc = tok(prompt, return_tensors="pt").to(s.device)
        with torch.inference_mode():
            s.model.generate(**enc, max_new_tokens=n, do_sample=False, eos_token_id=never,
                             pad_token_id=tok.pad_token_id, **kw)

    def sequence(part):
        t_part = time.perf_counter()
        for i, n in enumerate(requests):
            t = time.perf_counter()
            s.generate(prompt, max_new_tokens=n, eos_token_id=never)
            st = s.last_stats
            add(part, "nvkit default", i, st.new_tokens, time.perf_counter() - t, st.time_to_first_token, st.how,
                note=f"prepared first: {st.prepared}" if st.prepared else "")
        add(part, "nvkit default", "total", sum(requests), time.perf_counter() - t_part)
        if phase != "cold":
            return  # plain and static do not depend on nvkit's disk cache: measured once, in the cold phase
        if static_set:
            total = 0.0
            for i, n in enumerate(requests):
                if n in static_set:
                    t = time.perf_counter()
                    hf_generate(n, cache_implementation="static")
                    secs = time.perf_counter() - t
                    total += secs
                    add(part, "static+compile", i, n, secs, ran="transformers generate")
            ran_all = all(n in static_set for n in requests)
            add(part, "static+compile", "total" if ran_all else "total (run only)",
                sum(n for n in requests if n in static_set), total, note="" if ran_all else "the other requests were not run")
        # transformers' plain generate and nvkit's fast=False in pairs, each pair in the other order:
        # both are host-bound on a GPU, and a host-bound rate drifts between calls, so only
        # neighbours compare fairly
        measured = []
        for j, (i, n) in enumerate((i, n) for i, n in enumerate(requests) if n in plain_set):
            for who in (("plain", "nvkit") if j % 2 == 0 else ("nvkit", "plain")):
                t = time.perf_counter()
                if who == "plain":
                    hf_generate(n)
                    secs = time.perf_counter() - t
                    measured.append((n, secs))
                    add(part, "plain generate", i, n, secs, ran="transformers generate")
                else:
                    s.generate(prompt, max_new_tokens=n, eos_token_id=never, fast=False)
                    st = s.last_stats
                    add(part, "nvkit fast=False", i, st.new_tokens, time.perf_counter() - t, st.time_to_first_token,
                        st.how, note="compare with plain generate's row of this request")
        if measured:
            rate = sum(n for n, _ in measured) / sum(x for _, x in measured)
            total, est = sum(x for _, x in measured), False
            for i, n in enumerate(requests):
                if n in plain_set:
                    continue
                total += n / rate
                est = True
                add(part, "plain generate", i, n, n / rate, note=f"est. from its {rate:.1f} tok/s")
            add(part, "plain generate", "total", sum(requests), total, note="measured + est." if est else "")

    sequence("sequence")
    if finetune_steps:
        from .. import demo
        from ..train.finetune import finetune
        with open(demo.CORPUS, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if len(ln.strip()) > 40][:200]
        t = time.perf_counter()
        ft = finetune(s, lines, max_steps=finetune_steps, batch_size=4, seq_len=256,
                      output_dir=tempfile.mkdtemp(prefix="nvkit-bench-session-"))
        ft.result()
        rows.append(dict(phase=phase, part="fine-tune", path="nvkit.finetune", request="", new_tokens=None,
                         seconds=round(time.perf_counter() - t, 3), compiles=_compiles(s),
                         note=f"{finetune_steps} steps, adapter left attached"))
        plain_set = {min(plain_set)} if plain_set else set()  # with the adapter: its rate, the rest estimated
        static_set = set()
        sequence("after fine-tune")
    if n_prompts:
        prompts = [_prompt(tok, max(8, prompt_len // 2 + (i * 37) % (2 * prompt_len)), seed=i + 1) for i in range(n_prompts)]
        t = time.perf_counter()
        s.generate(prompts, max_new_tokens=list_new_tokens, eos_token_id=never)
        st = s.last_stats
        add(f"{n_prompts} prompts", "nvkit default", "", st.new_tokens, time.perf_counter() - t, st.time_to_first_token,
            st.how, note=f"prepared first: {st.prepared}" if st.prepared else "")
        if phase == "cold":
            old = tok.padding_side
            tok.padding_side = "left"
            try:
                enc = tok(prompts, return_tensors="pt", padding=True).to(s.device)
            finally:
                tok.padding_side = old
            t = time.perf_counter()
            with torch.inference_mode():
                s.model.generate(**enc, max_new_tokens=list_new_tokens, do_sample=False, eos_token_id=never,
                                 pad_token_id=tok.pad_token_id)
            add(f"{n_prompts} prompts", "padded generate", "", n_prompts * list_new_tokens, time.perf_counter() - t,
                ran="transformers generate")
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update(model=s.model_id, device=str(s.device), gpu=torch.cuda.get_device_name(s.device) if cuda else "cpu")
    if show:
        _print(df)
    return df


def summary(df) -> "object":
    """Totals per phase, part and path, and nvkit's speed-up over plain generate."""
    import pandas as pd
    tot = df[df["request"].astype(str).str.startswith("total") | df["part"].str.contains("prompts")]
    out = tot[["phase", "part", "path", "new_tokens", "seconds", "compiles", "note"]].copy()
    plain = {(r.phase, r.part): r.seconds for r in out.itertuples() if r.path in ("plain generate", "padded generate")}
    cold_plain = {part: v for (ph, part), v in plain.items() if ph == "cold"}
    out["plain_over_nvkit"] = [round(cold_plain[r.part] / r.seconds, 1) if r.path == "nvkit default"
                               and r.part in cold_plain and r.seconds else None for r in out.itertuples()]
    # every part of a phase together (the fine-tune itself left out: both sides would pay it)
    whole = []
    for phase in dict.fromkeys(out["phase"]):
        ours = out[(out["phase"] == phase) & (out["path"] == "nvkit default")]
        if len(ours) > 1 and set(ours["part"]) <= set(cold_plain):
            base = sum(cold_plain[p] for p in ours["part"])
            total = float(ours["seconds"].sum())
            whole.append(dict(phase=phase, part="all parts", path="nvkit default", new_tokens=int(ours["new_tokens"].sum()),
                              seconds=round(total, 3), compiles=None, note=" + ".join(ours["part"]),
                              plain_over_nvkit=round(base / total, 1) if total else None))
            if phase == "cold":
                whole.append(dict(phase=phase, part="all parts", path="plain generate", new_tokens=None,
                                  seconds=round(base, 3), compiles=None, note="padded generate for the list",
                                  plain_over_nvkit=None))
    return pd.concat([out, pd.DataFrame(whole)], ignore_index=True) if whole else pd.DataFrame(out)


def _print(df) -> None:
    print(f"session benchmark · {df.attrs.get('model')} · {df.attrs.get('gpu')}")
    print(table_text(df, index=False, colwidth=90))
    print("\ntotals:")
    print(table_text(summary(df), index=False, colwidth=90))


def run_phases(model="qwen3-0.6b", phases=("cold", "warm"), csv: str | None = None, folder: str | None = None,
               **kwargs):
    """The session benchmark in one fresh process per phase, sharing one nvkit cache folder (so
    "warm" and "restart" find "cold"'s compile artifacts). "cold" and "warm" get empty torch and
    Triton caches of their own (so only nvkit's artifacts can make "warm" warm); "restart" gets the
    cold phase's, as a restarted kernel on the same machine finds them. ``folder``: where those
    live (default: a new temporary folder); give the same one to a cold and a later call.
    Returns the combined DataFrame."""
    import pandas as pd
    if isinstance(model, str) and model.strip().lower() != "demo" and not os.path.isdir(os.path.expanduser(model)):
        from .. import demo
        if model.strip().lower() in demo.SHAPES:
            model = demo.shaped(model.strip().lower())  # built once, in the usual cache, before the phases
    require(phases and all(p in PHASES for p in phases),
            f"phases must be some of {', '.join(map(repr, PHASES))}, not {phases!r}.")
    requests = _parse(kwargs.get("requests", REQUESTS))
    for name in ("plain", "static"):  # checked here: a bad value would only fail inside each phase's process
        if kwargs.get(name) is not None:
            _chosen(name, kwargs[name], requests)
    root = folder or tempfile.mkdtemp(prefix="nvkit-bench-session-")
    os.makedirs(root, exist_ok=True)
    kept = os.path.join(root, "nvkit")
    if "cold" in phases and os.path.isdir(kept) and os.listdir(kept):
        raise NvkitError(f"The cold phase needs nothing on disk, but {kept} holds compile artifacts of an earlier run: "
                         "pass another folder (or none, for a new temporary one), or remove that one first.")
    frames = []
    for phase in phases:
        out = os.path.join(root, f"{phase}.json")
        own = "cold" if phase == "restart" else phase
        env = dict(os.environ, NVKIT_CACHE=os.path.join(root, "nvkit"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(root, f"inductor-{own}"),
                   TRITON_CACHE_DIR=os.path.join(root, f"triton-{own}"))
        args = dict(kwargs, model=model, phase=phase)
        code = ("import json, sys; from nvkit.benchmarks import session as b; "
                f"df = b.run(**json.loads(sys.argv[1])); df.to_json({out!r}, orient='records')")
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code, json.dumps(args)], env=env)
        if r.returncode != 0:
            raise NvkitError(f"The {phase} phase of the session benchmark failed (exit {r.returncode}); its output is above.")
        df = pd.read_json(out, orient="records")
        df = pd.concat([df, pd.DataFrame([dict(phase=phase, part="process", path="whole process", request="",
                                               seconds=round(time.perf_counter() - t, 1),
                                               note="start, model load, everything above")])], ignore_index=True)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)[COLUMNS]
    if csv:
        df.to_csv(csv, index=False)
    print(f"\n=== phases: {', '.join(phases)} ===")
    _print(df)
    return df
