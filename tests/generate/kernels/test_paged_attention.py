"""nvkit's paged decode attention (``nvkit.generate.kernels.paged_attention``: many rows, each at its
own position, over a paged KV pool; the batched fast path's kernel), run by Triton's interpreter on
the CPU (TRITON_INTERPRET=1, which must be set before triton is imported: hence a child process),
against ``paged_attend_rope_reference`` in plain torch (in ``nvkit.benchmarks.attention``, whose
launch-shape benchmark checks every shape against it). The GPU run is tests/gpu/test_batched_gpu.py
and ``python -m nvkit.benchmarks.attention``."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def test_paged_kernel_matches_reference_for_ragged_rows():
    """The batched kernel over a paged pool: every row at its own position, reading and writing
    through its own page table (pages scattered in the pool), with one slice per row (no merge) or
    several; positions past each row's own are never read."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import paged_attend_rope_reference
        from nvkit.generate.kernels import paged_attention as pa
        torch.manual_seed(0)
        for nh, nkv, hd, page, dtype, norm, sms in [(16, 8, 128, 32, torch.float32, True, 64),
                                                    (6, 2, 32, 16, torch.float32, False, 64),
                                                    (16, 8, 128, 32, torch.float32, True, 1),
                                                    (4, 2, 16, 32, torch.bfloat16, True, 64)]:
            pa._sm_count = lambda device, sms=sms: sms  # 1 SM: one slice per row, the no-merge branch
            rows, pages, width = 5, 24, 4
            k = torch.randn(pages * page, nkv, hd, dtype=dtype)
            v = torch.randn(pages * page, nkv, hd, dtype=dtype)
            table = (torch.randperm(pages - 1)[:rows * width] + 1).view(rows, width).to(torch.int32)
            pos = torch.tensor([0, 1, page - 1, page + 3, width * page - 1])
            qkv = torch.randn(rows, nh + 2 * nkv, hd, dtype=dtype)
            qw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
            kw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
            ang = torch.randn(width * page, hd // 2).repeat(1, 2)
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
            k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
            # what lies past each row's position holds garbage: never read
            for b in range(rows):
                for p in range(int(pos[b]) + 1, width * page):
                    t = int(table[b, p // page]) * page + p % page
                    k1[t], v1[t] = 1e4, float("nan")
            splits = pa.paged_splits(rows, nkv, width, sms)
            got = pa.paged_decode_attention(qkv, qw, kw, cos, sin, k1, v1, pos, table, page, hd ** -0.5, 1e-6)
            ref = paged_attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, pos, table, page, hd ** -0.5, 1e-6)
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            err = (got.float() - ref.float()).abs().max().item()
            assert got.shape == (rows, nh, hd) and got.dtype == dtype and err <= tol, (nh, sms, err)
            for b in range(rows):  # the new key and value at each row's position, through its table
                t = int(table[b, int(pos[b]) // page]) * page + int(pos[b]) % page
                assert (k1[t].float() - k2[t].float()).abs().max() <= tol and torch.equal(v1[t], v2[t])
            print(nh, sms, splits, err)
            # the launch shapes the attention benchmark compares compute the same thing (on the
            # first layout: the interpreter is slow)
            for shape in ((dict(splits=2, pages_per_step=2), dict(splits=1, pages_per_step=4),
                           dict(splits=4, pages_per_step=2, num_warps=2), dict(splits=8),
                           dict(dot=True), dict(splits=4, pages_per_step=2, dot=True, num_stages=3))
                          if nh == 16 and sms == 64 and dtype == torch.float32 else ()):
                k3, v3 = k1.clone(), v1.clone()
                got2 = pa.paged_launch(qkv, qw, kw, cos, sin, k3, v3, pos, table, page, hd ** -0.5, 1e-6, **shape)
                err2 = (got2.float() - ref.float()).abs().max().item()
                assert err2 <= tol and torch.equal(v3.nan_to_num(), v1.nan_to_num()), (nh, shape, err2)
        for bad_shape in (dict(splits=3), dict(pages_per_step=0), dict(num_warps=6), dict(splits=True + 2),
                          dict(dot="yes"), dict(num_stages=0), dict(num_stages=True)):
            try:
                pa.paged_launch(qkv, qw, kw, cos, sin, k1, v1, pos, table, page, hd ** -0.5, 1e-6, **bad_shape)
            except ValueError as e:
                assert "power of two" in str(e) or "dot must be" in str(e) or "num_stages must be" in str(e), e
            else:
                raise AssertionError(bad_shape)
        # the default launch: fp32 products on the CPU whatever the dtype (the interpreter gets a
        # bf16 tl.dot wrong), and explicit arguments beside dot=None keep the fp32 products
        for dt in (torch.float32, torch.bfloat16):
            assert pa.default_launch(torch.zeros(1, dtype=dt)) == dict(dot=False, pages_per_step=1, num_warps=None,
                                                                       num_stages=None)
        assert pa.DOT_LAUNCH["pages_per_step"] >= 1 and set(pa.DOT_LAUNCH) == {"pages_per_step", "num_warps", "num_stages"}
        assert pa.paged_splits(64, 8, 40, 132) == 1 and pa.paged_splits(2, 8, 40, 132) == 16
        assert pa.paged_splits(2, 8, 3, 132) == 4  # never more slices than the table has blocks (rounded up)
        bad = pa.check_paged(torch.zeros(2, 20, 64), torch.zeros(64, 2, 32), torch.zeros(64, 2, 32),
                             torch.zeros(2, dtype=torch.long), torch.zeros(2, 2, dtype=torch.int32),
                             torch.zeros(64, 64), torch.zeros(64, 64), 32)
        assert "cannot attend" in bad
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_batched_decoder_with_the_paged_kernel_decodes_like_matmul():
    """The whole batched step with the paged kernel (attention='paged') against 'matmul', on the
    demo model (bf16) without graphs: the same greedy tokens for prompts of different lengths;
    and the op traces whole with dynamic rows under torch.compile."""
    out = _interpret("""
        import torch, nvkit
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import nvkit.generate.fast as fast
        from nvkit.generate.kernels import paged_attention as pa
        from nvkit.generate.fast.rows import BatchedDecoder
        m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
        tok = AutoTokenizer.from_pretrained(nvkit.demo.path())
        prompts = [tok(p)["input_ids"] for p in ("NVIDIA GPUs are", "A", "The memory of a GPU holds " * 12)]
        sampling, _ = fast.resolve(m, dict(max_new_tokens=10, do_sample=False, eos_token_id=10 ** 7))
        with torch.inference_mode():
            ref = BatchedDecoder(fast.FastDecoder(m, k_steps=4, graphs=False), max_rows=2).generate(prompts, sampling)
            tri = BatchedDecoder(fast.FastDecoder(m, k_steps=4, graphs=False, attention="triton-fused"), max_rows=2)
            assert tri.attention == "paged"
            got = tri.generate(prompts, sampling)
        assert got == ref, (got, ref)

        def f(qkv, k, v, pos, table, cos, sin):
            return pa.paged_decode_attention(qkv, None, None, cos, sin, k, v, pos, table, 16, 0.1, 1e-6) * 2
        g = torch.compile(f, fullgraph=True, backend="aot_eager")
        for rows in (2, 3):
            args = (torch.randn(rows, 8, 32), torch.randn(64, 2, 32), torch.randn(64, 2, 32),
                    torch.tensor([5, 17, 30][:rows]), torch.tensor([[1, 2], [3, 0], [2, 1]][:rows], dtype=torch.int32),
                    torch.randn(32, 32), torch.randn(32, 32))
            for t in args[:5]:
                torch._dynamo.maybe_mark_dynamic(t, 0)
            k2 = args[1].clone()
            want = f(args[0], k2, args[2].clone(), *args[3:])
            assert torch.allclose(g(*args), want, atol=1e-5) and torch.allclose(args[1], k2)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_paged_op_compiles_in_place_on_the_pool_with_dynamic_rows():
    """Under torch.compile with the rows, pool and table sizes dynamic (as the batched step is
    compiled), the op that writes the pool is called on the pool itself: no pool-sized copy."""
    out = _interpret("""
        import re
        import torch
        from torch._inductor.utils import run_and_get_code
        from nvkit.generate.kernels import paged_attention as pa
        torch.manual_seed(0)
        nh, nkv, hd, page, pages = 16, 8, 128, 32, 12
        pool_k, pool_v = torch.zeros(pages * page, nkv, hd), torch.zeros(pages * page, nkv, hd)
        w = torch.randn((nh + 2 * nkv) * hd, 64) * 0.1
        qw, kw = torch.rand(hd) + 0.5, torch.rand(hd) + 0.5
        ang = torch.randn(4 * page, hd // 2).repeat(1, 2)
        cos, sin = ang.cos(), ang.sin()

        def step(x, pos, table, cos, sin, keys, values):
            qkv = (x @ w.T).view(-1, nh + 2 * nkv, hd)
            o = pa.paged_decode_attention(qkv, qw, kw, cos, sin, keys[0], values[0], pos, table, page, 0.1, 1e-6)
            return o.sum(1) * 2

        def args(rows, keys, values):
            x = torch.randn(rows, 64)
            pos = torch.arange(rows) * 3
            table = (torch.arange(rows * 4).view(rows, 4) % (pages - 1) + 1).to(torch.int32)
            for t in (x, pos, table, cos, sin, keys, values):
                torch._dynamo.maybe_mark_dynamic(t, 0)
            torch._dynamo.maybe_mark_dynamic(table, 1)
            return x, pos, table, cos, sin, [keys], [values]

        f = torch.compile(step, fullgraph=True)
        a = args(3, pool_k, pool_v)
        got, codes = run_and_get_code(f, *a)
        code = "\\n".join(codes)
        assert "paged_decode_attention" in code
        assert not re.search(r"clone|copy_|empty_strided_\\w+\\(\\(s\\d+, {nkv}, {hd}\\)".format(nkv=nkv, hd=hd), code), code
        k2, v2 = torch.zeros_like(pool_k), torch.zeros_like(pool_v)
        want = step(*a[:5], [k2], [v2])
        assert torch.allclose(got, want, atol=1e-4) and torch.allclose(pool_k, k2, atol=1e-5)
        assert (pool_k != 0).any()  # the op wrote the new keys into the pool itself
        f(*args(5, pool_k, pool_v))  # another row count: the same compiled code
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_fixed_slices_give_a_row_the_same_sums_whatever_rows_and_table_are_beside_it():
    """With ``splits=INVARIANT_SPLITS`` (the batch-invariant step's attention) a row's output is the
    same bits alone and among other rows with a wider table, though more slices than its table has
    blocks leave some empty; the automatic split, which follows the row count, is the reference
    the result stays close to."""
    out = _interpret("""
        import torch
        from nvkit.generate.kernels import paged_attention as pa
        torch.manual_seed(1)
        nh, nkv, hd, page, pages = 8, 2, 32, 16, 80
        k = torch.randn(pages * page, nkv, hd)
        v = torch.randn(pages * page, nkv, hd)
        ang = torch.randn(12 * page, hd // 2).repeat(1, 2)
        cos, sin = ang.cos(), ang.sin()
        qkv = torch.randn(6, nh + 2 * nkv, hd)
        table = (torch.randperm(pages - 1)[:6 * 12] + 1).view(6, 12).to(torch.int32)
        pos = torch.tensor([37, 3, 150, 60, 0, 99])
        s = pa.INVARIANT_SPLITS

        def attend(rows, width, splits):
            return pa.paged_decode_attention(qkv[rows].clone(), None, None, cos, sin, k.clone(), v.clone(), pos[rows],
                                             table[rows, :width].contiguous(), page, hd ** -0.5, 1e-6, splits)
        every = attend(list(range(6)), 12, s)
        for r in range(6):
            width = int(pos[r]) // page + 1  # the narrowest table that holds its position
            alone = attend([r], width, s)
            assert torch.equal(alone[0], every[r]), (r, (alone[0] - every[r]).abs().max())
        assert torch.equal(attend([2, 0], 10, s)[1], every[0])
        auto = attend(list(range(6)), 12, 0)
        assert (auto - every).abs().max() <= 1e-5
        print("ok")
    """)
    assert out.strip().endswith("ok")
