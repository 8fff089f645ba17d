"""nvkit's batch-1 decode attention (``nvkit.generate.kernels.decode_attention``: the split-K kernel
over a contiguous static cache and its variant with the q/k norms, RoPE and the cache write fused
in), run by Triton's interpreter on the CPU (TRITON_INTERPRET=1, which must be set before triton is
imported: hence a child process), against the references in plain torch: ``attend_rope_reference``,
built on ``attend_reference`` and ``rope_reference`` (in ``nvkit.benchmarks.attention``, whose
benchmarks check every launch shape against them too). The GPU run of the same kernels is
tests/gpu/test_fast_gpu.py and the "fast+split" decode benchmark."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

import contextlib  # noqa: E402

from nvkit.benchmarks.attention import attend_reference, rope_reference  # noqa: E402
from tests.triton_interpreter import interpret as _interpret  # noqa: E402


@contextlib.contextmanager
def recorded_loads(**tensors):
    """Inside Triton's interpreter (a child process with TRITON_INTERPRET=1): every load the kernels
    issue into one of ``tensors`` (contiguous), as a list that fills with (name, the flat indices
    of the elements its mask lets it read): a load whose mask keeps nothing is a step spent on
    nothing, which a masked-out block shows as where its elements' values cannot."""
    import numpy as np
    from triton.runtime import interpreter

    spans = {name: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), t.element_size())
             for name, t in tensors.items()}
    loads = []
    original = interpreter.InterpreterBuilder.create_masked_load

    def create_masked_load(self, ptrs, mask, *rest):
        at = ptrs.data.astype(np.int64)
        keep = np.broadcast_to(mask.data, at.shape)
        for name, (lo, hi, size) in spans.items():
            inside = (at >= lo) & (at < hi)
            kept = inside & keep
            # a load of this tensor: one that reads it, or reads nothing and points wholly into it
            # (a step spent on nothing); not another tensor's load whose masked-off lanes happen
            # to point here (a neighbour in memory: where the allocator put it decides)
            if kept.any() or (not keep.any() and inside.all()):
                loads.append((name, (at[kept] - lo) // size))
        return original(self, ptrs, mask, *rest)

    interpreter.InterpreterBuilder.create_masked_load = create_masked_load
    try:
        yield loads
    finally:
        interpreter.InterpreterBuilder.create_masked_load = original


def test_kernel_matches_reference_at_every_kind_of_position():
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        # (query heads, KV heads, head_dim, cache length, dtype): Qwen3-0.6B's layout, an odd group
        # (3 query heads per KV head, padded inside the kernel), no grouping, bf16
        for nh, nkv, hd, length, dtype in [(16, 8, 128, 512, torch.float32), (6, 2, 32, 256, torch.float32),
                                           (8, 8, 64, 256, torch.float32), (4, 2, 16, 256, torch.bfloat16)]:
            q, k, v = torch.randn(nh, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype)
            for p in (0, 1, 37, length // 2, length - 1):  # first slice only ... every slice full
                pos = torch.tensor(p)
                got = da.decode_attention(q, k, v, pos, hd ** -0.5)
                ref = attend_reference(q, k, v, pos, hd ** -0.5)
                tol = 1e-5 if dtype == torch.float32 else 3e-2  # bf16: a couple of ulps at |x| ~ 2-4
                err = (got.float() - ref.float()).abs().max().item()
                assert got.dtype == dtype and got.shape == (nh, hd)
                assert err <= tol, (nh, nkv, hd, length, p, err)
                # positions past pos must not matter (they hold whatever the cache had)
                k2, v2 = k.clone(), v.clone()
                k2[:, p + 1:] = 1e4
                v2[:, p + 1:] = float("nan")
                assert torch.equal(da.decode_attention(q, k2, v2, pos, hd ** -0.5), got)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_shape_checks():
    out = _interpret("""
        import torch
        from nvkit.generate.kernels import decode_attention as da
        ok = da.check_shapes(torch.zeros(16, 128), torch.zeros(8, 512, 128), torch.zeros(8, 512, 128))
        assert ok is None, ok
        assert "powers of two" in da.check_shapes(torch.zeros(4, 96), torch.zeros(2, 256, 96), torch.zeros(2, 256, 96))
        assert "cannot attend" in da.check_shapes(torch.zeros(5, 64), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64))
        assert da.splits_for(256) == 8 and da.splits_for(512) == 16
        # the op's launch by cache size: every row's a launch the kernel takes, the sizes rising
        assert [r[0] for r in da.LAUNCHES] == sorted({r[0] for r in da.LAUNCHES}) and da.LAUNCHES[0][0] == 0
        from nvkit.generate.kernels.common import launch_why
        for n in (32, 256, 1024, 4096, 8192, 16384, 65536):
            launch = da.default_launch(torch.zeros(2, n, 8))
            assert launch["dot"] is False  # a CPU cache (Triton's interpreter): the fp32 products
            assert set(launch) == {"splits", "blocks_per_step", "dot", "num_warps", "num_stages"}, launch
            assert launch_why(launch["num_stages"], launch["dot"], splits=launch["splits"],
                              blocks_per_step=launch["blocks_per_step"], num_warps=launch["num_warps"]) is None, launch
            assert launch["splits"] == da.splits_for(n) and (not launch["dot"] or n >= 16)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_fast_decoder_with_triton_attention_decodes_like_matmul():
    """The whole fused step with attention='triton-split' and 'triton-fused' (no CUDA graphs: the CPU
    checks the logic):
    the demo model's greedy tokens are the matmul path's, logits within bf16 rounding."""
    out = _interpret("""
        import torch, nvkit
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import nvkit.generate.fast as fast
        m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
        tok = AutoTokenizer.from_pretrained(nvkit.demo.path())
        ids = tok("NVIDIA GPUs are", return_tensors="pt")["input_ids"]
        sampling, _ = fast.resolve(m, dict(max_new_tokens=12, do_sample=False, eos_token_id=10 ** 7))
        with torch.inference_mode():
            ref = fast.FastDecoder(m, k_steps=4, graphs=False)
            a, ref_logits = ref.trace(ids, sampling)
            for kind in ("triton-split", "triton-fused"):
                tri = fast.FastDecoder(m, k_steps=4, graphs=False, attention=kind)
                b, lb = tri.trace(ids, sampling)
                assert a == b, (kind, a, b)
                la, lb = torch.stack(ref_logits), torch.stack(lb)
                diff, scale = (la - lb).abs().max().item(), la.abs().max().item()
                # the demo weights are bf16: the matmul path rounds the probabilities (and q after
                # its norm and RoPE) to bf16, the kernels keep them in fp32, so the logits differ by
                # bf16 rounding of the attention output
                assert m.dtype == torch.bfloat16 and diff <= 0.01 * scale, (kind, diff, scale)
                print(kind, diff)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_the_op_traces_whole_under_torch_compile():
    """The fused step is compiled with fullgraph=True: the op must trace (through its fake) without
    a graph break, read the cache as written just before it, and give the eager result."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        q, k, v = torch.randn(16, 128), torch.randn(8, 512, 128), torch.randn(8, 512, 128)
        new_k = torch.randn(8, 1, 128)

        def step(q, k, v, pos, new_k):
            k.index_copy_(1, pos.view(1), new_k)  # like the step: write the new key, then attend
            return da.decode_attention(q, k, v, pos, 0.125) * 2

        pos = torch.tensor(37)
        want = step(q, k.clone(), v, pos, new_k)
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k.clone(), v, pos, new_k)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        ref = attend_reference(q, k.index_copy(1, pos.view(1), new_k), v, pos, 0.125) * 2
        assert torch.allclose(got, ref, atol=1e-5)
        print("ok")
    """)
    assert out.strip().endswith("ok")



def test_the_load_recorder_names_a_load_by_what_it_reads_not_by_its_neighbours():
    """``recorded_loads``: a load of one tensor whose masked-off lanes point into the tensor beside
    it in memory is not that neighbour's load (where the allocator puts tensors decided this, and a
    test counting a kernel's loads failed on one machine in one run); a load that reads nothing and
    points wholly into a tensor is that tensor's (a step spent on nothing)."""
    out = _interpret("""
        import torch
        import triton
        import triton.language as tl
        from tests.generate.kernels.test_decode_attention import recorded_loads

        @triton.jit
        def copy(X, Y, n, start, BLOCK: tl.constexpr):
            at = start + tl.arange(0, BLOCK)
            tl.store(Y + tl.arange(0, BLOCK), tl.load(X + at, mask=at < n, other=0.0))

        base = torch.arange(200, dtype=torch.float32)
        a, b = base[:100], base[100:]  # b right after a in memory
        y = torch.empty(128)
        with recorded_loads(a=a, b=b) as loads:
            copy[(1,)](a, y, 100, 0, BLOCK=128)   # reads a; lanes 100-127, masked off, point into b
            copy[(1,)](b, y, 0, 0, BLOCK=64)      # reads nothing, points wholly into b
        names = [(n, len(at)) for n, at in loads]
        assert names == [("a", 100), ("b", 0)], names
        print("ok")
    """)
    assert out.strip().endswith("ok"), out


def token_inputs(nh: int, nkv: int, hd: int, rot: int, length: int, dtype, norm: bool):
    """Random inputs of the batch-1 kernels, drawn from torch's global generator: one token's
    stacked q/k/v, the q/k norm weights (None without ``norm``), rotary cos/sin of ``rot`` values
    (rot < hd: partial rotary) and a cache of ``length`` keys and values."""
    import torch
    qkv = torch.randn(nh + 2 * nkv, hd, dtype=dtype)
    qw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
    kw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
    ang = torch.randn(rot // 2).repeat(2)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    k, v = torch.randn(nkv, length, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype)
    return qkv, qw, kw, cos, sin, k, v

def test_rope_kernel_norms_rotates_writes_the_cache_and_attends():
    """decode_attention_rope against plain torch: q/k RMS norm (or none), RoPE, the new key and
    value written at pos (nothing else in the cache touched), attention over 0..pos."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_rope_reference
        from tests.generate.kernels.test_decode_attention import token_inputs
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        for nh, nkv, hd, length, dtype, norm in [(16, 8, 128, 512, torch.float32, True),
                                                 (6, 2, 32, 256, torch.float32, False),
                                                 (4, 2, 16, 256, torch.bfloat16, True)]:
            for p in (0, 1, 37, length - 1):
                qkv, qw, kw, cos, sin, k, v = token_inputs(nh, nkv, hd, hd, length, dtype, norm)
                k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
                k1[:, p + 1:] = 1e4
                v1[:, p + 1:] = float("nan")  # past pos: whatever the cache held, never read
                pos = torch.tensor(p)
                got = da.decode_attention_rope(qkv, qw, kw, cos, sin, k1, v1, pos, hd ** -0.5, 1e-6)
                ref = attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, pos, hd ** -0.5, 1e-6)
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                assert got.shape == (nh, hd) and got.dtype == dtype
                err = (got.float() - ref.float()).abs().max().item()
                kerr = (k1[:, p].float() - k2[:, p].float()).abs().max().item()
                assert err <= tol and kerr <= tol, (nh, p, err, kerr)
                assert torch.equal(v1[:, :p + 1], v2[:, :p + 1])
                assert torch.equal(k1[:, :p], k[:, :p]) and (k1[:, p + 1:] == 1e4).all()
        bad = torch.zeros(20, 64)
        for args, why in [((bad, None, None, torch.zeros(64), torch.zeros(64), torch.zeros(2, 256, 32), torch.zeros(2, 256, 32)), "cannot attend"),
                          ((bad, None, None, torch.zeros(128), torch.zeros(128), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64)), "cos and sin"),
                          ((bad, torch.ones(64), None, torch.zeros(64), torch.zeros(64), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64)), "both norm weights")]:
            try:
                da.decode_attention_rope(*args, torch.tensor(0), 0.1, 1e-6)
            except ValueError as e:
                assert why in str(e), e
            else:
                raise AssertionError(why)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_rope_op_compiles_in_place_on_the_cache():
    """Under torch.compile (inductor, on the CPU here) the op that writes the cache is called on the
    cache itself: no copy of a cache-sized buffer per step, and the cache ends as in eager."""
    out = _interpret("""
        import re
        import torch
        from torch._inductor.utils import run_and_get_code
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        nh, nkv, hd, L = 16, 8, 128, 256
        cache_k, cache_v = torch.zeros(1, nkv, L, hd), torch.zeros(1, nkv, L, hd)
        w = torch.randn((nh + 2 * nkv) * hd, 64) * 0.1
        qw, kw = torch.rand(hd) + 0.5, torch.rand(hd) + 0.5
        ang = torch.randn(hd // 2).repeat(2)
        cos, sin = ang.cos(), ang.sin()
        pos = torch.tensor(0)

        def step(x):  # like nvkit.fast's fused step: projection, the op on the cache, advance pos
            qkv = (w @ x).view(nh + 2 * nkv, hd)
            o = da.decode_attention_rope(qkv, qw, kw, cos, sin, cache_k[0], cache_v[0], pos, 0.1, 1e-6)
            pos.add_(1)
            return o.sum(0) * 2

        f = torch.compile(step, fullgraph=True)
        xs = [torch.randn(64) for _ in range(5)]
        first, codes = run_and_get_code(f, xs[0])
        outs = [first] + [f(x) for x in xs[1:]]
        got_k, got_v = cache_k.clone(), cache_v.clone()
        code = "\\n".join(codes)
        assert "decode_attention_rope" in code
        # a copy would show as a new cache-sized buffer (or a clone) in the generated code
        assert not re.search(rf"empty_strided_\\w+\\(\\((1, )?{nkv}, {L}, {hd}\\)|clone", code), code
        cache_k.zero_(); cache_v.zero_(); pos.zero_()
        ref = [step(x) for x in xs]
        assert int(pos) == 5 and (cache_k[0, :, 5:] == 0).all() and (got_k[0, :, 5:] == 0).all()
        assert torch.allclose(got_k, cache_k, atol=1e-5) and torch.allclose(got_v, cache_v, atol=1e-5)
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(outs, ref))
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_window_and_softcap_match_reference():
    """Gemma 2/3's sliding window and logit soft-capping against ``attend_reference``: windows
    inside one block, of one block, across several blocks and slices, wider than pos (no window),
    of 1 (the current position alone); soft-capping alone and with a window, also on scores large
    enough that a naive tanh would overflow. What lies below the window is never read: NaN there
    changes no bit."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        # the cache of 256 gives 8 slices of 32-position blocks
        for nh, nkv, hd, length, dtype in [(6, 2, 32, 256, torch.float32), (4, 2, 16, 256, torch.bfloat16)]:
            q = torch.randn(nh, hd, dtype=dtype)
            k, v = torch.randn(nkv, length, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype)
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            for p in (0, 3, 40, 200, length - 1):
                for window, softcap in [(1, 0.0), (5, 0.0), (32, 0.0), (33, 0.0), (100, 0.0), (300, 0.0),
                                        (0, 2.0), (5, 2.0), (100, 2.0), (0, 50.0)]:
                    pos = torch.tensor(p)
                    got = da.decode_attention(q, k, v, pos, hd ** -0.5, window, softcap)
                    ref = attend_reference(q, k, v, pos, hd ** -0.5, window, softcap)
                    err = (got.float() - ref.float()).abs().max().item()
                    assert got.dtype == dtype and err <= tol, (nh, p, window, softcap, err)
                    lo = max(0, p - window + 1) if window else 0
                    if window >= 300:  # wider than every position: no window at all
                        assert torch.equal(got, da.decode_attention(q, k, v, pos, hd ** -0.5, 0, softcap))
                    if window == 1:  # the current position alone: its value
                        assert torch.allclose(got.float(), v[:, p].repeat_interleave(nh // nkv, 0).float(), atol=tol)
                    k2, v2 = k.clone(), v.clone()
                    k2[:, :lo], v2[:, :lo] = float("nan"), float("nan")
                    k2[:, p + 1:], v2[:, p + 1:] = float("nan"), float("nan")
                    again = da.decode_attention(q, k2, v2, pos, hd ** -0.5, window, softcap)
                    assert torch.equal(again, got), (p, window)
        # scores of |s| ~ 1e3 under a cap of 50: tanh saturates to +-1 without NaN
        q, k, v = torch.randn(4, 32) * 30, torch.randn(2, 64, 32) * 30, torch.randn(2, 64, 32)
        for window in (0, 10):
            got = da.decode_attention(q, k, v, torch.tensor(50), 1.0, window, 50.0)
            ref = attend_reference(q, k, v, torch.tensor(50), 1.0, window, 50.0)
            assert torch.isfinite(got).all() and (got - ref).abs().max() <= 1e-4, (got - ref).abs().max()
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_a_windowed_slice_loads_only_the_blocks_of_its_window():
    """Every load of the cache the kernels issue (recorded in Triton's interpreter) reads some
    position of the window and none outside it: the blocks wholly below the window cost no step,
    as many cache loads as blocks meet the window, for the plain and the fused op."""
    out = _interpret("""
        import torch
        from tests.generate.kernels.test_decode_attention import recorded_loads
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        nh, nkv, hd, length = 4, 2, 16, 512  # 16 slices of 32-position blocks
        block = da.BLOCK_L
        q = torch.randn(nh, hd)
        for p, window in ((300, 1), (300, 20), (300, 32), (300, 100), (300, 290), (40, 100), (511, 7), (300, 0)):
            lo = max(0, p - window + 1) if window else 0
            blocks = p // block - lo // block + 1
            for fused in (False, True):
                k, v = torch.randn(nkv, length, hd), torch.randn(nkv, length, hd)
                with recorded_loads(k=k, v=v) as loads:
                    if fused:
                        qkv = torch.randn(nh + 2 * nkv, hd)
                        ang = torch.randn(hd // 2).repeat(2)
                        da.decode_attention_rope(qkv, None, None, ang.cos(), ang.sin(), k, v, torch.tensor(p),
                                                 hd ** -0.5, 1e-6, window, 0.0)
                    else:
                        da.decode_attention(q, k, v, torch.tensor(p), hd ** -0.5, window)
                for name in ("k", "v"):
                    mine = [at for n, at in loads if n == name]
                    assert len(mine) == nkv * blocks, (p, window, fused, name, len(mine), nkv * blocks)
                    for at in mine:
                        positions = (at // hd) % length
                        assert len(at) and positions.min() >= lo and positions.max() <= p, (p, window, positions)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_rope_kernel_with_window_and_softcap():
    """decode_attention_rope with a window and soft-capping, with and without the q/k norms,
    against plain torch: the new key and value written at pos, attention over the window only
    (NaN below it changes nothing)."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_rope_reference
        from tests.generate.kernels.test_decode_attention import token_inputs
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        for nh, nkv, hd, length, dtype, norm in [(6, 2, 32, 256, torch.float32, True),
                                                 (6, 2, 32, 256, torch.float32, False),
                                                 (4, 2, 16, 256, torch.bfloat16, True)]:
            for p, window, softcap in [(0, 1, 0.0), (37, 1, 0.0), (37, 5, 0.0), (100, 32, 3.0), (200, 70, 0.0),
                                       (255, 130, 3.0), (20, 64, 0.0), (150, 0, 3.0)]:
                qkv, qw, kw, cos, sin, k, v = token_inputs(nh, nkv, hd, hd, length, dtype, norm)
                lo = max(0, p - window + 1) if window else 0
                k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
                k1[:, :lo], v1[:, :lo] = float("nan"), float("nan")  # below the window: never read
                k1[:, p + 1:], v1[:, p + 1:] = 1e4, float("nan")
                pos = torch.tensor(p)
                got = da.decode_attention_rope(qkv, qw, kw, cos, sin, k1, v1, pos, hd ** -0.5, 1e-6, window, softcap)
                ref = attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, pos, hd ** -0.5, 1e-6, window, softcap)
                tol = 1e-4 if dtype == torch.float32 else 3e-2
                err = (got.float() - ref.float()).abs().max().item()
                kerr = (k1[:, p].float() - k2[:, p].float()).abs().max().item()
                assert torch.isfinite(got).all() and err <= tol and kerr <= tol, (nh, p, window, softcap, err, kerr)
                assert torch.equal(v1[:, lo:p + 1], v2[:, lo:p + 1])
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_window_and_softcap_arguments_are_checked_and_trace():
    """A negative window and a soft cap that is not a finite number >= 0 are refused by both ops,
    saying which (a window that is no int the op's schema refuses before, and a bool it passes on
    as 0 or 1); the ops with a window and a cap trace whole under torch.compile (their fakes take
    the new arguments)."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_reference
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        q, k, v = torch.randn(4, 16), torch.randn(2, 64, 16), torch.randn(2, 64, 16)
        qkv = torch.randn(8, 16)
        cos, sin = torch.ones(16), torch.zeros(16)
        calls = {"nvkit::decode_attention": lambda **kw: da.decode_attention(q, k, v, torch.tensor(3), 0.25, **kw),
                 "nvkit::decode_attention_rope": lambda **kw: da.decode_attention_rope(
                     qkv, None, None, cos, sin, k, v, torch.tensor(3), 0.25, 1e-6, **kw)}
        for op, call in calls.items():
            for bad, why in [(dict(window=-1), "window must be a whole number >= 0"),
                             (dict(softcap=-1.0), "softcap must be a finite number >= 0"),
                             (dict(softcap=float("inf")), "softcap must be a finite number >= 0"),
                             (dict(softcap=float("nan")), "softcap must be a finite number >= 0")]:
                try:
                    call(**bad)
                except ValueError as e:
                    assert str(e).startswith(op + " " + why), e
                else:
                    raise AssertionError((op, bad))
            call(window=2 ** 40, softcap=7)  # a window past every position, a whole-number cap: fine

        def step(q, k, v, pos):
            return da.decode_attention(q, k, v, pos, 0.25, 9, 4.0) * 2

        got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, torch.tensor(30))
        assert torch.allclose(got, attend_reference(q, k, v, torch.tensor(30), 0.25, 9, 4.0) * 2, atol=1e-5)

        def rope_step(qkv, k, v, pos):
            return da.decode_attention_rope(qkv, None, None, cos, sin, k, v, pos, 0.25, 1e-6, 9, 4.0) * 2

        k1, k2 = k.clone(), k.clone()
        got = torch.compile(rope_step, fullgraph=True, backend="aot_eager")(qkv, k1, v.clone(), torch.tensor(30))
        want = rope_step(qkv, k2, v.clone(), torch.tensor(30))
        assert torch.allclose(got, want, atol=1e-5) and torch.equal(k1, k2)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_rope_reference_rotates_as_transformers_phi3_does():
    """``rope_reference`` (no norm) is transformers' ``apply_rotary_pos_emb`` of Phi-3, whose tables
    may be narrower than the head (``partial_rotary_factor``): the first r dims rotate, the rest
    pass; full-width tables are the plain rotate-half RoPE."""
    import torch
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    torch.manual_seed(0)
    for hd, rot in ((128, 96), (16, 8), (16, 16), (16, 2)):
        q, k = torch.randn(1, 4, 3, hd), torch.randn(1, 2, 3, hd)  # (batch, heads, positions, head_dim)
        ang = torch.randn(1, 3, rot // 2).repeat(1, 1, 2)
        cos, sin = ang.cos(), ang.sin()
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
        for x, want in ((q, want_q), (k, want_k)):
            got = rope_reference(x.transpose(1, 2), None, cos[:, :, None], sin[:, :, None], 1e-6).transpose(1, 2)
            assert torch.allclose(got, want, atol=1e-6), (hd, rot)
            assert torch.equal(got[..., rot:], x[..., rot:])


def test_rope_kernel_with_partial_rotary_tables():
    """decode_attention_rope with cos/sin of r < head_dim values (Phi-3/Phi-4-mini's partial
    rotary embedding: 96 of 128; 8 of 16; 2 of 16, the narrowest) and of the full head, with and
    without the q/k norms, fp32 and bf16, at several positions (the last with a window and a soft
    cap), against plain torch: the output,
    the new key in the cache (its rotated dims, and its pass dims as the norm left them: without
    norms the projected values bit for bit) and the value."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_rope_reference
        from tests.generate.kernels.test_decode_attention import token_inputs
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        for nh, nkv, hd, rot, dtype, norm in [(8, 2, 128, 96, torch.float32, True), (8, 2, 128, 96, torch.float32, False),
                                              (8, 2, 128, 96, torch.bfloat16, True),
                                              (4, 2, 16, 8, torch.float32, True), (4, 2, 16, 8, torch.float32, False),
                                              (4, 2, 16, 8, torch.bfloat16, True), (4, 2, 16, 8, torch.bfloat16, False),
                                              (4, 2, 16, 2, torch.float32, True), (4, 2, 16, 16, torch.float32, True),
                                              (4, 2, 16, 16, torch.bfloat16, False)]:
            length = 128
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            for p, window, softcap in ((0, 0, 0.0), (37, 0, 0.0), (length - 1, 20, 3.0)):
                qkv, qw, kw, cos, sin, k, v = token_inputs(nh, nkv, hd, rot, length, dtype, norm)
                k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
                k1[:, p + 1:], v1[:, p + 1:] = 1e4, float("nan")  # past pos: never read
                pos = torch.tensor(p)
                got = da.decode_attention_rope(qkv, qw, kw, cos, sin, k1, v1, pos, hd ** -0.5, 1e-6, window, softcap)
                ref = attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, pos, hd ** -0.5, 1e-6, window, softcap)
                err = (got.float() - ref.float()).abs().max().item()
                kerr = (k1[:, p].float() - k2[:, p].float()).abs().max().item()
                assert got.shape == (nh, hd) and got.dtype == dtype, (got.shape, got.dtype)
                assert err <= tol and kerr <= tol, (hd, rot, dtype, norm, p, err, kerr)
                new_k = qkv[nh:nh + nkv].float()
                if norm and rot < hd:  # the pass dims: normalised over the whole head, not rotated
                    new_k = new_k * torch.rsqrt(new_k.pow(2).mean(-1, keepdim=True) + 1e-6) * kw.float()
                    assert (k1[:, p, rot:].float() - new_k[:, rot:]).abs().max() <= tol, (hd, rot, p)
                elif not norm:
                    assert torch.equal(k1[:, p, rot:], qkv[nh:nh + nkv, rot:]), (hd, rot, p)
                assert torch.equal(v1[:, :p + 1], v2[:, :p + 1]) and torch.equal(k1[:, :p], k[:, :p])
            print(hd, rot, dtype, norm, "ok")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_rope_kernel_refuses_rotary_tables_that_do_not_fit():
    """cos/sin must be (r,) with r even, 2 <= r <= head_dim, the two alike: an odd width, one
    wider than the head, an empty one, a table of positions and unequal cos/sin are refused
    before any launch, saying the rule."""
    out = _interpret("""
        import torch
        from nvkit.generate.kernels import decode_attention as da
        qkv, k, v = torch.randn(8, 16), torch.randn(2, 64, 16), torch.randn(2, 64, 16)
        for cos, sin in [(torch.ones(7), torch.zeros(7)), (torch.ones(18), torch.zeros(18)),
                         (torch.ones(0), torch.zeros(0)), (torch.ones(4, 16), torch.zeros(4, 16)),
                         (torch.ones(8), torch.zeros(16))]:
            for qw in (None, torch.ones(16)):
                try:
                    da.decode_attention_rope(qkv, qw, qw, cos, sin, k, v, torch.tensor(3), 0.25, 1e-6)
                except ValueError as e:
                    assert str(e).startswith("nvkit::decode_attention_rope expects cos and sin of shape (r,), "
                                             "r even and at most 16, not "), e
                else:
                    raise AssertionError((cos.shape, sin.shape))
        for rot in (2, 8, 16):  # the widths that fit
            ang = torch.randn(rot // 2).repeat(2)
            da.decode_attention_rope(qkv, None, None, ang.cos(), ang.sin(), k, v, torch.tensor(3), 0.25, 1e-6)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_every_launch_shape_of_the_rope_kernel_attends_the_same():
    """``decode_launch``: more or fewer slices than the cache has blocks, two blocks per loop step,
    the products on ``tl.dot`` (float32 here: the interpreter's bf16 dot is not the GPU's), with a
    window and soft-capping too, all against plain torch; launch values that cannot run refused
    (``pdl=True`` too: a CPU has no Programmatic Dependent Launch)."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import attend_rope_reference
        from tests.generate.kernels.test_decode_attention import token_inputs
        from tests.triton_interpreter import refused
        from nvkit.generate.kernels import decode_attention as da
        torch.manual_seed(0)
        # a slice of several blocks each way (the running max and sum carried between its blocks)
        # (128 and 256 slices over 8 blocks: most slices empty, their sums never read by the merge)
        launches = [dict(splits=1), dict(splits=2, blocks_per_step=2), dict(splits=32), dict(splits=128),
                    dict(splits=256, dot=True), dict(dot=True),
                    dict(dot=True, splits=1), dict(dot=True, splits=2, blocks_per_step=2, num_warps=4, num_stages=3)]
        nh, nkv, hd, length = 6, 2, 32, 256
        for p, window, softcap in [(0, 0, 0.0), (37, 0, 0.0), (200, 70, 0.0), (255, 0, 3.0)]:
            qkv, qw, kw, cos, sin, k, v = token_inputs(nh, nkv, hd, hd, length, torch.float32, True)
            k2, v2 = k.clone(), v.clone()
            ref = attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, torch.tensor(p), hd ** -0.5, 1e-6, window,
                                        softcap)
            for launch in launches:
                k1, v1 = k.clone(), v.clone()
                k1[:, p + 1:], v1[:, p + 1:] = 1e4, float("nan")  # past pos: never read
                got = da.decode_launch(qkv, qw, kw, cos, sin, k1, v1, torch.tensor(p), hd ** -0.5, 1e-6,
                                       window=window, softcap=softcap, **launch)
                err = (got - ref).abs().max().item()
                assert err <= 1e-4 and torch.equal(k1[:, p], k2[:, p]) and torch.equal(v1[:, p], v2[:, p]), \\
                    (p, window, launch, err)
        qkv, qw, kw, cos, sin, k, v = token_inputs(nh, nkv, hd, hd, length, torch.float32, True)
        call = lambda **kw_: lambda: da.decode_launch(qkv, qw, kw, cos, sin, k, v, torch.tensor(3), 0.1, 1e-6, **kw_)
        for bad in (dict(splits=3), dict(splits=0), dict(blocks_per_step=0), dict(blocks_per_step=3),
                    dict(dot="yes"), dict(num_warps=5), dict(num_stages=0), dict(num_stages=True),
                    dict(pdl="yes"), dict(pdl=True)):
            refused(call(**bad), str(bad))
        # the op takes pdl too, and refuses it where the device has no PDL (a CPU)
        refused(lambda: da.decode_attention_rope(qkv, qw, kw, cos, sin, k, v, torch.tensor(3), 0.1, 1e-6, pdl=True),
                "the op with pdl on a CPU")
        small = token_inputs(nh, nkv, hd, hd, 8, torch.float32, True)
        refused(lambda: da.decode_launch(*small, torch.tensor(3), 0.1, 1e-6, dot=True), "dot over 8 positions")
        print("ok")
    """)
    assert out.strip().endswith("ok") and out.count("refused:") == 12, out
    assert "at least 16 positions" in out and "power of two" in out and "num_stages" in out
    assert "pdl must be True or False" in out and out.count("compute capability 9.0") == 2, out
