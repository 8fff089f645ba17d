"""On the GPU: does the measured compile policy keep a session at the faster step? One shape per
process (python scripts/compile_policy_check.py SHAPE [NEW_TOKENS]), bf16, random weights of the
exact published shape, one 64-token prompt, alternating rounds in one process of:

- "uncompiled": the uncompiled step (``compile=False``), what a session runs before any compile;
- "compiled": the compiled step kept unmeasured (``policy.measure=False``: the step a session ran
  before the policy measured, whatever its speed);
- "session": the session's default decoder after ``fast.prepare`` — compiled, measured against the
  uncompiled graph, the faster kept.

Prints each variant's median decode rate and the session's stats line, and exits 1 when the
session runs more than 3 % slower than the faster of the other two."""

from __future__ import annotations

import statistics
import sys
import time


def main() -> int:
    shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3-4b"
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    import torch

    import nvkit
    from nvkit import demo
    from nvkit.generate import fast
    t = time.perf_counter()
    s = nvkit.load(demo.shaped(shape), dtype="bfloat16")
    print(f"{shape}: loaded in {time.perf_counter() - t:.0f} s on {s.device}", flush=True)
    prompt = "NVIDIA GPUs " * 32
    ids = s.tokenizer(prompt, return_tensors="pt")["input_ids"][:, :64].to(s.device)
    sampling, _ = fast.resolve(s.model, dict(max_new_tokens=new, do_sample=False, eos_token_id=10 ** 7))
    decoders = {}
    t = time.perf_counter()
    decoders["uncompiled"] = fast.FastDecoder(s.model, compile=False)
    compiled = fast.FastDecoder(s.model, compile_after=0)
    compiled.policy.measure = False
    decoders["compiled"] = compiled
    session = fast.decoder(s)
    fast.prepare(s, max_new_tokens=new, prompt_tokens=64)
    decoders["session"] = session
    with torch.inference_mode():
        for d in decoders.values():  # capture (and compile) untimed
            d.generate(ids, sampling)
    print(f"prepared in {time.perf_counter() - t:.0f} s; session: {session.describe()}", flush=True)
    rates = {k: [] for k in decoders}
    with torch.inference_mode():
        for r in range(5):
            for name in (decoders if r % 2 == 0 else reversed(list(decoders))):
                d = decoders[name]
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = d.generate(ids, sampling)
                torch.cuda.synchronize()
                seconds = time.perf_counter() - t
                assert len(out) == new, (name, len(out))
                rates[name].append(new / seconds)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in med.items():
        print(f"RESULT {shape} {k:10s} {v:8.1f} tok/s (whole request, {new} new tokens, median of 5)", flush=True)
    best = max(med["uncompiled"], med["compiled"])
    ok = med["session"] >= 0.97 * best
    print(f"VERDICT {shape}: session {med['session']:.1f} vs best other {best:.1f} tok/s -> "
          f"{'ok' if ok else 'SLOWER'}; {session.describe()}", flush=True)
    for d in decoders.values():
        d.release()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
