"""Where a fresh process's first call goes: ``python scripts/first_call_profile.py batched|batch-1
[SHAPE]`` runs one first call (8 prompts × 64 new tokens, or the first of them alone) on the shape
(default qwen3-0.6b) under cProfile, with nvkit's, inductor's and Triton's caches in a new empty
folder, and prints the stats line and the functions that took the most time (cumulative)."""
import cProfile
import os
import pstats
import sys
import tempfile
import time

which = sys.argv[1] if len(sys.argv) > 1 else "batched"
shape = sys.argv[2] if len(sys.argv) > 2 else "qwen3-0.6b"
if which not in ("batched", "batch-1"):
    raise SystemExit(f"batched or batch-1, not {which!r}")
root = tempfile.mkdtemp(prefix="nvkit-first-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(root, "inductor"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(root, "triton"))
shaped_home = os.environ.get("NVKIT_CACHE")  # the shaped checkpoint is built once per machine

import nvkit  # noqa: E402
from nvkit.benchmarks.decode import mixed_prompts  # noqa: E402
from tests import demo_model  # noqa: E402

path = demo_model.shaped(shape)
os.environ["NVKIT_CACHE"] = os.path.join(root, "nvkit")
s = nvkit.load(path, device_map="cuda", dtype="bfloat16")
prompts = mixed_prompts(s.tokenizer, 8, seed=0)
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
s.generate(prompts if which == "batched" else prompts[0], max_new_tokens=64, fast=True)
prof.disable()
print(f"{which}: {time.perf_counter() - t:.2f} s; {s.last_stats}")
stats = pstats.Stats(prof)
stats.sort_stats("cumulative").print_stats(45)
stats.sort_stats("tottime").print_stats(15)
