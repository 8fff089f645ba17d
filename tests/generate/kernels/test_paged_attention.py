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



def rows_inputs(nh: int, nkv: int, hd: int, page: int, dtype, norm: bool, rows: int, width: int, pages: int):
    """Random inputs of the paged kernel, drawn from torch's global generator: a pool of
    ``pages`` pages, ``rows`` page tables of ``width`` pages each (page 0 never handed out), the
    rows' positions (first, second, a page's last, inside the second page, the table's last), the
    new tokens' stacked q/k/v and the q/k norm weights (None without ``norm``)."""
    import torch
    k = torch.randn(pages * page, nkv, hd, dtype=dtype)
    v = torch.randn(pages * page, nkv, hd, dtype=dtype)
    table = (torch.randperm(pages - 1)[:rows * width] + 1).view(rows, width).to(torch.int32)
    pos = torch.tensor([0, 1, page - 1, page + 3, width * page - 1])
    qkv = torch.randn(rows, nh + 2 * nkv, hd, dtype=dtype)
    qw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
    kw = torch.rand(hd, dtype=dtype) + 0.5 if norm else None
    return k, v, table, pos, qkv, qw, kw

def test_paged_kernel_matches_reference_for_ragged_rows():
    """The batched kernel over a paged pool: every row at its own position, reading and writing
    through its own page table (pages scattered in the pool), with one slice per row (no merge) or
    several; positions past each row's own are never read."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import paged_attend_rope_reference
        from nvkit.generate.kernels import paged_attention as pa
        from tests.generate.kernels.test_paged_attention import rows_inputs
        torch.manual_seed(0)
        for nh, nkv, hd, page, dtype, norm, sms in [(16, 8, 128, 32, torch.float32, True, 64),
                                                    (6, 2, 32, 16, torch.float32, False, 64),
                                                    (16, 8, 128, 32, torch.float32, True, 1),
                                                    (4, 2, 16, 32, torch.bfloat16, True, 64)]:
            pa._sm_count = lambda device, sms=sms: sms  # 1 SM: one slice per row, the no-merge branch
            rows, pages, width = 5, 24, 4
            k, v, table, pos, qkv, qw, kw = rows_inputs(nh, nkv, hd, page, dtype, norm, rows, width, pages)
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


def test_paged_window_and_softcap_match_reference():
    """Gemma 2/3's sliding window and soft-capping in the paged kernel against
    ``paged_attend_rope_reference``: rows at different positions over scattered pages, windows
    inside a page, of a page, across several pages and slices, wider than pos, of 1; soft-capping
    alone and with a window; fp32 products and tl.dot, one page or two per step, one slice (no
    merge) to the invariant count. The pages wholly below a row's window are not looked up (their
    table entries point at a page of NaN or past the pool) and no step is spent on them: every load
    of the pool and the table (recorded in Triton's interpreter) reads the row's window only."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import paged_attend_rope_reference
        from nvkit.generate.kernels import paged_attention as pa
        from tests.generate.kernels.test_decode_attention import recorded_loads
        torch.manual_seed(0)
        nh, nkv, hd, page, rows, width = 8, 2, 32, 16, 5, 8
        pages = rows * width + 2  # page 0 the scratch page, the last one all NaN
        nan_page, far_page = pages - 1, 10 ** 6
        k = torch.randn(pages * page, nkv, hd)
        v = torch.randn(pages * page, nkv, hd)
        k[nan_page * page:], v[nan_page * page:] = float("nan"), float("nan")
        table = (torch.randperm(rows * width) + 1).view(rows, width).to(torch.int32)
        pos = torch.tensor([0, 5, 40, 100, width * page - 1])
        qkv = torch.randn(rows, nh + 2 * nkv, hd)
        qw, kw = torch.rand(hd) + 0.5, torch.rand(hd) + 0.5
        ang = torch.randn(width * page, hd // 2).repeat(1, 2)
        cos, sin = ang.cos(), ang.sin()
        s = pa.INVARIANT_SPLITS
        fp32, dot = (dict(), dict(splits=1), dict(splits=4), dict(splits=2, pages_per_step=2), dict(splits=s)), \\
                    (dict(dot=True), dict(dot=True, splits=4, pages_per_step=2))
        for window, softcap, launches in [(1, 0.0, fp32[:3]), (7, 0.0, fp32 + dot[:1]), (page, 0.0, fp32[1:4]),
                                          (20, 3.0, fp32 + dot), (50, 0.0, fp32[2:] + dot[1:]),
                                          (500, 0.0, fp32[:1]), (0, 3.0, fp32[:3] + dot[:1])]:
            ref_k, ref_v = k.clone(), v.clone()
            ref = paged_attend_rope_reference(qkv, qw, kw, cos, sin, ref_k, ref_v, pos, table, page, hd ** -0.5,
                                              1e-6, window, softcap)
            lows = [max(0, int(p) - window + 1) if window else 0 for p in pos]
            for shape in launches:
                k1, v1, t1 = k.clone(), v.clone(), table.clone()
                for b, (p, lo) in enumerate(zip(pos.tolist(), lows)):
                    for j in range(width):  # below the window: the page's entry gone, or its positions NaN
                        if (j + 1) * page <= lo:
                            t1[b, j] = nan_page if b % 2 else far_page
                    for at in list(range(lo - lo % page, lo)) + list(range(p + 1, width * page)):
                        t = int(table[b, at // page]) * page + at % page
                        k1[t], v1[t] = float("nan"), float("nan")
                with recorded_loads(k=k1, v=v1, table=t1) as loads:
                    got = pa.paged_launch(qkv, qw, kw, cos, sin, k1, v1, pos, t1, page, hd ** -0.5, 1e-6,
                                          window=window, softcap=softcap, **shape)
                err = (got - ref).abs().max().item()
                assert torch.isfinite(got).all() and err <= 1e-4, (window, softcap, shape, err)
                span = page * shape.get("pages_per_step", 1)
                owner = {int(t1[b, j]): (b, j) for b in range(rows) for j in range(width)}
                for b, p in enumerate(pos.tolist()):  # the new key and value, through the row's table
                    t = int(table[b, p // page]) * page + p % page
                    assert (k1[t] - ref_k[t]).abs().max() <= 1e-4 and torch.equal(v1[t], ref_v[t])
                for name in ("k", "v"):
                    mine = [at for n, at in loads if n == name]
                    steps = sum(nkv * (p // span - lo // span + 1) for p, lo in zip(pos.tolist(), lows))
                    assert len(mine) == steps, (window, shape, name, len(mine), steps)
                    for at in mine:
                        assert len(at), (window, shape, name)
                        for token in set((at // (nkv * hd)).tolist()):  # back to (row, position)
                            b, j = owner[token // page]
                            where = j * page + token % page
                            assert lows[b] <= where <= int(pos[b]), (window, shape, b, where)
                for at in (at for n, at in loads if n == "table"):
                    b, j = at // width, at % width
                    for r, col in zip(b.tolist(), j.tolist()):
                        assert lows[r] // page <= col <= int(pos[r]) // page, (window, shape, r, col)
            print(window, softcap, "ok")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_fixed_slices_stay_row_invariant_under_a_window():
    """With ``splits=INVARIANT_SPLITS`` a window and a soft cap leave a row's output the same bits
    alone and among other rows with a wider table: the window moves no block to another slice."""
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

        def attend(rows, width, splits, window, softcap):
            return pa.paged_decode_attention(qkv[rows].clone(), None, None, cos, sin, k.clone(), v.clone(), pos[rows],
                                             table[rows, :width].contiguous(), page, hd ** -0.5, 1e-6, splits,
                                             window, softcap)
        for window, softcap in ((20, 0.0), (40, 5.0), (1, 5.0)):
            every = attend(list(range(6)), 12, s, window, softcap)
            for r in range(6):
                alone = attend([r], int(pos[r]) // page + 1, s, window, softcap)
                assert torch.equal(alone[0], every[r]), (window, r, (alone[0] - every[r]).abs().max())
            assert torch.equal(attend([2, 0], 10, s, window, softcap)[1], every[0])
            auto = attend(list(range(6)), 12, 0, window, softcap)
            assert (auto - every).abs().max() <= 1e-5
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_paged_window_and_softcap_arguments_are_checked_and_trace():
    """``paged_launch`` and the op refuse a window that is not a whole number >= 0 and a soft cap
    that is not a finite number >= 0, saying which; the op with both traces whole under
    torch.compile (its fake takes them); a window lowers the automatic slice count to the blocks
    it can meet."""
    out = _interpret("""
        import unittest.mock as um
        import torch
        from nvkit.benchmarks.attention import paged_attend_rope_reference
        from nvkit.generate.kernels import paged_attention as pa
        torch.manual_seed(0)
        args = (torch.randn(2, 8, 32), None, None, torch.randn(32, 32), torch.randn(32, 32), torch.randn(64, 2, 32),
                torch.randn(64, 2, 32), torch.tensor([5, 30]), torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
                16, 0.1, 1e-6)
        for bad, why in [(dict(window=-1), "window must be a whole number >= 0"),
                         (dict(window=True), "window must be a whole number >= 0"),
                         (dict(window=2.0), "window must be a whole number >= 0"),
                         (dict(softcap=-0.5), "softcap must be a finite number >= 0"),
                         (dict(softcap=float("inf")), "softcap must be a finite number >= 0"),
                         (dict(softcap=float("nan")), "softcap must be a finite number >= 0"),
                         (dict(softcap="1"), "softcap must be a finite number >= 0"),
                         (dict(softcap=True), "softcap must be a finite number >= 0")]:
            for call in (pa.paged_launch, pa.paged_decode_attention):
                if call is pa.paged_decode_attention and bad in (dict(window=True), dict(window=2.0), dict(softcap="1"),
                                                                 dict(softcap=True)):
                    continue  # the op's schema converts a bool and refuses a wrong type itself
                try:
                    call(*args, **bad)
                except ValueError as e:
                    assert str(e).startswith("nvkit::paged_decode_attention " + why), e
                else:
                    raise AssertionError((call, bad))

        def f(qkv, k, v, pos, table, cos, sin):
            return pa.paged_decode_attention(qkv, None, None, cos, sin, k, v, pos, table, 16, 0.1, 1e-6, 0, 9, 4.0) * 2
        qkv, _, _, cos, sin, k, v, pos, table = args[:9]
        k1, k2 = k.clone(), k.clone()
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(qkv, k1, v.clone(), pos, table, cos, sin)
        ref = paged_attend_rope_reference(qkv, None, None, cos, sin, k2, v.clone(), pos, table, 16, 0.1, 1e-6, 9, 4.0)
        assert torch.allclose(got, ref * 2, atol=1e-5) and torch.allclose(k1, k2, atol=1e-6)
        # 2 rows x 2 KV heads on 64 SMs would take 16 slices of a 64-block table; a window of 40
        # positions meets at most 4 blocks of 16
        pa._sm_count = lambda device: 64
        table = torch.arange(1, 129, dtype=torch.int32).view(2, 64)
        kk, vv = torch.randn(129 * 16, 2, 32), torch.randn(129 * 16, 2, 32)
        ang = torch.randn(1024, 16).repeat(1, 2)
        for window, want in ((0, 16), (40, 4)):
            with um.patch.object(pa, "paged_splits", wraps=pa.paged_splits) as spy:
                pa.paged_launch(torch.randn(2, 8, 32), None, None, ang.cos(), ang.sin(), kk, vv,
                                torch.tensor([900, 1000]), table, 16, 0.1, 1e-6, window=window)
            assert pa.paged_splits(*spy.call_args.args) == want, (window, spy.call_args)
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_the_window_is_not_a_compile_time_constant():
    """One compiled kernel serves every window: each attention kernel takes it as a run-time
    argument that Triton does not specialise on (as the paged kernel's slice count), and the soft
    cap as a float argument beside one constexpr switch. Read off the kernels as Triton's JIT
    (not the interpreter) has them."""
    import os
    import subprocess
    import sys
    import textwrap

    from tests.triton_interpreter import ROOT
    code = textwrap.dedent("""
        from nvkit.generate.kernels import decode_attention as da, paged_attention as pa
        for kernel in (da._split_kernel, da._rope_split_kernel, pa._paged_rope_split_kernel):
            params = {p.name: p for p in kernel.params}
            assert params["window"].do_not_specialize and not params["window"].is_constexpr, kernel
            assert not params["softcap"].is_constexpr and params["SOFTCAP"].is_constexpr, kernel
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-4000:] + r.stderr[-4000:]


def test_paged_kernel_with_partial_rotary_tables():
    """The paged kernel with (positions, r) tables, r < head_dim (Phi-3/Phi-4-mini's partial rotary
    embedding: 96 of 128; 8 of 16) and r = head_dim, with and without the q/k norms, fp32 and bf16,
    ragged rows over scattered pages, against ``paged_attend_rope_reference``: the output, each
    row's new key (its pass dims as the norm left them: without norms the projected values bit
    for bit) and value; on fp32 also other launch shapes (several slices, two pages a step, tl.dot,
    a window and a soft cap), and tables cut from wider ones (``cos[:, :r]``, rows r apart once
    made contiguous)."""
    out = _interpret("""
        import torch
        from nvkit.benchmarks.attention import paged_attend_rope_reference
        from nvkit.generate.kernels import paged_attention as pa
        from tests.generate.kernels.test_paged_attention import rows_inputs
        torch.manual_seed(0)
        for nh, nkv, hd, rot, page, dtype, norm in [(8, 2, 128, 96, 16, torch.float32, True),
                                                    (8, 2, 128, 96, 16, torch.float32, False),
                                                    (8, 2, 128, 96, 16, torch.bfloat16, True),
                                                    (4, 2, 16, 8, 32, torch.float32, True),
                                                    (4, 2, 16, 8, 32, torch.bfloat16, True),
                                                    (4, 2, 16, 8, 32, torch.bfloat16, False),
                                                    (4, 2, 16, 16, 32, torch.float32, False)]:
            rows, width = 5, 4
            pages = rows * width + 1
            k, v, table, pos, qkv, qw, kw = rows_inputs(nh, nkv, hd, page, dtype, norm, rows, width, pages)
            ang = torch.randn(width * page, hd // 2).repeat(1, 2)  # a full table; r of it below
            ang = torch.cat((ang[:, :rot // 2], ang[:, :rot // 2]), 1) if rot < hd else ang
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
            assert cos.shape == (width * page, rot)
            tol = 1e-4 if dtype == torch.float32 else 3e-2
            shapes = [dict()]
            if dtype == torch.float32 and norm:
                shapes += [dict(splits=1), dict(splits=4, pages_per_step=2), dict(dot=True),
                           dict(splits=2, window=20, softcap=3.0)]
            for shape in shapes:
                extra = {n: shape[n] for n in ("window", "softcap") if n in shape}
                k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
                for b in range(rows):  # past each row's position: garbage, never read
                    for p in range(int(pos[b]) + 1, width * page):
                        t = int(table[b, p // page]) * page + p % page
                        k1[t], v1[t] = 1e4, float("nan")
                got = pa.paged_launch(qkv, qw, kw, cos, sin, k1, v1, pos, table, page, hd ** -0.5, 1e-6, **shape)
                ref = paged_attend_rope_reference(qkv, qw, kw, cos, sin, k2, v2, pos, table, page, hd ** -0.5,
                                                  1e-6, **extra)
                err = (got.float() - ref.float()).abs().max().item()
                assert got.shape == (rows, nh, hd) and got.dtype == dtype and err <= tol, (hd, rot, shape, err)
                new_k = qkv[:, nh:nh + nkv].float()
                if norm:
                    new_k = new_k * torch.rsqrt(new_k.pow(2).mean(-1, keepdim=True) + 1e-6) * kw.float()
                for b in range(rows):  # the new key and value at each row's position, through its table
                    t = int(table[b, int(pos[b]) // page]) * page + int(pos[b]) % page
                    assert (k1[t].float() - k2[t].float()).abs().max() <= tol and torch.equal(v1[t], v2[t]), (b, shape)
                    if not norm:  # the pass dims: the projected values, unrotated
                        assert torch.equal(k1[t, :, rot:], qkv[b, nh:nh + nkv, rot:]), (hd, rot, b)
                    else:  # normalised over the whole head, unrotated
                        assert (k1[t, :, rot:].float() - new_k[b, :, rot:]).abs().max() <= tol, (hd, rot, b)
            if dtype == torch.float32 and rot < hd:  # a table cut from a wider one, as the op's argument
                wide = torch.cat((cos, torch.ones(width * page, 8)), 1)
                wide_sin = torch.cat((sin, torch.zeros(width * page, 8)), 1)
                k3, v3 = k.clone(), v.clone()
                got3 = pa.paged_decode_attention(qkv, qw, kw, wide[:, :rot], wide_sin[:, :rot], k3, v3, pos, table,
                                                 page, hd ** -0.5, 1e-6)
                assert torch.equal(got3, pa.paged_decode_attention(qkv, qw, kw, cos, sin, k.clone(), v.clone(), pos,
                                                                   table, page, hd ** -0.5, 1e-6))
            print(hd, rot, dtype, norm, "ok")
        # widths that do not fit: odd, wider than the head, none, one value a row, cos and sin unlike
        args = lambda cos, sin: (torch.randn(2, 8, 16), None, None, cos, sin, torch.randn(64, 2, 16),
                                 torch.randn(64, 2, 16), torch.tensor([5, 30]),
                                 torch.tensor([[1, 2], [3, 0]], dtype=torch.int32), 16, 0.1, 1e-6)
        for cos, sin in [(torch.ones(32, 7), torch.zeros(32, 7)), (torch.ones(32, 18), torch.zeros(32, 18)),
                         (torch.ones(32, 0), torch.zeros(32, 0)), (torch.ones(32), torch.zeros(32)),
                         (torch.ones(32, 8), torch.zeros(32, 16))]:
            for call in (pa.paged_launch, pa.paged_decode_attention):
                try:
                    call(*args(cos, sin))
                except ValueError as e:
                    assert str(e).startswith("nvkit::paged_decode_attention expects cos and sin tables (positions, r), "
                                             "r even and at most 16, not "), e
                else:
                    raise AssertionError((call, cos.shape, sin.shape))
        for rot in (2, 8, 16):  # the widths that fit
            ang = torch.randn(32, rot // 2).repeat(1, 2)
            pa.paged_decode_attention(*args(ang.cos(), ang.sin()))
        print("ok")
    """)
    assert out.strip().endswith("ok")
