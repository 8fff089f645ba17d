"""``generate(..., deterministic=True)``: a prompt's text is the one it gets alone, in a list of any
size. On the CPU: the batch-invariant rows decoder (``rows_invariant``) run by Triton's
interpreter (a child process: TRITON_INTERPRET=1 must be set before triton is imported) gives each
prompt alone and in lists (rows padded to a larger class, refilled) the same tokens; a session on
the CPU runs each prompt of a list alone on plain ``generate``; what the invariant path cannot run
is said, and fast=True makes it an error. The GPU run (alone against lists of 2–40 on the Qwen3
shape) is in tests/gpu/test_batched_gpu.py."""

from __future__ import annotations

import pytest

from nvkit.errors import NvkitError
from tests.generate.test_families_step import _session
from tests.triton_interpreter import interpret as _interpret

PROMPTS = ["A", "NVIDIA GPUs are", "The memory of a GPU holds the weights, the KV cache and " * 6,
           "Training a model on many prompts at once", "CUDA graphs replay"]


def test_the_invariant_rows_decoder_gives_each_prompt_its_own_tokens_in_any_list():
    """Small Qwen3, Gemma 3 and OLMo 2 models (the interpreter is slow, so two layers and a few
    tokens): each prompt alone (one row) and in lists (rows padded to a class of 4, a row refilled)
    gives the same tokens, the model's own greedy text, with every product of the step in
    ``invariant_linear``; with a LoRA adapter too (on Qwen3)."""
    pytest.importorskip("triton", reason="triton is part of the test extra on Linux (pyproject)")
    out = _interpret("""
        import torch, transformers
        import nvkit.generate.fast as fast
        from nvkit.generate.kernels import invariant_linear as il
        from nvkit.generate.fast.rows_invariant import InvariantRowsDecoder
        from nvkit.generate.kernels import paged_attention as pa
        # the interpreter runs each of the attention's programs in turn: 4 slices per row and KV
        # head, not the GPU's 16; any fixed count keeps a row's sums its own, which is what is checked
        pa.INVARIANT_SPLITS = 4
        from tests.generate.test_families_step import SIZES
        calls = []
        product = il.invariant_linear
        il.invariant_linear = lambda x, w, b=None: calls.append(x.reshape(-1, x.shape[-1]).shape[0]) or product(x, w, b)
        rng = torch.Generator().manual_seed(3)
        prompts = [torch.randint(1, SIZES["vocab_size"], (n,), generator=rng).tolist() for n in (4, 30, 9, 17, 2)]
        from tests.generate.test_families_step import ALL_FAMILIES
        # Qwen3 (q/k norms in the paged kernel); Gemma 3 (norms after the branches, a window of 6
        # crossed by the longer prompts, a sliding layer's rotary table); OLMo 2 (norms after the
        # branches and over all heads of q and k): every norm in the row kernels
        for family, extra in (("Qwen3", dict(head_dim=16, num_hidden_layers=2)),
                              ("Gemma3Text", dict(ALL_FAMILIES["Gemma3Text"], num_hidden_layers=2,
                                                  layer_types=["sliding_attention", "full_attention"])),
                              ("Olmo2", dict(num_hidden_layers=2))):
            torch.manual_seed(0)
            cfg = getattr(transformers, family + "Config")(**dict(SIZES, **extra))
            m = getattr(transformers, family.replace("Text", "") + "ForCausalLM")(cfg).eval()
            if family != "Qwen3":
                with torch.no_grad():  # norms that are not all ones (or zeros), so each one counts
                    for name, p in m.named_parameters():
                        if "norm" in name:
                            p.add_(torch.randn(p.shape) * 0.2)
            sampling, _ = fast.resolve(m, dict(max_new_tokens=5, do_sample=False, eos_token_id=10 ** 7))
            single = fast.FastDecoder(m, k_steps=2, graphs=False, attention="triton-fused")
            with torch.inference_mode():
                d = InvariantRowsDecoder(single, max_rows=4)
                calls.clear()
                alone = [d.generate([p], sampling)[0] for p in prompts]
                assert set(calls) == {1}, sorted(set(calls))  # the decode steps of one row: rung 1
                calls.clear()
                # five prompts through four rows: rung 4 and a row refilled; then two of them
                assert d.generate(prompts, sampling) == alone, family
                assert 4 in calls, sorted(set(calls))
                assert d.generate([prompts[3], prompts[1]], sampling) == [alone[3], alone[1]], family
                plain = [m.generate(torch.tensor([p]), pad_token_id=0, max_new_tokens=5, do_sample=False,
                                    eos_token_id=10 ** 7)[0, len(p):].tolist() for p in prompts]
                assert alone == plain, family  # and it is the model's own greedy text
                assert d.describe().startswith("batch-invariant kernels, fused step over rows, no CUDA graphs"), d.describe()
            if family != "Qwen3":
                continue  # the adapters' kernels are the same for every layout: checked once
            # with a LoRA adapter attached (merged into a copy, and apart: its products in lora_add's
            # row kernels): PEFT's greedy text, alone and in the list
            from peft import LoraConfig, get_peft_model
            torch.manual_seed(1)
            pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                              init_lora_weights=False)).eval()
            with torch.inference_mode():
                tuned = [pm.generate(input_ids=torch.tensor([p]), pad_token_id=0, max_new_tokens=5, do_sample=False,
                                     eos_token_id=10 ** 7)[0, len(p):].tolist() for p in prompts[:3]]
                assert tuned != plain[:3]  # the adapter changes the answer, so the checks can tell them apart
                assert [d.generate([p], sampling)[0] for p in prompts[:3]] == tuned, family
                # the rows read the batch-1 decoder's merged copy (its default), as a prompt alone does
                assert d.generate(prompts[:3], sampling) == tuned and "LoRA merged" in d.describe(), d.describe()
                apart = InvariantRowsDecoder(fast.FastDecoder(m, k_steps=2, graphs=False, attention="triton-fused",
                                                              lora_merged=False), max_rows=4)
                assert apart.generate(prompts[:3], sampling) == tuned and "LoRA unmerged" in apart.describe()
        print("OK")
    """)
    assert out.strip().endswith("OK"), out


@pytest.fixture(scope="module")
def s(cpu_demo):
    return cpu_demo


def test_on_the_cpu_each_prompt_of_a_list_runs_alone_and_gets_its_own_text(s):
    alone = [s.generate(p, max_new_tokens=12) for p in PROMPTS]
    progress = []
    got = s.generate(PROMPTS, max_new_tokens=12, deterministic=True, on_progress=lambda st: progress.append(st.prompts_done))
    assert got == alone
    st = s.last_stats
    assert st.path == "generate" and "each prompt runs alone on plain generate" in st.detail, st.detail
    assert "the model is on cpu" in st.detail and st.prompts_done == len(PROMPTS), st
    assert progress == list(range(1, len(PROMPTS) + 1)) and st.new_tokens == 12 * len(PROMPTS), (progress, st)
    assert st.time_to_first_token is not None and 0 < st.time_to_first_token <= st.seconds
    # one prompt: the same answer as without the flag; the session goes on as before
    assert s.generate(PROMPTS[1], max_new_tokens=12, deterministic=True) == alone[1]
    assert s.generate(PROMPTS[1], max_new_tokens=12) == alone[1]


def test_fast_true_with_deterministic_on_the_cpu_is_refused_and_the_session_goes_on(s):
    with pytest.raises(NvkitError, match="fast=True needs"):
        s.generate(PROMPTS[:2], max_new_tokens=4, deterministic=True, fast=True)
    assert isinstance(s.generate(PROMPTS[:2], max_new_tokens=4, deterministic=True), list)


def test_what_the_invariant_path_cannot_run_is_said(s, monkeypatch):
    """On a GPU the route would take the invariant path; here its reasons are asked directly: the
    placement (CPU), and a family the invariant step does not fit."""
    from nvkit.generate.fast import fused_fit, support
    gen = dict(max_new_tokens=4, do_sample=False)
    assert "replays CUDA graphs" in support.deterministic_why(s, gen)
    assert fused_fit.fusable_why(s.model) is None  # the demo model's layout fits
    monkeypatch.setattr(s.model.config, "model_type", "starcoder2")
    assert "model type 'starcoder2' is not one of" in fused_fit.fusable_why(s.model)
    r = support.route(s, PROMPTS[:2], gen, None, deterministic=True)
    assert r.path == "generate" and r.alone and "the model is on cpu" in r.why
    assert support.route(s, PROMPTS[:2], gen, False, deterministic=True).why == "fast=False"


@pytest.mark.parametrize("family, why", [("Llama", None), ("Qwen3", None), ("Granite", None), ("Olmo2", None),
                                         ("Gemma", None), ("Gemma2", None), ("Phi3", None),
                                         ("Starcoder2", "model type 'starcoder2' is not one of")])
def test_which_families_the_invariant_step_fits(family, why):
    from nvkit.generate.fast import support
    from tests.generate.test_families_step import tiny
    m = tiny(family)
    got = support.deterministic_why(_session(m), dict(max_new_tokens=4, do_sample=False))
    assert (got is None) if why is None else (why in got), got


def test_an_unexpected_failure_of_the_invariant_path_runs_each_prompt_alone(s, monkeypatch):
    """A failure that is not an NvkitError, before any token, leaves the request to plain
    ``generate`` one prompt at a time (still each prompt's own text), the stats line saying why."""
    from nvkit.generate import paths
    from nvkit.generate.fast import support

    def invariant_route(session, texts, gen, fast, stream=False, deterministic=False):
        assert deterministic
        return support.Route("fast batch", sampling=None, ids=[], invariant=True)

    def broken(session, req, route):
        assert route.invariant
        raise RuntimeError("a kernel blew up")
    alone = [s.generate(p, max_new_tokens=5) for p in PROMPTS[:3]]
    monkeypatch.setattr(support, "route", invariant_route)
    monkeypatch.setattr(paths, "run_batched", broken)
    assert s.generate(PROMPTS[:3], max_new_tokens=5, deterministic=True) == alone
    detail = s.last_stats.detail
    assert "it failed (RuntimeError: a kernel blew up)" in detail and "each prompt runs alone" in detail, detail
