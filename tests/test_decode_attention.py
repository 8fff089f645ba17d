"""nvkit's decode attention kernels, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1,
which must be set before triton is imported: hence a child process). The GPU run of the same
kernels is tests/gpu/test_fast_gpu.py and the "fast+triton" decode benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _interpret(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_kernel_matches_reference_at_every_kind_of_position():
    out = _interpret("""
        import torch
        from nvkit import decode_attention as da
        torch.manual_seed(0)
        # (query heads, KV heads, head_dim, cache length, dtype): Qwen3-0.6B's layout, an odd group
        # (3 query heads per KV head, padded inside the kernel), no grouping, bf16
        for nh, nkv, hd, length, dtype in [(16, 8, 128, 512, torch.float32), (6, 2, 32, 256, torch.float32),
                                           (8, 8, 64, 256, torch.float32), (4, 2, 16, 256, torch.bfloat16)]:
            q, k, v = torch.randn(nh, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype), torch.randn(nkv, length, hd, dtype=dtype)
            for p in (0, 1, 37, length // 2, length - 1):  # first slice only ... every slice full
                pos = torch.tensor(p)
                got = da.decode_attention(q, k, v, pos, hd ** -0.5)
                ref = da.attend_reference(q, k, v, pos, hd ** -0.5)
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
        from nvkit import decode_attention as da
        ok = da.check_shapes(torch.zeros(16, 128), torch.zeros(8, 512, 128), torch.zeros(8, 512, 128))
        assert ok is None, ok
        assert "powers of two" in da.check_shapes(torch.zeros(4, 96), torch.zeros(2, 256, 96), torch.zeros(2, 256, 96))
        assert "cannot attend" in da.check_shapes(torch.zeros(5, 64), torch.zeros(2, 256, 64), torch.zeros(2, 256, 64))
        assert da.splits_for(256) == 8 and da.splits_for(512) == 16 and da.splits_for(8192) == 16
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_fast_decoder_with_triton_attention_decodes_like_matmul():
    """The whole fused step with attention='triton' (no CUDA graphs: the CPU checks the logic):
    the demo model's greedy tokens are the matmul path's, logits within bf16 rounding."""
    out = _interpret("""
        import torch, nvkit
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from nvkit import fast
        m = AutoModelForCausalLM.from_pretrained(nvkit.demo.path())
        tok = AutoTokenizer.from_pretrained(nvkit.demo.path())
        ids = tok("NVIDIA GPUs are", return_tensors="pt")["input_ids"]
        sampling, _ = fast._resolve(m, dict(max_new_tokens=12, do_sample=False, eos_token_id=10 ** 7))
        with torch.inference_mode():
            ref = fast.FastDecoder(m, k_steps=4, graphs=False)
            a = ref.generate(ids, sampling, keep_logits=True)
            tri = fast.FastDecoder(m, k_steps=4, graphs=False, attention="triton")
            b = tri.generate(ids, sampling, keep_logits=True)
        assert a == b, (a, b)
        la, lb = torch.stack(ref.last_logits), torch.stack(tri.last_logits)
        diff, scale = (la - lb).abs().max().item(), la.abs().max().item()
        # the demo weights are bf16: the matmul path rounds the probabilities to bf16, the kernel
        # keeps them in fp32, so the logits differ by bf16 rounding of the attention output
        assert m.dtype == torch.bfloat16 and diff <= 0.01 * scale, (diff, scale)
        print("ok", diff)
    """)
    assert out.strip().split()[0] == "ok"


def test_the_op_traces_whole_under_torch_compile():
    """The fused step is compiled with fullgraph=True: the op must trace (through its fake) without
    a graph break, read the cache as written just before it, and give the eager result."""
    out = _interpret("""
        import torch
        from nvkit import decode_attention as da
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
        ref = da.attend_reference(q, k.index_copy(1, pos.view(1), new_k), v, pos, 0.125) * 2
        assert torch.allclose(got, ref, atol=1e-5)
        print("ok")
    """)
    assert out.strip().endswith("ok")
