"""nvkit's norm kernels (``nvkit.generate.kernels.add_rms_norm``) in bfloat16 on the GPU, which
Triton's interpreter cannot check (it rounds bf16 by truncation): every form against
``llama_step.rms_norm`` and a plain sum in torch's operations, in both roundings."""
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (Triton kernels)", allow_module_level=True)

from nvkit.generate.fast.llama_step import rms_norm as ref_norm  # noqa: E402
from nvkit.generate.kernels.add_rms_norm import add_rms_norm, rms_norm  # noqa: E402


def close(a, b):
    # one bf16 rounding apart at most (the kernel sums in another order than torch's mean)
    return torch.allclose(a.float(), b.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("weight_first", [False, True])
@pytest.mark.parametrize("shape", [(1, 1152), (64, 3072), (7, 2560)])
def test_every_form_matches_torchs_operations_in_bf16(shape, weight_first):
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    h, a = torch.randn(shape, generator=g, **bf), torch.randn(shape, generator=g, **bf) * 4
    n = shape[-1]
    if weight_first:  # Gemma's float32 1 + w
        post = 1.0 + torch.randn(n, generator=g, device="cuda") * 0.1
        pre = 1.0 + torch.randn(n, generator=g, device="cuda") * 0.1
    else:
        post, pre = torch.randn(n, generator=g, **bf), torch.randn(n, generator=g, **bf)
    total, x = add_rms_norm(h, a, pre, 1e-6, weight_first)
    assert torch.equal(total, h + a) and close(x, ref_norm(h + a, pre, 1e-6, weight_first))
    normed = ref_norm(a, post, 1e-6, weight_first)
    total, x = add_rms_norm(h, a, pre, 1e-6, weight_first, delta_norm=post, delta_eps=1e-6)
    assert close(total, h + normed) and close(x, ref_norm(h + normed, pre, 1e-6, weight_first))
    alone = rms_norm(a, post, 1e-6, weight_first)
    assert alone.dtype == normed.dtype and close(alone, normed)
