"""nvkit's Triton kernels for the uncompiled decode step (``nvkit.generate.fast.step_kernels``), run by
Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be set before triton is imported: hence a
child process): each against its torch reference, in float16 and float32 (the interpreter rounds
bfloat16 by truncation, so bf16 is checked on the GPU: tests/gpu/test_fast_gpu.py), and the whole
fused step with the kernels against the step of torch operations on the demo model, with and
without an adapter. The GPU run is tests/gpu (the default batch-1 path runs these kernels)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

from tests.triton_interpreter import interpret as _interpret  # noqa: E402


def test_kernels_match_their_torch_references():
    out = _interpret("""
        import torch
        from nvkit.generate.fast import step_kernels as k
        torch.manual_seed(0)
        for dtype in (torch.float16, torch.float32):
            for shape in ((1, 1024), (3, 1000), (2, 2, 64)):   # one token; rows; a width not a power of two
                h, d = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
                w = torch.randn(shape[-1], dtype=dtype)
                total, x = k.add_rms_norm(h, d, w, 1e-6)
                rt, rx = k.add_rms_norm_reference(h, d, w, 1e-6)
                assert total.shape == shape and x.shape == shape and x.dtype == dtype
                assert torch.equal(total, rt)
                tol = 2e-3 if dtype == torch.float16 else 1e-5
                assert torch.allclose(x.float(), rx.float(), atol=tol * 8, rtol=tol), (x - rx).abs().max()
                gu = torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)
                act = k.silu_mul(gu)
                assert act.shape == shape
                assert torch.allclose(act.float(), k.silu_mul_reference(gu).float(), atol=tol * 8, rtol=tol)
            # an adapter's products: rank 48 (q, k and v of rank 16 stacked), the adapter in float32 or the model's dtype
            for adt in (torch.float32, dtype):
                x = torch.randn(2, 300, dtype=dtype)
                y = torch.randn(2, 1000, dtype=dtype)
                a, b = torch.randn(48, 300, dtype=adt) * 0.1, torch.randn(1000, 48, dtype=adt) * 0.1
                got, want = k.lora_add(y, x, a, b), k.lora_add_reference(y, x, a, b)
                assert got.dtype == dtype and got.shape == y.shape
                assert torch.allclose(got.float(), want.float(), atol=2e-3, rtol=2e-3), (got - want).abs().max()
        # the norm's weight in float32 (a model that keeps it so): the output follows torch's promotion
        h = torch.randn(1, 64, dtype=torch.float16)
        assert k.add_rms_norm(h, h, torch.ones(64), 1e-6)[1].dtype == torch.float32
        for bad in (lambda: k.add_rms_norm(h, h[:, :32], torch.ones(64), 1e-6),
                    lambda: k.add_rms_norm(h, h, torch.ones(32), 1e-6),
                    lambda: k.silu_mul(torch.ones(1, 7)),
                    lambda: k.lora_add(torch.ones(1, 10), torch.ones(1, 8), torch.ones(4, 8), torch.ones(10, 3))):
            try:
                bad()
            except ValueError as e:
                print("refused:", e)
            else:
                raise AssertionError("a wrong shape was accepted")
        print("OK")
    """)
    assert out.strip().endswith("OK") and out.count("refused:") == 4, out


def test_the_step_with_kernels_decodes_as_the_step_of_torch_operations():
    """The demo model's fused step in float32 with ``kernels=True`` against ``kernels=False``: the
    same logits within float32 rounding over 6 steps, with no adapter and with a random one."""
    out = _interpret("""
        import torch
        import nvkit
        from peft import LoraConfig, get_peft_model
        from tests import demo_model
        from nvkit.generate.fast import lora as lora_mod
        from nvkit.generate.fast.cache import new_cache
        from nvkit.generate.fast.fused import FusedWeights, decode_step
        torch.manual_seed(0)
        s = nvkit.load(demo_model.path(), device_map="cpu", dtype="float32")
        for adapter in (False, True):
            model = s.model
            if adapter:
                model = get_peft_model(s.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                           init_lora_weights=False))
            base = model.get_base_model() if adapter else model
            fw = FusedWeights(base)
            lo = None
            if adapter:
                lo = lora_mod.LoraSlots(fw, 8, torch.float32)
                lo.load(model)
            logits = {}
            for kernels in (False, True):
                c = new_cache(base, fw, 64, 1, torch.device("cpu"))
                step = decode_step(fw, c, "matmul", lo, kernels=kernels)
                c.tok.fill_(5)
                rows = []
                with torch.inference_mode():
                    for _ in range(6):
                        out = step(c.tok)
                        rows.append(out.clone())
                        c.tok.copy_(out.argmax(-1).view(1, 1))
                logits[kernels] = torch.cat(rows)
            diff = (logits[True] - logits[False]).abs().max().item()
            assert diff < 1e-3, (adapter, diff)
            assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
            print("adapter" if adapter else "base", diff)
            if adapter:
                model.unload()
        print("OK")
    """)
    print(out)
    assert out.strip().endswith("OK"), out
