"""nvkit's Triton kernels inside the uncompiled fused decode step (``llama_step.decode_step`` with
``kernels=True``: ``add_rms_norm``, ``silu_mul`` and ``lora_add``'s ``linear`` of
``nvkit.generate.kernels``), run by Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set
before triton is imported: hence a child process): the demo model's step against the step of torch
operations, with and without an adapter (its products apart, and folded into the weights' spare
rows, as on a GPU with float32 products). Each kernel against its torch reference is its own test
file here; the GPU run is tests/gpu (the default batch-1 path runs these kernels)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def test_the_step_with_kernels_decodes_as_the_step_of_torch_operations():
    """The demo model's fused step in float32 with ``kernels=True`` against ``kernels=False``: the
    same logits within float32 rounding over 6 steps, with no adapter and with a random one, its
    products apart and folded (``lora_add.folded_linear``, which a CPU does not take by itself)."""
    out = _interpret("""
        import torch
        import nvkit
        from peft import LoraConfig, get_peft_model
        from tests import demo_model
        from nvkit.generate.fast import lora as lora_mod
        from nvkit.generate.fast.static_cache import new_cache
        from nvkit.generate.fast.llama_step import decode_step
        from nvkit.generate.fast.fused_weights import FusedWeights
        import nvkit.generate.kernels.lora_add as lora_add
        from tests.greedy_steps import greedy_logits
        torch.manual_seed(0)
        s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
        for adapter, fold in ((False, False), (True, False), (True, True)):
            lora_add.fp32_products = lambda device: fold  # the folded kernel's float32 product: on a CPU too
            model = s.model
            if adapter:
                model = get_peft_model(s.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                           init_lora_weights=False))
            base = model.get_base_model() if adapter else model
            fw = FusedWeights(base, spare=16 if fold else 0)
            lo = None
            if adapter:
                lo = lora_mod.LoraSlots(fw, 8, torch.float32, fold=fold)
                assert lo.folded == fold
                lo.load(model)
            logits = {}
            for kernels in (False, True):
                c = new_cache(base, fw, 64, 1, torch.device("cpu"))
                step = decode_step(fw, c, "matmul", lo, kernels=kernels)
                c.tok.fill_(5)
                logits[kernels] = greedy_logits(step, c, 6)
            diff = (logits[True] - logits[False]).abs().max().item()
            assert diff < 1e-3, (adapter, diff)
            assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
            print(("folded" if fold else "adapter") if adapter else "base", diff)
            if adapter:
                model.unload()
        print("OK")
    """)
    print(out)
    assert out.strip().endswith("OK"), out


def test_the_rows_step_with_kernels_folds_the_adapter_as_the_step_of_torch_operations_computes_it():
    """The rows step (3 rows at their own positions in a paged pool) with ``kernels=True`` and a
    random adapter folded into the weights' spare rows (``folded_linear`` over every row at once)
    against ``kernels=False`` (torch's operations, the products apart): the same logits and the same
    keys and values written, within float32 rounding."""
    out = _interpret("""
        import torch
        import nvkit
        from peft import LoraConfig, get_peft_model
        from tests import demo_model
        from nvkit.generate.fast import lora as lora_mod
        from nvkit.generate.fast.fused_weights import FusedWeights
        from nvkit.generate.fast.llama_rows_step import decode_rows_step
        import nvkit.generate.kernels.lora_add as lora_add
        lora_add.fp32_products = lambda device: True  # the folded kernel's float32 product: on a CPU too
        torch.manual_seed(0)
        s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
        model = get_peft_model(s.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                   init_lora_weights=False))
        fw = FusedWeights(model.get_base_model(), spare=16)
        lo = lora_mod.LoraSlots(fw, 8, torch.float32, fold=True)
        lo.load(model)
        page, pages, width, rows = 16, 12, 3, 3
        g = torch.Generator().manual_seed(1)
        keys = [torch.randn(pages * page, fw.nkv, fw.hd, generator=g) * 0.3 for _ in fw.layers]
        values = [torch.randn(pages * page, fw.nkv, fw.hd, generator=g) * 0.3 for _ in fw.layers]
        cos, sin = fw.rotary(width * page)
        table = torch.randint(1, pages, (rows, width), generator=g, dtype=torch.int32)
        pos = torch.tensor([5, 17, 40])
        tok = torch.tensor([3, 7, 11])
        got = {}
        with torch.inference_mode():
            for kernels in (False, True):
                k, v = [x.clone() for x in keys], [x.clone() for x in values]
                logits = decode_rows_step(fw, "matmul", page, lo, kernels=kernels)(tok, pos, table, cos, sin, k, v)
                got[kernels] = (logits, k, v)
        diff = (got[True][0] - got[False][0]).abs().max().item()
        assert diff < 1e-3, diff
        assert torch.equal(got[True][0].argmax(-1), got[False][0].argmax(-1))
        for a, b in zip(got[True][1] + got[True][2], got[False][1] + got[False][2]):
            assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
        model.unload()
        print("rows folded", diff)
        print("OK")
    """)
    print(out)
    assert out.strip().endswith("OK"), out


def test_the_gemma_phi3_and_olmo2_steps_with_kernels_compute_as_the_steps_of_torch_operations():
    """Gemma 2 (soft-capped scores and logits, four norms of 1 + w, GELU), Gemma 3 (q/k norms,
    a second rotary table for its sliding layers), Phi-3 (12 of 16 dims rotated: rotary tables
    narrower than the head) and OLMo 2 (norms after each branch, q and k normed over all heads:
    the norm kernels' branch-norm and norm-alone forms) on the fused step with nvkit's kernels: at batch 1
    the split and the fused Triton attention (each sliding layer's reads started at its window) and
    the norm and activation kernels, 14 steps from position 3 across the window of 6, against the
    step of torch operations (matmul attention, the window as a mask); and the rows step with the
    paged kernel (3 rows at their own positions, past the window) against its matmul form."""
    out = _interpret("""
        import torch
        from nvkit.generate.fast.fused_weights import FusedWeights
        from nvkit.generate.fast.llama_rows_step import decode_rows_step
        from nvkit.generate.fast.llama_step import decode_step
        from nvkit.generate.fast.static_cache import new_cache
        from tests.generate.test_families_step import tiny
        from tests.greedy_steps import greedy_logits
        for family in ("Gemma2", "Gemma3Text", "Phi3", "Olmo2"):
            model = tiny(family)
            g = torch.Generator().manual_seed(3)
            with torch.no_grad():  # norms that are not all ones (or Gemma's zeros), so a dropped weight shows
                for name, p in model.named_parameters():
                    if "norm" in name:
                        p.add_(torch.randn(p.shape, generator=g) * 0.2)
            fw = FusedWeights(model)
            if family == "Phi3":
                assert fw.rotary(4)[0].shape == (4, 12)
            elif family == "Olmo2":  # norms after each branch and over all heads' q and k
                assert fw.layers[0].ff_norm is not None and fw.layers[0].q_norm.shape[0] == fw.nh * fw.hd
            else:
                assert {w.window for w in fw.layers} == {0, 6}
            logits = {}
            for attention, kernels in (("matmul", False), ("matmul", True), ("triton-split", True),
                                       ("triton-fused", True)):
                c = new_cache(model, fw, 64, 1, torch.device("cpu"))
                g = torch.Generator().manual_seed(2)
                for keys in c.keys + c.values:  # a prompt's keys and values at positions 0..2
                    keys[:, :3].copy_(torch.randn(keys[:, :3].shape, generator=g) * 0.3)
                c.pos.fill_(3)
                c.tok.fill_(5)
                step = decode_step(fw, c, attention, kernels=kernels)
                logits[attention, kernels] = greedy_logits(step, c, 14)
            ref = logits["matmul", False]
            for key, got in logits.items():
                diff = (got - ref).abs().max().item()
                assert diff < 2e-3 and torch.equal(got.argmax(-1), ref.argmax(-1)), (family, key, diff)
            page, pages, width = 16, 12, 3
            g = torch.Generator().manual_seed(1)
            keys = [torch.randn(pages * page, fw.nkv, fw.hd, generator=g) * 0.3 for _ in fw.layers]
            values = [torch.randn(pages * page, fw.nkv, fw.hd, generator=g) * 0.3 for _ in fw.layers]
            cos, sin = fw.rotary(width * page)
            table = torch.randint(1, pages, (3, width), generator=g, dtype=torch.int32)
            pos, tok = torch.tensor([2, 17, 40]), torch.tensor([3, 7, 11])
            got = {}
            with torch.inference_mode():
                for attention, kernels in (("matmul", False), ("paged", True)):
                    k, v = [x.clone() for x in keys], [x.clone() for x in values]
                    got[attention] = (decode_rows_step(fw, attention, page, kernels=kernels)(tok, pos, table, cos,
                                                                                              sin, k, v), k, v)
            diff = (got["paged"][0] - got["matmul"][0]).abs().max().item()
            assert diff < 2e-3, (family, diff)
            for a, b in zip(got["paged"][1] + got["paged"][2], got["matmul"][1] + got["matmul"][2]):
                assert torch.allclose(a, b, atol=1e-4), (family, (a - b).abs().max())
            print(family, "OK")
        print("OK")
    """)
    assert out.strip().endswith("OK"), out


def test_the_six_kernel_layer_decodes_as_the_step_with_kernels():
    """``StepVariant.gemv``'s layer (``fast.gemv_step``: every projection in ``kernels.gemv`` with
    its norm, residual sum or gated activation, the attention in the fused Triton kernel) against
    the uncompiled step with nvkit's kernels on the same attention: Qwen2 (biases, no q/k norms),
    Qwen3 (per-head q/k norms), Granite (branch multipliers) and Mistral (a window), 8 steps in float32;
    the layouts it does not run say why, and the step they get is the usual one."""
    out = _interpret("""
        import torch
        from nvkit.generate.fast.fused_weights import FusedWeights
        from nvkit.generate.fast.gemv_step import gemv_parts, gemv_why
        from nvkit.generate.fast.llama_step import decode_step
        from tests.generate.test_families_step import tiny
        from tests.greedy_steps import cache_at, greedy_logits
        for family in ("Qwen2", "Qwen3", "Granite", "Mistral"):
            model = tiny(family)
            g = torch.Generator().manual_seed(3)
            with torch.no_grad():  # norms and biases that are not ones and zeros, so a dropped one shows
                for name, p in model.named_parameters():
                    if p.dim() == 1:
                        p.add_(torch.randn(p.shape, generator=g) * 0.3)
            fw = FusedWeights(model)
            assert gemv_why(fw, "triton-fused") is None, family
            parts = gemv_parts(fw, "triton-fused", True)
            assert set(parts) == {"layer", "head"} and gemv_parts(fw, "triton-fused", False) == {}
            logits = {}
            for name, kw in (("kernels", {}), ("gemv", parts)):
                c = cache_at(model, fw)
                logits[name] = greedy_logits(decode_step(fw, c, "triton-fused", None, kernels=True, **kw), c, 8)
            diff = (logits["gemv"] - logits["kernels"]).abs().max().item()
            assert diff < 1e-4 and torch.equal(logits["gemv"].argmax(-1), logits["kernels"].argmax(-1)), (family, diff)
            print(family, diff)
        for family, words in (("Gemma2", "SiLU"), ("Olmo2", "Llama layout"), ("Phi3", None)):
            fw = FusedWeights(tiny(family))
            why = gemv_why(fw, "triton-fused")
            assert (why is None) if words is None else (words in why), (family, why)
            assert (gemv_parts(fw, "triton-fused", True) == {}) == bool(words), family
        assert "triton-fused" in gemv_why(FusedWeights(tiny("Llama")), "matmul")
        print("OK")
    """)
    print(out)
    assert out.strip().endswith("OK"), out


def test_the_six_kernel_layer_adds_an_adapter_as_the_step_with_kernels():
    """An unmerged adapter on the six-kernel layers (x A.T in ``gemv``, its B product in the
    projection's kernel) against the uncompiled step with nvkit's kernels and the same adapter
    buffers, apart and folded (the six-kernel layers run a folded adapter's products apart):
    Qwen3 and Granite (branch multipliers), a random adapter on every projection, 8 steps in
    float32; an adapter in another dtype than the model's or float32 keeps the usual step."""
    out = _interpret("""
        import torch
        from peft import LoraConfig, get_peft_model
        from nvkit.generate.fast import lora as lora_mod
        from nvkit.generate.fast.fused_weights import FusedWeights
        from nvkit.generate.fast.gemv_step import gemv_parts, gemv_why, gemv_words
        from nvkit.generate.fast.llama_step import decode_step
        from tests.generate.test_families_step import tiny
        from tests.greedy_steps import cache_at, greedy_logits
        for family in ("Qwen3", "Granite"):
            torch.manual_seed(4)
            base = tiny(family)
            model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                    init_lora_weights=False))
            for fold in (False, True):
                fw = FusedWeights(base, spare=16 if fold else 0)
                lo = lora_mod.LoraSlots(fw, 4, torch.float32, fold=fold)
                assert lo.folded == fold and lo.load(model)
                parts = gemv_parts(fw, "triton-fused", True, lora=lo)
                assert set(parts) == {"layer", "head"}, family
                assert "adapter's products apart" in gemv_words(fw, "triton-fused", False, lo)
                logits = {}
                for name, kw in (("kernels", {}), ("gemv", parts)):
                    c = cache_at(base, fw)
                    logits[name] = greedy_logits(decode_step(fw, c, "triton-fused", lo, kernels=True, **kw), c, 8)
                c = cache_at(base, fw)  # the adapter moves the logits: it is not a no-op here
                plain = greedy_logits(decode_step(fw, c, "triton-fused", None, kernels=True), c, 1)
                assert (plain - logits["kernels"][:1]).abs().max().item() > 1e-3
                diff = (logits["gemv"] - logits["kernels"]).abs().max().item()
                assert diff < 1e-4 and torch.equal(logits["gemv"].argmax(-1), logits["kernels"].argmax(-1)), \\
                    (family, fold, diff)
                print(family, fold, diff)
            half = lora_mod.LoraSlots(FusedWeights(base), 4, torch.float16)
            assert "adapter's dtype" in gemv_why(FusedWeights(base), "triton-fused", half)
            assert gemv_parts(FusedWeights(base), "triton-fused", True, lora=half) == {}
        print("OK")
    """)
    assert out.strip().endswith("OK"), out


def test_the_rows_prefill_with_kernels_computes_what_the_prefill_of_torch_operations_does():
    """The eager rows prefill with ``kernels=True`` (its norms, residual sums and activation in
    nvkit's kernels, the projections torch's) against ``kernels=False``, in float32 over a group of
    3 padded prompts, for the layouts the kernels take apart: Llama's (the demo model), Gemma 3's
    (norms after each branch, GELU, sliding layers with a rotary table of their own), OLMo 2's
    (norms rounded weight first, q and k normed over all heads), Granite's (residual
    multiplier), Qwen3's (q and k normed per head, in ``prefill_rope``) and Phi-3's (partial
    rotary; also with heads of 24, not a power of two, as Phi-4-mini's 96): the same last-token
    logits and the same keys and values written. The compiled prefill traces the layer of torch's
    operations (``traced_layer``)."""
    out = _interpret("""
        import torch
        import nvkit
        from tests import demo_model
        from nvkit.generate.fast.fused_weights import FusedWeights
        from nvkit.generate.fast.llama_rows_step import paged_positions, prefill_rows_step
        from tests.generate.test_families_step import tiny
        page, pages = 16, 16

        import nvkit.generate.kernels.prefill_rope as fused_rope
        calls = []
        real = fused_rope.prefill_rope
        fused_rope.prefill_rope = lambda *a, **k: calls.append(1) or real(*a, **k)
        s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
        models = (("demo", s.model), *((f, tiny(f)) for f in ("Gemma3Text", "Olmo2", "Granite", "Qwen3", "Phi3")),
                  ("Phi3/24", tiny("Phi3", hidden_size=96)))
        for name, model in models:
            fw = FusedWeights(model)
            g = torch.Generator().manual_seed(1)
            rows, length = 3, 24
            with torch.inference_mode():
                table = (torch.randperm(pages - 1, generator=g)[:rows * 2] + 1).view(rows, 2).to(torch.int32)
                where = paged_positions(table, page, length)
                ids = torch.randint(1, 100, (rows, length), generator=g)
                last = torch.tensor([23, 9, 15])
                cos, sin = fw.rotary(length)
            results = {}
            for kernels in (False, True):
                step = prefill_rows_step(fw, kernels=kernels)
                assert (step.traced_layer is step.eager_layer) == (not kernels)
                keys = [torch.zeros(pages * page, fw.nkv, fw.hd) for _ in fw.layers]
                values = [torch.zeros(pages * page, fw.nkv, fw.hd) for _ in fw.layers]
                with torch.inference_mode():
                    results[kernels] = (step(ids, last, where, cos, sin, keys, values), keys, values)
            (ref, k_ref, v_ref), (got, k_got, v_got) = results[False], results[True]
            diff = (got - ref).abs().max().item()
            assert diff < 1e-3 and float(ref.abs().max()) > 0.1, (name, diff)
            assert torch.equal(got.argmax(-1), ref.argmax(-1)), name
            assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(k_got + v_got, k_ref + v_ref)), name
            # every layer's q/k norms, RoPE and pool writes in one launch
            assert len(calls) == len(fw.layers), (name, fw.hd, len(calls))
            assert name != "Phi3/24" or fw.hd == 24, fw.hd
            calls.clear()
            print(name, fw.weight_first, fw.activation, diff)
        print("OK")
    """)
    print(out)
    assert out.strip().endswith("OK") and out.count(" ") > 8, out
