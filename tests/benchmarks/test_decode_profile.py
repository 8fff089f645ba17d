"""The decode profile's arithmetic (nvkit.benchmarks.decode_profile) on plain kernel records, and
``nvkit bench --decode --profile``'s refusals; the profile itself needs CUDA (tests/gpu)."""

import contextlib
import io

import pytest
import torch

from nvkit.benchmarks import backends, decode_profile
from nvkit.errors import NvkitError


def test_busy_time_is_the_union_of_the_kernels():
    assert decode_profile.busy_us([(0, 10), (5, 12), (20, 25)]) == 17  # an overlap counts once
    assert decode_profile.busy_us([(3, 4), (0, 10)]) == 10  # one inside another
    assert decode_profile.busy_us([]) == 0


def test_a_summary_per_token():
    kernels = [("sm90_xmma_gemm_bf16", 0, 30), ("triton_red_fused_add_rms_norm_0", 30, 40),
               ("paged_rope_split_kernel", 50, 60), ("sm90_xmma_gemm_bf16", 60, 90)]
    s = decode_profile.summarize(kernels, tokens=2, wall_s=200e-6, bytes_per_token=400_000, bandwidth=8e9)
    assert s.wall_us == 100 and s.kernels == 2 and s.busy_us == 40
    assert s.gap_share == pytest.approx(0.6)
    assert s.achieved == pytest.approx(4e9) and s.roofline == pytest.approx(0.5)
    assert s.by_kind["GEMM"] == (30, 1) and s.by_kind["nvkit attention"] == (5, 0.5)
    assert s.by_kind["inductor/Triton fused"] == (5, 0.5)
    text = s.text()
    assert "50% of the HBM roofline" in text and "60% idle" in text and "GEMM" in text
    assert decode_profile.summarize(kernels, 2, 200e-6, 400_000, None).roofline is None


@pytest.mark.parametrize("tokens, wall", [(0, 1.0), (3, 0.0), (3, -1.0)])
def test_a_summary_needs_tokens_and_time(tokens, wall):
    with pytest.raises(NvkitError, match="at least one token"):
        decode_profile.summarize([], tokens, wall, 1, None)


def _cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = backends.cli_main(list(argv))
    return code, err.getvalue()


@pytest.mark.parametrize("argv, match", [
    (("--profile",), "--profile belongs to --decode"),
    (("--lora", "--profile"), "--profile belongs to --decode"),
    (("--decode", "--profile", "--repeats", "3"), "--repeats does not apply to --decode --profile"),
    (("--decode", "--profile", "--new-tokens", "1"), "at least 2"),
    (("--decode", "--profile", "--json"), "--json does not apply"),
])
def test_the_command_refuses_what_does_not_apply(argv, match):
    code, err = _cli(*argv)
    assert code == 2 and match in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_without_cuda_the_profile_says_why():
    code, err = _cli("--decode", "--profile", "--new-tokens", "4")
    assert code == 2 and "needs a GPU" in err, err
