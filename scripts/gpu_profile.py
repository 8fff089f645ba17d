"""Where the GPU time goes, for the next change to aim at (a developer's tool; `bash
scripts/gpu_session.sh profile` runs it on the GPU machine):

- ``batched``: 64 mixed prompts × 128 new tokens on the batched fast path (Qwen3-0.6B shape):
  the whole call's wall time, first progress report and decode rate after it, then the CUDA
  kernels of the call (and of a prefill-only call) grouped by kind — GEMMs, nvkit's attention,
  inductor's fused kernels, other — with their share of the wall time; then the call's time with
  a prefill budget of 4,096 against 16,384 padded prompt tokens per forward (fewer, larger
  forwards launch fewer kernels).
- ``deterministic``: 40 mixed prompts × 96 new tokens (Qwen3-0.6B shape) on the default rows path
  and with ``deterministic=True`` (the batch-invariant kernels): each call's wall time, first
  progress report and decode rate after it, then the kernels of the whole call and of a
  prefill-only call, by kind, for where the batch-invariant path's cost lies.
- ``lora``: 12 steps of 8 × 512 on the Qwen3-0.6B shape, plain PEFT + Trainer against
  ``nvkit.finetune(compile=False)`` with and without Liger: wall time per step, GPU kernel time
  per step and kernel launches per step (a step whose kernels take far less than its wall time is
  held up by the host), and the top kernels of each.

- ``prepare``: where the batch-1 fast path's preparation goes (``nvkit.fast.prepare``), in three
  fresh processes: cold (every cache empty), warm as the session benchmark's warm phase (nvkit's
  compile artifacts from the cold one, torch's and Triton's caches empty) and warm with Triton's
  cache kept too (a restarted kernel on the same machine); the top functions by cumulative time.

- ``variants``: the batch-1 fast path's cold preparation (every cache empty, a fresh process
  each) and its decode rate afterwards, for the defaults and the settings named in
  ``NVKIT_VARIANTS`` ("default;tune=False;NVKIT_FAST_COMPILE=0": ``NVKIT_FAST_*`` variables, or
  ``StepVariant`` fields such as tune, pdl, regional), with torch's compile times by phase.

Usage: python scripts/gpu_profile.py batched|deterministic|lora|prepare|variants|all [--model qwen3-0.6b]. On a machine without
CUDA it runs the ``lora`` part on the demo model (CPU ops only), to check the script itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

import nvkit
from nvkit.benchmarks.decode_profile import kind as _kind
from nvkit.benchmarks.lora import loop_rows
from nvkit.demo import shaped

CUDA = torch.cuda.is_available()


def _kernels(prof) -> list[tuple[str, float, int]]:
    """(name, device µs, calls) of every kernel the profile saw, largest first."""
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us and e.device_type is not None and "CUDA" in str(e.device_type):
            rows.append((e.key, float(us), int(e.count)))
    if not rows:  # an older profiler that files kernels under CPU-side events
        for e in prof.key_averages():
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
            if us:
                rows.append((e.key, float(us), int(e.count)))
    return sorted(rows, key=lambda r: -r[1])


def _report(title: str, prof, wall_s: float, per: int = 1, top: int = 12) -> dict:
    ks = _kernels(prof)
    total_us = sum(r[1] for r in ks)
    launches = sum(r[2] for r in ks)
    print(f"\n--- {title}: wall {wall_s * 1000 / per:.2f} ms{' per step' if per > 1 else ''}, "
          f"GPU kernels {total_us / 1000 / per:.2f} ms ({100 * total_us / 1e6 / wall_s:.0f} % of wall), "
          f"{launches / per:.0f} kernel launches{' per step' if per > 1 else ''}")
    if not ks:
        print("    (the profiler recorded no CUDA kernels" + (": no CUDA here)" if not CUDA else ")"))
        return {"wall_s": wall_s, "kernel_s": 0.0, "launches": 0}
    kinds: dict = {}
    for name, us, n in ks:
        k = kinds.setdefault(_kind(name), [0.0, 0])
        k[0] += us
        k[1] += n
    for kind, (us, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"    {kind:24s} {us / 1000 / per:9.3f} ms  {n / per:8.0f} launches  {100 * us / total_us:5.1f} %")
    print("    top kernels:")
    for name, us, n in ks[:top]:
        print(f"      {us / 1000 / per:9.3f} ms {n / per:7.0f}×  {name[:110]}")
    return {"wall_s": wall_s, "kernel_s": total_us / 1e6, "launches": launches}


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _activities():
    # CUDA only where there is CUDA: recording every CPU op would slow the host, and whether the
    # host holds the GPU up is what the comparison asks
    return [ProfilerActivity.CUDA] if CUDA else [ProfilerActivity.CPU]


def batched(model: str) -> None:
    if not CUDA:
        print("batched: needs CUDA (the batched fast path replays CUDA graphs); skipped")
        return
    from nvkit.benchmarks.decode import mixed_prompts
    s = nvkit.load(shaped(model), device_map="cuda", dtype="bfloat16")
    try:
        prompts = mixed_prompts(s.tokenizer, 64, seed=0)
        gen = dict(max_new_tokens=128, min_new_tokens=128)
        t = time.perf_counter()
        s.generate(prompts, **gen)
        print(f"warm-up (compile, capture): {time.perf_counter() - t:.1f} s · {s.last_stats.how}")
        _timed(s, prompts, **gen)
        _profiled(s, "64 prompts × 128, the whole call", prompts, **gen)
        _profiled(s, "64 prompts × 1 (prefill and one replay)", prompts, max_new_tokens=1)
        prefill_budgets(s, prompts)
    finally:
        s.unload()


def _timed(s, prompts, **gen) -> None:
    """One call, timed: wall, first progress report and the decode rate after it."""
    marks = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    s.generate(prompts, on_progress=lambda st: marks.append((time.perf_counter(), st.new_tokens)), **gen)
    wall = time.perf_counter() - t0
    st = s.last_stats
    (first_t, first_n), (last_t, last_n) = (marks[0], marks[-1]) if marks else ((t0, 0), (t0, 0))
    rate = (last_n - first_n) / (last_t - first_t) if last_t > first_t else float("nan")
    print(f"timed call: {st.new_tokens} tokens in {wall:.3f} s = {st.new_tokens / wall:,.0f} tok/s · first progress "
          f"{1000 * (first_t - t0):.0f} ms ({first_n} tokens) · after it {rate:,.0f} tok/s · {st.how}")


def _profiled(s, label: str, prompts, **gen) -> None:
    """One call under the profiler: its kernels by kind."""
    torch.cuda.synchronize()
    with profile(activities=_activities()) as prof:
        t = time.perf_counter()
        s.generate(prompts, **gen)
        torch.cuda.synchronize()
        w = time.perf_counter() - t
    _report(label, prof, w)


def deterministic(model: str, n: int = 40, new: int = 96) -> None:
    if not CUDA:
        print("deterministic: needs CUDA (the batch-invariant kernels run on the rows graphs); skipped")
        return
    from nvkit.benchmarks.decode import mixed_prompts
    s = nvkit.load(shaped(model), device_map="cuda", dtype="bfloat16")
    try:
        prompts = mixed_prompts(s.tokenizer, n, seed=1, lo=8, hi=200)
        gen = dict(max_new_tokens=new, min_new_tokens=new)
        for det in (False, True):
            print(f"\n===== deterministic={det}")
            t = time.perf_counter()
            s.generate(prompts, deterministic=det, **gen)
            print(f"warm-up (capture, Triton's kernels): {time.perf_counter() - t:.1f} s · {s.last_stats.how}")
            _timed(s, prompts, deterministic=det, **gen)
            _profiled(s, f"{n} prompts × {new}, the whole call", prompts, deterministic=det, **gen)
            _profiled(s, f"{n} prompts × 1 (prefill and one replay)", prompts, deterministic=det, max_new_tokens=1)
    finally:
        s.unload()


def prefill_budgets(s, prompts, budgets=(4096, 16384)) -> None:
    """The batched decoder's prefill budget (padded prompt tokens per forward): fewer, larger
    forwards launch fewer kernels; the table says whether the prefill waits on the host."""
    import nvkit.generate.fast as fast
    from nvkit.generate.fast.rows import BatchedDecoder
    ids = [s.tokenizer(p)["input_ids"] for p in prompts]
    print("\n--- prefill budget: 64 prompts, median of 3 calls after a warm-up")
    for budget in budgets:
        bd = BatchedDecoder(fast.decoder(s), prefill_tokens=budget)
        try:
            for new in (1, 128):
                sampling, why = fast.resolve(s.model, dict(max_new_tokens=new, min_new_tokens=new, do_sample=False))
                assert why is None, why
                with torch.inference_mode():
                    bd.generate(ids, sampling)  # compile (once per process), capture, pool
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    times = []
                    for _ in range(3):
                        t = time.perf_counter()
                        bd.generate(ids, sampling)
                        torch.cuda.synchronize()
                        times.append(time.perf_counter() - t)
                peak = torch.cuda.max_memory_allocated() / 2**30
                wall = statistics.median(times)
                print(f"    budget {budget:6d} · {new:3d} new: {1000 * wall:8.1f} ms ({64 * new / wall:,.0f} tok/s) · "
                      f"peak {peak:.2f} GiB")
        finally:
            bd.release()


def lora(model: str, steps: int = 12, batch: int = 8, seq_len: int = 512) -> None:
    from nvkit.model.precision import precision
    from nvkit.train import data as train_data
    from nvkit.train.finetune import finetune, prepare_lora_model, quiet_trainer, trainer_class, training_arguments
    if not CUDA:
        model, batch, seq_len = "demo", 2, 64
    s = nvkit.load(shaped(model) if model != "demo" else "demo", device_map="cuda" if CUDA else "cpu")
    lora_cfg = dict(r=16, alpha=32, dropout=0.05, target_modules="all-linear")
    text, rows = loop_rows(s.tokenizer, seq_len, batch * steps)
    dev = "cuda" if CUDA else "cpu"
    cap = torch.cuda.get_device_capability() if CUDA else None
    results = {}
    try:
        for variant in ("plain PEFT + Trainer", "nvkit compile=False", "nvkit compile=False liger=False"):
            walls = []
            for profiled in (False, True):  # the wall time unprofiled, then the kernels
                if s.info["adapters"]:
                    s.unload_adapter()
                with tempfile.TemporaryDirectory(prefix="nvkit-profile-") as d, \
                        (profile(activities=_activities()) if profiled else _Nothing()) as prof:
                    if CUDA:
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    if variant.startswith("plain"):
                        m, _, _ = prepare_lora_model(s.model, lora_cfg, False)
                        args = training_arguments(d, precision(dev, cap), dev, max_steps=steps, epochs=None,
                                                  learning_rate=2e-4, batch_size=batch, grad_accum=1, log_every=1,
                                                  seed=0, gradient_checkpointing=False, fused_adamw=False)
                        tr = trainer_class()(model=m, args=args, train_dataset=train_data.ListDataset(rows),
                                             data_collator=train_data.Collator(s.tokenizer.pad_token_id or 0),
                                             fused_loss=False)
                        quiet_trainer(tr)
                        tr.train()
                        s.model = m.unload()
                        s.model.eval()
                        step_times = []
                        info = "model's own loss, adamw_torch"
                    else:
                        kw = dict(liger=False) if "liger=False" in variant else {}
                        run = finetune(s, [text] * (batch * steps), lora=lora_cfg, max_steps=steps, batch_size=batch,
                                       seq_len=seq_len, packing=True, output_dir=d, compile=False, **kw)
                        run.result()
                        ts = [r["t"] for r in run.history if isinstance(r.get("t"), (int, float))]
                        step_times = [b - a for a, b in zip(ts, ts[1:])][3:]
                        info = f"liger {run.info.get('liger')} · loss {run.info.get('loss', '?')}"
                    if CUDA:
                        torch.cuda.synchronize()
                    walls.append(time.perf_counter() - t)
                if not profiled and step_times:
                    print(f"\n{variant}: unprofiled wall {walls[0]:.2f} s for {steps} steps; step wall from the run's "
                          f"history (steps 4 on): median {1000 * statistics.median(step_times):.1f} ms")
            r = _report(f"{variant} ({info}), {steps} steps, profiled", prof, walls[1], per=steps)
            r["wall_s"] = walls[0]
            print(f"    unprofiled wall {walls[0] * 1000 / steps:.1f} ms per step (setup included)")
            results[variant] = r
    finally:
        s.unload()
    base = results.get("plain PEFT + Trainer")
    if base and base["launches"]:
        for v, r in results.items():
            print(f"{v:36s} wall ×{r['wall_s'] / base['wall_s']:.2f} · launches ×{r['launches'] / base['launches']:.2f}"
                  f" · kernel time ×{(r['kernel_s'] / base['kernel_s']) if base['kernel_s'] else float('nan'):.2f}")


_PREPARE = """
import cProfile, pstats, sys, time, nvkit
from nvkit.generate import fast
from nvkit.demo import shaped
s = nvkit.load(shaped(sys.argv[1]), device_map="cuda", dtype="bfloat16")
prof = cProfile.Profile()
t = time.perf_counter()
prof.enable()
fast.prepare(s)
prof.disable()
print(f"PREPARE {time.perf_counter() - t:.2f} s; {fast.decoder(s).describe()}")
st = pstats.Stats(prof)
st.sort_stats("cumulative").print_stats(45)
st.sort_stats("tottime").print_stats(20)
"""


def prepare(model: str) -> None:
    import os
    import subprocess
    root = tempfile.mkdtemp(prefix="nvkit-prepare-")
    # (process, its Triton cache, its inductor cache): only nvkit's artifacts are shared, but the third
    # process also keeps the cold one's Triton cache
    for name, triton, inductor in (("cold", "cold", "cold"), ("warm", "warm", "warm"),
                                   ("warm, Triton's cache kept", "cold", "kept")):
        env = dict(os.environ, NVKIT_CACHE=os.path.join(root, "nvkit"), TRITON_CACHE_DIR=os.path.join(root, f"triton-{triton}"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(root, f"inductor-{inductor}"))
        print(f"\n##### prepare: {name}", flush=True)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", _PREPARE, model], env=env, check=False)
        print(f"##### {name}: process {time.perf_counter() - t:.1f} s", flush=True)


_VARIANT = """
import sys, time, torch, nvkit
from nvkit.generate import fast
from nvkit.demo import shaped
import ast, os
s = nvkit.load(shaped(sys.argv[1]), device_map="cuda", dtype="bfloat16")
step = dict(p.split("=", 1) for p in os.environ.get("NVKIT_PROFILE_STEP", "").split(",") if "=" in p)
fast.decoder(s, **{k.strip(): ast.literal_eval(v.strip()) for k, v in step.items()})  # a StepVariant's fields
t = time.perf_counter()
fast.prepare(s)
d = fast.decoder(s)
print(f"PREPARE {time.perf_counter() - t:.2f} s; {d.describe()}; {d.timings.describe()}", flush=True)
for n in (256, 256, 1000, 40):
    t = time.perf_counter()
    ids = torch.randint(100, 1000, (1, 24), device="cuda")
    with torch.inference_mode():
        out = d.generate(ids, fast.resolve(s.model, dict(max_new_tokens=n))[0])
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    print(f"DECODE n={n}: {len(out)} tokens in {dt:.3f} s, {len(out) / dt:.0f} tok/s", flush=True)
try:
    from torch._dynamo.utils import compile_times
    print(compile_times(repr="str", aggregate=True))
except Exception as e:
    print("compile_times:", e)
"""


def variants(model: str) -> None:
    import os
    import subprocess
    names = os.environ.get("NVKIT_VARIANTS", "default;tune=False;NVKIT_FAST_COMPILE=0").split(";")
    for i, name in enumerate(names):
        root = tempfile.mkdtemp(prefix=f"nvkit-variant{i}-")
        env = dict(os.environ, NVKIT_CACHE=os.path.join(root, "nvkit"), TRITON_CACHE_DIR=os.path.join(root, "triton"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"))
        step = []
        for pair in name.split(","):
            if "=" in pair:
                k, v = pair.split("=", 1)
                if k.strip().startswith("NVKIT_"):
                    env[k.strip()] = v.strip()
                else:
                    step.append(f"{k.strip()}={v.strip()}")
        env["NVKIT_PROFILE_STEP"] = ",".join(step)
        print(f"\n##### variant: {name}", flush=True)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", _VARIANT, model], env=env, check=False)
        print(f"##### {name}: process {time.perf_counter() - t:.1f} s", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("batched", "deterministic", "lora", "prepare", "variants", "all"))
    p.add_argument("--model", default="qwen3-0.6b")
    a = p.parse_args(argv)
    print(f"torch {torch.__version__} · {torch.cuda.get_device_name() if CUDA else 'no CUDA'}")
    if a.part in ("batched", "all"):
        batched(a.model)
    if a.part in ("deterministic", "all"):
        deterministic(a.model)
    if a.part in ("lora", "all"):
        lora(a.model)
    if a.part in ("prepare", "all"):
        prepare(a.model)
    if a.part == "variants":
        variants(a.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
