"""A session's first short request, as a new notebook kernel meets it: one fresh process loads a
shape and asks for 24 new tokens once per way named, printing each call's wall time, stats line
(where its wait went) and the full passes of Python's garbage collector inside it. Run each row of
docs/benchmarks.md's table in a process of its own:

    python scripts/first_request.py fast            # the fast path, capture first
    python scripts/first_request.py plain,auto      # plain generate, then fast=None's choice
    python scripts/first_request.py auto --shape llama-3.2-1b --tokens 128
    python scripts/first_request.py fast --profile 40   # where the first call's time goes (cProfile)
    python scripts/first_request.py fast --finetune 10 --tokens 256 --profile 40
        # the first request after a 10-step nvkit.finetune (its adapter attached), after one base
        # request of the same size: where the adapter's first request spends its time
"""

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ways", help="comma-separated: fast (fast=True), plain (fast=False), auto (fast=None)")
    p.add_argument("--shape", default="qwen3-0.6b", help="a shape of nvkit.demo.SHAPES")
    p.add_argument("--tokens", type=int, default=24, help="new tokens per request")
    p.add_argument("--device-map", default="cuda")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile the first call: its N costliest functions by own and by total time")
    p.add_argument("--list", type=int, default=0, metavar="N",
                   help="each way's request is a list of N prompts of 32 to 159 tokens (the session bench's)")
    p.add_argument("--finetune", type=int, default=0, metavar="STEPS",
                   help="first one base request (fast=True on a GPU, unprofiled), then nvkit.finetune STEPS steps on the "
                        "demo corpus with its adapter left attached; the ways run after it")
    a = p.parse_args(argv)
    choice = {"fast": True, "plain": False, "auto": None}
    ways = a.ways.split(",")
    bad = [w for w in ways if w not in choice]
    if bad or a.tokens < 1 or a.profile < 0 or a.finetune < 0 or a.list < 0:
        p.error(f"ways are {', '.join(choice)} (not {bad}); --tokens ≥ 1; --profile, --finetune and --list ≥ 0")
    import nvkit
    from nvkit.benchmarks.gc_passes import full_passes
    with full_passes() as passes:
        _requests(nvkit, a, choice, ways, passes)
    return 0


def _requests(nvkit, a, choice, ways, passes) -> None:
    t = time.perf_counter()
    s = nvkit.load(nvkit.demo.shaped(a.shape), device_map=a.device_map, dtype="bfloat16")
    print(f"load {time.perf_counter() - t:.1f} s; {_gc(passes)}", flush=True)
    from nvkit.generate.kernels import warm
    print(f"after the load, {warm.words()}", flush=True)
    if a.finetune:
        t = time.perf_counter()
        s.generate("Tell me about GPUs.", max_new_tokens=a.tokens, fast=True if s.device.type == "cuda" else None)
        print(f"base request: {time.perf_counter() - t:.2f} s: {s.last_stats}; {_gc(passes)}", flush=True)
        with open(nvkit.demo.CORPUS, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f if len(ln.strip()) > 40][:200]
        t = time.perf_counter()
        nvkit.finetune(s, lines, max_steps=a.finetune, batch_size=4, seq_len=256,
                       output_dir=tempfile.mkdtemp(prefix="nvkit-first-request-")).result()
        print(f"fine-tune, {a.finetune} steps: {time.perf_counter() - t:.1f} s; {_gc(passes)}", flush=True)
    from nvkit.benchmarks.decode import mixed_prompts
    for i, way in enumerate(ways):
        prompt = "Tell me about GPUs."
        if a.list:  # the session bench's lengths, each list its own text (no prefix the last one cached)
            prompt = mixed_prompts(s.tokenizer, a.list, seed=i, lo=32, hi=159)
        entries = _triton_folders()
        prof = cProfile.Profile() if a.profile and i == 0 else None
        if prof and sys.version_info >= (3, 12):
            prof.enable()  # sys.monitoring: every thread, the session's worker too
        elif prof:  # the request runs in the session's worker thread, which the first request starts
            threading.setprofile(lambda *_: prof.enable())
        t = time.perf_counter()
        s.generate(prompt, max_new_tokens=a.tokens, fast=choice[way])
        threading.setprofile(None)
        if prof:
            prof.disable()
        after = _triton_folders()
        new = None if entries is None or after is None else after - entries
        compiled = "?" if new is None else len(new)
        print(f"{way} #{i}: {time.perf_counter() - t:.2f} s: {s.last_stats}; Triton's cache gained {compiled} "
              f"entries; {_gc(passes)}", flush=True)
        if new:
            print(f"what Triton compiled: {_compiled(new)}", flush=True)
        if i == 0:
            print(f"after it, {warm.words()}", flush=True)
        if prof and not prof.getstats():
            print("no profile: before Python 3.12 a profile sees only the threads started after it, and the "
                  "session's worker thread had started (--finetune's base request)", flush=True)
        elif prof:
            for key in ("tottime", "cumulative"):
                pstats.Stats(prof, stream=sys.stdout).sort_stats(key).print_stats(a.profile)


def _triton_folders() -> set | None:
    """The entries of Triton's on-disk cache now, one folder per compiled kernel or built launcher
    (None: it cannot be read; none yet where Triton has not made it: the fresh machine's first
    compile makes it)."""
    from nvkit.generate.fast.first_request import triton_cache_folder
    try:
        return set(os.listdir(triton_cache_folder()))
    except FileNotFoundError:
        return set()
    except OSError:
        return None


def _compiled(new: set) -> str:
    """The kernels and launchers in the cache entries ``new``, by the names of their files (a
    kernel's entry holds NAME.cubin, NAME.json, ...; a launcher's the module it built)."""
    from nvkit.generate.fast.first_request import triton_cache_folder
    folder, names = triton_cache_folder(), []
    for entry in sorted(new):
        try:
            files = os.listdir(os.path.join(folder, entry))
        except OSError:
            continue
        stems = sorted({f.split(".")[0] for f in files if not f.startswith("__grp__")})
        names.append("/".join(stems) or "(empty)")
    return ", ".join(sorted(names)) or "nothing"


def _gc(passes) -> str:
    """What the garbage collector's full passes cost the call just timed; then counts afresh."""
    words = passes.words() or "no full gc pass inside"
    passes.clear()
    return words


if __name__ == "__main__":
    sys.exit(main())
