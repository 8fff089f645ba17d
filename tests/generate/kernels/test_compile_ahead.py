"""The rows steps' kernels compiled ahead (``fast.compile_ahead``) are the ones a real prefill and
decode step launch, with the same specialisation: every launch of a real eager prefill (and, for
heads of a power-of-two size, of a real decode step on the paged attention) with nvkit's kernels
(Triton's interpreter on the CPU, in a child process: TRITON_INTERPRET=1 must be set before triton
is imported) has a compile ahead for the same kernel whose arguments Triton would specialise alike
(a tensor's dtype and 16-byte alignment, an integer's value class 1 / multiple of 16 / other unless
the kernel does not specialise it, constexprs and launch options equal). The compile ahead itself
launches nothing and holds no weights. The GPU side (nothing compiled inside the first list after
the thread is done) is tests/gpu/test_fast_session_gpu.py."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402

SPEC = """
import torch
from triton.runtime.interpreter import InterpretedFunction
calls = []
real_run = InterpretedFunction.run

def spec(fn, args, kwargs):
    skip = set(fn.kwargs.get("do_not_specialize") or ())
    out = []
    for name, a in zip(fn.arg_names, args):
        if hasattr(a, "data_ptr") and hasattr(a, "dtype"):
            out.append((name, str(a.dtype), a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None:
            out.append((name, a))
        elif isinstance(a, int):
            out.append((name, "int" if name in skip else "1" if a == 1 else "D" if a % 16 == 0 else "i"))
        elif isinstance(a, float):
            out.append((name, "float"))
        else:
            out.append((name, a))
    return (fn.__name__, tuple(out), tuple(sorted((k, str(v)) for k, v in kwargs.items())))

def run(self, *args, grid, warmup, **kwargs):
    calls.append((warmup, spec(self, args, kwargs)))
    return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)
InterpretedFunction.run = run
"""


def test_the_kernels_compiled_ahead_are_those_a_real_prefill_and_decode_step_launch_on_six_families():
    """Llama's layout (the demo model), Gemma 3's (norms after each branch, GELU, sliding layers),
    OLMo 2's (norms over all heads, rounded weight first), Granite's (residual multiplier), Qwen3's
    (per-head q/k norms in ``prefill_rope``) and Phi-3's (partial rotary; heads of 24): the real
    prefill's launches are all among the compiles ahead, which launched nothing."""
    out = _interpret(SPEC + """
import nvkit
from tests import demo_model
from nvkit.generate.fast import compile_ahead
from nvkit.generate.fast.fused_weights import FusedWeights
from nvkit.generate.fast.llama_rows_step import decode_rows_step, paged_positions, prefill_rows_step
from nvkit.generate.fast.paged_cache import PAGE
from nvkit.generate.kernels import warm
from tests.generate.test_families_step import tiny
page, pages = 16, 16

s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
models = (("demo", s.model), *((f, tiny(f)) for f in ("Gemma3Text", "Olmo2", "Granite", "Qwen3", "Phi3")),
          ("Phi3/24", tiny("Phi3", hidden_size=96)))
for name, model in models:
    fw = FusedWeights(model)
    plan = compile_ahead.plan(fw)
    assert all(t.device.type == "meta" for args in plan.layers for t in args if isinstance(t, torch.Tensor)), name
    assert 1 <= len(plan.layers) <= 2, (name, len(plan.layers))  # Gemma 3: sliding and full layers
    calls.clear()
    names = plan.run()
    ahead = {c for warmup, c in calls if warmup}
    assert names and all(warmup for warmup, _ in calls), (name, names)  # compiles only, no launch
    assert not warm.errors, warm.errors
    calls.clear()
    g = torch.Generator().manual_seed(1)
    rows, length = 2, 16
    with torch.inference_mode():
        table = (torch.randperm(pages - 1, generator=g)[:rows] + 1).view(rows, 1).to(torch.int32)
        where = paged_positions(table, page, length)
        ids = torch.randint(1, 100, (rows, length), generator=g)
        cos, sin = fw.rotary(length)
        keys = [torch.zeros(pages * page, fw.nkv, fw.hd) for _ in fw.layers]
        values = [torch.zeros(pages * page, fw.nkv, fw.hd) for _ in fw.layers]
        prefill_rows_step(fw, kernels=True)(ids, torch.tensor([15, 9]), where, cos, sin, keys, values)
    launched = {c for warmup, c in calls if not warmup}
    assert launched and not (launched - ahead), (name, launched - ahead)
    print(name, len(plan.layers), sorted(set(names)))
    if fw.hd & (fw.hd - 1):
        continue  # the paged kernel takes power-of-two heads only (its rows step attends by matmul)
    # the rows decode step's layer, paged attention and all, for page tables `width` wide
    width = 16
    plan = compile_ahead.plan(fw, width)
    calls.clear()
    names = plan.run()
    ahead = {c for warmup, c in calls if warmup}
    assert all(warmup for warmup, _ in calls) and not warm.errors, (name, warm.errors)
    calls.clear()
    with torch.inference_mode():
        cos, sin = fw.rotary(width * PAGE)
        keys = [torch.zeros(4 * PAGE, fw.nkv, fw.hd) for _ in fw.layers]
        values = [torch.zeros(4 * PAGE, fw.nkv, fw.hd) for _ in fw.layers]
        table = torch.zeros((rows, width), dtype=torch.int32)
        table[0, :2], table[1, 0] = torch.tensor([1, 2], dtype=torch.int32), 3
        decode_rows_step(fw, "paged", PAGE, kernels=True)(torch.tensor([5, 7]), torch.tensor([40, 3]), table, cos, sin,
                                                          keys, values)
    launched = {c for warmup, c in calls if not warmup}
    assert {"_paged_rope_split_kernel", "merge_kernel"} <= {c[0] for c in launched}, (name, launched)
    assert not (launched - ahead), (name, launched - ahead)
    print(name, "decode", sorted(set(names)))

# once per process and shape: a second start for the same weights does nothing
fw = FusedWeights(s.model)
t = compile_ahead.start(fw)
assert t is not None and warm.ahead["rows step kernels"] is t
t.join(60)
assert "still compiling" not in warm.words()
assert compile_ahead.start(fw) is None and compile_ahead.start(FusedWeights(s.model)) is None
assert any(k.startswith("rows step kernels") for k in warm.seconds), warm.seconds
print(warm.words())
print("OK")
""")
    print(out)
    assert out.strip().endswith("OK") and out.count("_kernel") >= 12, out


def test_compile_only_launches_nothing_and_says_what_it_compiled():
    """Inside ``compile_only`` a kernel wrapper's launch on meta tensors (no memory behind them)
    compiles and returns; outside it the same wrapper runs the kernel; ``compile_only`` does not nest
    and is this thread's only."""
    out = _interpret(SPEC + """
import threading
from nvkit.generate.kernels.launch import compile_only
from nvkit.generate.kernels.silu_mul import silu_mul
from nvkit.generate.kernels.add_rms_norm import rms_norm
x = torch.empty((3, 64), device="meta")
with compile_only() as names:
    silu_mul(x)
    rms_norm(torch.empty((3, 32), device="meta"), torch.empty((32,), device="meta"), 1e-6)
    seen = []
    other = threading.Thread(target=lambda: seen.append(silu_mul(torch.ones(2, 8))))
    other.start(); other.join()
    try:
        with compile_only():
            pass
        raise AssertionError("compile_only nested")
    except RuntimeError as e:
        print("refused:", e)
assert names == ["_silu_mul_kernel", "_add_rms_norm_kernel"], names
assert [w for w, _ in calls] == [True, True, False], calls  # the other thread launched its own
assert torch.allclose(seen[0], torch.nn.functional.silu(torch.ones(2, 4)))
y = silu_mul(torch.ones(2, 8))  # after it: launched again
assert calls[-1][0] is False and torch.allclose(y, seen[0])
print("OK")
""")
    assert out.strip().endswith("OK") and "refused:" in out, out
