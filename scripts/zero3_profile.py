"""Where one DeepSpeed ZeRO-3 LoRA step's time goes (issue 41; a developer's tool): the run
``nvkit.launch(strategy="zero3")`` makes, on one GPU, once per variant of nvkit's ZeRO-3 settings,
each variant in a process group of its own (torchrun, one process) through nvkit's own worker:

- ``plain``: DeepSpeed's defaults for the sizes and no leaf module: every module hooked (the
  settings nvkit had before ``nvkit.train.strategies.zero3_settings``);
- ``nvkit``: what ``nvkit.launch`` sets now (the decoder layer gathered whole, the prefetch bucket
  and persistence threshold from the model).

For each: the seconds of every step (CUDA synchronized at both ends) and the steps/s without the
first step and the profiled ones; for one step, torch.profiler's ops by self CPU and by self CUDA
time with the step's CPU wall time against its GPU kernel time (a step whose kernels take far less
than its wall time is held up by the host); for the next step, cProfile's Python functions by own
time (DeepSpeed's hooks are Python: fetch_sub_module, release_sub_module, ...).

Usage: python scripts/zero3_profile.py [--variants plain,nvkit] [--steps 8] [--profile-step 5]
       [--model qwen3-0.6b] [--out DIR]
Needs DeepSpeed (.whl-ds: scripts/gpu_wheels_ds.sh). Without CUDA it runs on the demo model on the
CPU (gloo), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = [{"prompt": f"Question {i}: what is on GPU {i % 8}?", "response": f"GPU {i % 8} holds shard {i}."}
        for i in range(256)]
VARIANTS = ("plain", "nvkit")


# --- one variant, inside its torchrun process ----------------------------------------------------

def _variant_patches(variant: str) -> None:
    """Make nvkit's worker build the ``variant``'s DeepSpeed config."""
    from nvkit.train import worker
    if variant == "plain":
        # no decoder layer: the worker then adds no ZeRO-3 settings and no leaf preparation
        worker.decoder_layer = lambda path: None
    elif variant != "nvkit":
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")


def _profiling_callback(stream, profile_step: int, out: dict):
    """nvkit's own stream callback (``stream``), with each step timed and two steps profiled."""
    import cProfile
    import io
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.cuda.is_available()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    class Profiled(type(stream)):
        def __init__(self):
            super().__init__()
            self.t0, self.prof, self.cprof = 0.0, None, None

        def on_step_begin(self, args, state, control, **kw):
            step = state.global_step + 1
            if step == 1 and kw.get("model") is not None:
                modules = list(kw["model"].modules())
                out["modules"] = len(modules)
                out["leaf_modules"] = sum(1 for m in modules if getattr(m, "_z3_leaf", False))
                out["hooked_modules"] = sum(1 for m in modules if m._forward_pre_hooks)  # ZeRO-3's fetch hooks
            if step == profile_step:
                self.prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
                self.prof.__enter__()
            elif step == profile_step + 1:
                self.cprof = cProfile.Profile()
                self.cprof.enable()
            sync()
            self.t0 = time.perf_counter()
            return super().on_step_begin(args, state, control, **kw)

        def on_step_end(self, args, state, control, **kw):
            sync()
            dt = time.perf_counter() - self.t0
            out.setdefault("step_s", []).append(round(dt, 4))
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
                out["profile"] = _op_tables(self.prof, dt)
                self.prof = None
            if self.cprof is not None:
                self.cprof.disable()
                text = io.StringIO()
                pstats.Stats(self.cprof, stream=text).sort_stats("tottime").print_stats(30)
                out["python"] = text.getvalue()
                self.cprof = None
            return super().on_step_end(args, state, control, **kw)

    return Profiled()


def _op_tables(prof, wall_s: float) -> dict:
    events = prof.key_averages()

    def self_device(e) -> float:
        us = getattr(e, "self_device_time_total", None)
        return float(us if us is not None else getattr(e, "self_cuda_time_total", 0.0))

    kernel_us = sum(self_device(e) for e in events)
    by_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    by_gpu = sorted(events, key=self_device, reverse=True)[:15]
    return {
        "wall_ms": round(wall_s * 1e3, 2), "gpu_kernel_ms": round(kernel_us / 1e3, 2),
        "ops_launched": int(sum(e.count for e in events)),
        "by_self_cpu": [(e.key, e.count, round(e.self_cpu_time_total / 1e3, 2)) for e in by_cpu],
        "by_self_gpu": [(e.key, e.count, round(self_device(e) / 1e3, 2)) for e in by_gpu],
    }


def rank_main(variant: str, run_dir: str, profile_step: int, out_file: str) -> None:
    from nvkit.train import worker
    _variant_patches(variant)
    out: dict = {"variant": variant}
    plain_stream = worker._stream_callback

    def stream_with_profile(*a, **kw):
        return _profiling_callback(plain_stream(*a, **kw), profile_step, out)

    worker._stream_callback = stream_with_profile
    worker.train(run_dir)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_file, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


# --- the driver ------------------------------------------------------------------------------------

def _rate(step_s: list, skip: set) -> float | None:
    kept = [t for i, t in enumerate(step_s, start=1) if i not in skip]
    return len(kept) / sum(kept) if kept else None


def _print(res: dict, profile_step: int) -> None:
    v = res["variant"]
    steps = res.get("step_s", [])
    rate = _rate(steps, {1, profile_step, profile_step + 1})
    print(f"\n===== ZeRO-3 variant {v!r}: {res.get('modules')} modules, {res.get('hooked_modules')} with a fetch hook, "
          f"{res.get('leaf_modules')} gathered whole (leaf modules)")
    print(f"step seconds: {steps}")
    print(f"steps/s without step 1 and the profiled steps: {rate:.2f}" if rate else "steps/s: n/a")
    p = res.get("profile")
    if p:
        print(f"profiled step {profile_step}: wall {p['wall_ms']} ms, GPU kernels {p['gpu_kernel_ms']} ms "
              f"({p['gpu_kernel_ms'] / max(p['wall_ms'], 1e-9):.0%} of the wall), {p['ops_launched']} ops")
        print("top ops by self CPU time (ms):")
        for key, count, ms in p["by_self_cpu"]:
            print(f"  {ms:10.2f}  ×{count:<6} {key[:100]}")
        print("top ops by self CUDA time (ms):")
        for key, count, ms in p["by_self_gpu"]:
            print(f"  {ms:10.2f}  ×{count:<6} {key[:100]}")
    if res.get("python"):
        print(f"step {profile_step + 1} under cProfile, Python functions by own time:")
        print(res["python"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--profile-step", type=int, default=5)
    ap.add_argument("--model", default=None, help="a shape name (default qwen3-0.6b on CUDA, the demo model without)")
    ap.add_argument("--out", default=None,
                    help="folder for the runs and the JSON results (default: a new temporary one)")
    ap.add_argument("--rank", nargs=4, metavar=("VARIANT", "RUN_DIR", "PROFILE_STEP", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        variant, run_dir, step, out_file = a.rank
        rank_main(variant, run_dir, int(step), out_file)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.profile_step + 1 >= a.steps:
        raise SystemExit(f"--profile-step ({a.profile_step}) needs two more steps after it: "
                         f"--steps ≥ {a.profile_step + 2}")
    import torch

    import nvkit
    cuda = torch.cuda.is_available()
    model = nvkit.demo.shaped(a.model or "qwen3-0.6b") if (cuda or a.model) else nvkit.demo.path()
    out_dir = a.out or tempfile.mkdtemp(prefix="nvkit-zero3-profile-")
    os.makedirs(out_dir, exist_ok=True)
    summary = []
    for variant in a.variants.split(","):
        run = nvkit.launch({"model": model, "data": DATA, "max_steps": a.steps, "batch_size": 8, "seq_len": 128,
                            "learning_rate": 1e-3}, nproc_per_node=1, strategy="zero3",
                           gpus=[0] if cuda else [], run_dir=os.path.join(out_dir, variant), start=False)
        out_file = os.path.join(out_dir, f"{variant}.json")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                os.path.abspath(__file__), "--rank", variant, run.run_dir, str(a.profile_step), out_file]
        env = {**run._env, "PYTHONPATH": os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
        t0 = time.monotonic()
        p = subprocess.run(argv, env=env, cwd=run.run_dir, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if p.returncode != 0 or not os.path.isfile(out_file):
            print(f"variant {variant!r} failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
            continue
        with open(out_file, encoding="utf-8") as f:
            res = json.load(f)
        _print(res, a.profile_step)
        rate = _rate(res.get("step_s", []), {1, a.profile_step, a.profile_step + 1})
        summary.append((variant, rate, wall))
    print("\n===== ZeRO-3 on one process, steps/s (first and profiled steps left out) and the run's wall time")
    for variant, rate, wall in summary:
        print(f"  {variant:<8} {rate:6.2f} steps/s   wall {wall:6.1f} s" if rate else f"  {variant:<8} n/a")
    print(f"results: {out_dir}")


if __name__ == "__main__":
    main()
