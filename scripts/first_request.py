"""A session's first short request, as a new notebook kernel meets it: one fresh process loads a
shape and asks for 24 new tokens once per way named, printing each call's wall time and stats line
(where its wait went). Run each row of docs/benchmarks.md's table in a process of its own:

    python scripts/first_request.py fast            # the fast path, capture first
    python scripts/first_request.py plain,auto      # plain generate, then fast=None's choice
    python scripts/first_request.py auto --shape llama-3.2-1b --tokens 128
    python scripts/first_request.py fast --profile 40   # where the first call's time goes (cProfile)
"""

import argparse
import cProfile
import pstats
import sys
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
    a = p.parse_args(argv)
    choice = {"fast": True, "plain": False, "auto": None}
    ways = a.ways.split(",")
    bad = [w for w in ways if w not in choice]
    if bad or a.tokens < 1 or a.profile < 0:
        p.error(f"ways are {', '.join(choice)} (not {bad}); --tokens ≥ 1; --profile ≥ 0")
    import nvkit
    t = time.perf_counter()
    s = nvkit.load(nvkit.demo.shaped(a.shape), device_map=a.device_map, dtype="bfloat16")
    print(f"load {time.perf_counter() - t:.1f} s", flush=True)
    for i, way in enumerate(ways):
        prof = cProfile.Profile() if a.profile and i == 0 else None
        if prof and sys.version_info >= (3, 12):
            prof.enable()  # sys.monitoring: every thread, the session's worker too
        elif prof:  # the request runs in the session's worker thread, which the first request starts
            threading.setprofile(lambda *_: prof.enable())
        t = time.perf_counter()
        s.generate("Tell me about GPUs.", max_new_tokens=a.tokens, fast=choice[way])
        threading.setprofile(None)
        if prof:
            prof.disable()
        print(f"{way} #{i}: {time.perf_counter() - t:.2f} s: {s.last_stats}", flush=True)
        if prof:
            for key in ("tottime", "cumulative"):
                pstats.Stats(prof, stream=sys.stdout).sort_stats(key).print_stats(a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
