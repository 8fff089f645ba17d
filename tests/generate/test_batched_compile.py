"""The fused step over rows under ``torch.compile(fullgraph=True)`` (inductor on the CPU here, as
on a GPU before each capture): one compile serves every batch-size class, table width and pool
(their sizes are dynamic), a batch of one is compiled apart, and the compiled step computes what
the eager one does."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import nvkit
from nvkit.generate.fast import FastDecoder
from nvkit.generate.fast.llama_rows_step import decode_rows_step, mark_dynamic

PAGE = 16


def _args(fw, rows, width, pages, seed):
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(pages * PAGE, fw.nkv, fw.hd, generator=g) * 0.3 for _ in fw.layers]
    values = [torch.randn(pages * PAGE, fw.nkv, fw.hd, generator=g) * 0.3 for _ in fw.layers]
    cos, sin = fw.rotary(width * PAGE)
    table = torch.randint(1, pages, (rows, width), generator=g, dtype=torch.int32)
    pos = torch.randint(0, width * PAGE, (rows,), generator=g)
    tok = torch.randint(0, fw.embed.shape[0], (rows,), generator=g)
    return tok, pos, table, cos, sin, keys, values


def _counting_inductor():
    """(the graphs compiled so far, a backend that compiles with inductor and keeps each graph)"""
    from torch._inductor.compile_fx import compile_fx
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)
    return graphs, backend


def test_one_compile_serves_every_class_and_pool():
    m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path(), dtype=torch.float32).eval()
    fw = FastDecoder(m, graphs=False)._fw
    step = decode_rows_step(fw, "matmul", PAGE)
    graphs, backend = _counting_inductor()
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    with torch.inference_mode():
        for rows, width, pages, seed in ((4, 3, 20, 0), (2, 3, 20, 1), (8, 5, 40, 2), (3, 4, 24, 3)):
            args = _args(fw, rows, width, pages, seed)
            mark_dynamic(*args)
            want_keys = [k.clone() for k in args[5]]
            got = compiled(*args)
            want = step(*args[:5], want_keys, [v.clone() for v in args[6]])
            assert got.shape == (rows, m.config.vocab_size)
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (rows, (got - want).abs().max())
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(args[5], want_keys))  # the same cache writes
        assert len(graphs) == 1, f"{len(graphs)} compiles for 4 batch sizes and pools"
        args = _args(fw, 1, 3, 20, 4)
        mark_dynamic(*args)
        compiled(*args)
    assert len(graphs) == 2  # a batch of one: its own compile
    torch._dynamo.reset()


def test_one_compiled_layer_serves_every_layer_class_and_pool():
    """``FastOptions.regional`` on the batched path: the rows layer and the head compiled on their
    own give the eager step's logits and cache writes; one compile of each serves every layer,
    batch-size class and pool (a batch of one again compiled apart)."""
    from nvkit.generate.fast.llama_step import decode_head
    from nvkit.generate.fast.llama_rows_step import decode_rows_layer
    m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path(), dtype=torch.float32).eval()
    fw = FastDecoder(m, graphs=False)._fw
    assert len(fw.layers) > 1
    eager = decode_rows_step(fw, "matmul", PAGE)
    graphs, backend = _counting_inductor()
    torch._dynamo.reset()
    layer = torch.compile(decode_rows_layer(fw.nh, fw.nkv, fw.hd, fw.dtype, "matmul", PAGE), fullgraph=True,
                          backend=backend)
    head = torch.compile(decode_head(fw), fullgraph=True, backend=backend)
    regional = decode_rows_step(fw, "matmul", PAGE, layer=layer, head=head)
    with torch.inference_mode():
        for rows, width, pages, seed in ((4, 3, 20, 0), (2, 3, 20, 1), (8, 5, 40, 2)):
            args = _args(fw, rows, width, pages, seed)
            want_keys = [k.clone() for k in args[5]]
            got = regional(*args)
            want = eager(*args[:5], want_keys, [v.clone() for v in args[6]])
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (rows, (got - want).abs().max())
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(args[5], want_keys))
        assert len(graphs) == 2, f"{len(graphs)} compiles of the layer and the head for 3 classes and pools"
        regional(*_args(fw, 1, 3, 20, 4))
    assert len(graphs) == 4  # a batch of one: the layer and the head once more
    torch._dynamo.reset()


def model_rows_args(shape, vocab: int, rows: int, width: int, pages: int, seed: int, page: int = 32):
    """Random arguments of ``model_rows.model_rows_step`` for a ``PoolShape``: ``rows`` tokens at
    positions in their tables of ``width`` pages, a pool of ``pages`` pages (page 0 never handed
    out), ``page`` the step's own page size (``paged_cache.PAGE``)."""
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(pages * page, shape.nkv, shape.hd, generator=g) * 0.3 for _ in shape.layers]
    values = [torch.randn(pages * page, shape.nkv, shape.hd, generator=g) * 0.3 for _ in shape.layers]
    table = (torch.randperm(pages - 1, generator=g)[:rows * width] + 1).view(rows, width).to(torch.int32)
    pos = torch.randint(0, width * page, (rows,), generator=g)
    return torch.randint(0, vocab, (rows,), generator=g), pos, table, *shape.rotary(1), keys, values


@pytest.mark.parametrize("family", ["Gemma3Text", "Olmoe"])
def test_the_models_own_forward_compiles_once_for_every_rung_and_pool(family):
    """A family off the fused step (Gemma 3's hybrid masks, OLMoE's experts): its rows step
    compiled whole (``model_rows.model_rows_step`` with a compiler) computes what the eager step
    does, writes the same keys and values, and compiles once for every row count above one, table
    width and pool (a single row: once more)."""
    import transformers

    from nvkit.generate.fast.model_rows import PoolShape, model_rows_step
    from tests.generate.test_families_step import ALL_FAMILIES, SIZES
    cfg = getattr(transformers, family + "Config")(**SIZES, **ALL_FAMILIES[family])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, family.replace("Text", "") + "ForCausalLM")(cfg).eval()
    shape = PoolShape(model)

    def args(rows, width, pages, seed):
        return model_rows_args(shape, SIZES["vocab_size"], rows, width, pages, seed)
    graphs, backend = _counting_inductor()
    torch._dynamo.reset()
    eager = model_rows_step(model)
    compiled = model_rows_step(model, lambda f: torch.compile(f, fullgraph=True, backend=backend))
    with torch.inference_mode():
        for rows, width, pages, seed in ((4, 3, 20, 0), (2, 3, 20, 1), (8, 5, 48, 2), (1, 3, 20, 3)):
            a = args(rows, width, pages, seed)
            want_kv = [t.clone() for t in a[5] + a[6]]
            got = compiled(*a)
            want = eager(*a[:5], want_kv[:len(a[5])], want_kv[len(a[5]):])
            assert got.shape == (rows, SIZES["vocab_size"])
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (rows, (got - want).abs().max())
            assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a[5] + a[6], want_kv))
            assert len(graphs) == (1 if rows > 1 else 2), (rows, len(graphs))
    torch._dynamo.reset()


def test_the_models_own_forward_compiles_with_the_paged_attention_once_for_every_rung_and_pool():
    """The rows step over OLMoE's forward with its attention through the paged kernel (run by
    Triton's interpreter) compiled whole: the same logits and the same keys and values written as
    the eager step that gathers the rows' positions, one compile for every row count above one,
    table width and pool."""
    from tests.triton_interpreter import interpret
    out = interpret("""
        import torch
        import transformers
        from nvkit.generate.fast.model_rows import PoolShape, model_rows_step
        from tests.generate.test_batched_compile import _counting_inductor, model_rows_args
        from tests.generate.test_families_step import ALL_FAMILIES, SIZES
        cfg = transformers.OlmoeConfig(**SIZES, **ALL_FAMILIES["Olmoe"])
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = transformers.OlmoeForCausalLM(cfg).eval()
        shape = PoolShape(model)

        def args(rows, width, pages, seed):
            return model_rows_args(shape, SIZES["vocab_size"], rows, width, pages, seed)
        graphs, backend = _counting_inductor()
        gathered = model_rows_step(model)
        compiled = model_rows_step(model, lambda f: torch.compile(f, fullgraph=True, backend=backend), paged=True)
        with torch.inference_mode():
            for rows, width, pages, seed in ((4, 3, 20, 0), (2, 5, 48, 1), (8, 3, 40, 2)):
                a = args(rows, width, pages, seed)
                want_kv = [t.clone() for t in a[5] + a[6]]
                got = compiled(*a)
                want = gathered(*a[:5], want_kv[:len(a[5])], want_kv[len(a[5]):])
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (rows, (got - want).abs().max())
                assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(a[5] + a[6], want_kv))
                print("rows", rows, "graphs", len(graphs))
        assert len(graphs) == 1, len(graphs)
        assert model.config._attn_implementation == "sdpa"
        print("OK")
    """)
    assert out.strip().endswith("OK"), out
