"""nvkit's training loss: the LM head and the cross-entropy computed chunk by chunk, so the full
(tokens × vocab) logits never exist (the idea of Liger's fused linear cross-entropy, in plain
torch so it also runs on the CPU). With Qwen3's 152k vocabulary the logits and their fp32 copies
are most of plain PEFT's peak."""

from __future__ import annotations

from ..memory.estimate import loss_chunk_rows


# Model types whose causal-LM head is a plain (optionally tied) linear with no logit scaling or
# soft-capping, so the fused loss computes exactly what the model's own loss would.
_FUSED_LOSS_TYPES = {"qwen2", "qwen3", "llama", "mistral", "qwen2_moe", "qwen3_moe", "phi3", "olmo2", "smollm3"}


def fused_linear_cross_entropy(hidden, weight, labels, chunk: int | None = None):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``labels`` (-100 = ignore), computed chunk
    by chunk: the full (tokens × vocab) logits never exist, and the backward needs no recompute
    because each chunk's gradient w.r.t. ``hidden`` is formed right away. ``hidden`` (N, H),
    ``labels`` (N,) already aligned (shifted) with ``hidden``."""
    return _FusedLinearCE.apply(hidden, weight, labels, chunk or loss_chunk_rows(weight.shape[0]))


def _fused_ce_class():
    import torch

    class FusedLinearCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, hidden, weight, labels, chunk):
            # No value goes from the GPU to Python in here (no int(), bool() or .item() of a
            # tensor): each would make the CPU wait for the forward to finish before it queues the
            # rest of the step, and a LoRA step in eager mode is bound by those launches. So the
            # token count stays a tensor, and a chunk without targets is computed like any other
            # (it adds exact zeros) instead of being skipped on a test the CPU would wait for.
            n = hidden.shape[0]
            valid_all = labels != -100
            denom = valid_all.sum().clamp_min(1).to(torch.float32)
            need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            grad_h = torch.zeros_like(hidden) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for s in range(0, n, chunk):
                y = labels[s:s + chunk]
                valid = valid_all[s:s + chunk]
                h = hidden[s:s + chunk]
                logits = (h @ weight.t()).float()
                lse = torch.logsumexp(logits, dim=-1)
                yy = y.clamp_min(0)
                target = logits.gather(1, yy[:, None]).squeeze(1)
                total += torch.where(valid, lse - target, 0.0).sum()
                if need_h or need_w:
                    # d(mean CE)/d(logits) = (softmax - onehot) / count, formed in place
                    g = logits.sub_(lse[:, None]).exp_()
                    g.scatter_add_(1, yy[:, None], -torch.ones_like(lse)[:, None])
                    g.div_(denom).masked_fill_(~valid[:, None], 0.0)
                    g = g.to(h.dtype)
                    if need_h:
                        grad_h[s:s + chunk] = g @ weight
                    if need_w:
                        grad_w += (g.t() @ h).float()
            ctx.save_for_backward(*(t for t in (grad_h, grad_w) if t is not None))
            ctx.has = (need_h, need_w)
            ctx.w_dtype = weight.dtype
            return total / denom

        @staticmethod
        def backward(ctx, grad_out):
            saved = list(ctx.saved_tensors)
            need_h, need_w = ctx.has
            gh = gw = None
            if need_h:
                g = saved.pop(0)
                gh = g * grad_out.to(g.dtype)
            if need_w:
                gw = (saved.pop(0) * grad_out).to(ctx.w_dtype)
            return gh, gw, None, None

    return FusedLinearCE


class _FusedLinearCE:
    """Builds the autograd Function on first use, so importing this module doesn't import torch."""
    _cls = None

    @classmethod
    def apply(cls, *args):
        if cls._cls is None:
            cls._cls = _fused_ce_class()
        return cls._cls.apply(*args)


def causal_lm(model):
    """The transformers causal-LM module under a PEFT wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def fused_loss_supported(model) -> tuple[bool, str]:
    lm = causal_lm(model)
    cfg = getattr(lm, "config", None)
    mt = getattr(cfg, "model_type", None)
    if mt not in _FUSED_LOSS_TYPES:
        return False, f"model type {mt!r} may scale or cap its logits; using the model's own loss"
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    import torch
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return False, "the LM head is not a plain linear layer (adapted or quantized); using the model's own loss"
    return True, "fused linear cross-entropy (chunked; no full logits)"


def fused_causal_lm_loss(model, input_ids, labels, attention_mask=None):
    """Next-token loss of a causal LM through the decoder and the chunked fused loss."""
    lm = causal_lm(model)
    decoder = lm.get_decoder()
    kwargs = {"input_ids": input_ids, "use_cache": False}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    hidden = decoder(**kwargs).last_hidden_state
    h = hidden[:, :-1, :].reshape(-1, hidden.shape[-1])
    y = labels[:, 1:].reshape(-1)
    head = lm.get_output_embeddings()
    return fused_linear_cross_entropy(h, head.weight, y)


def fused_loss_forward(model):
    """Context in which the causal LM under ``model`` computes its training loss with the fused
    loss whenever it is called with ``labels`` (it returns the loss and no logits); calls without
    labels run the model's own forward. The loss then goes through the model's ``__call__``, so
    DDP's and FSDP2's hooks on the wrapped model run as they must (calling the decoder directly
    would bypass them)."""
    import contextlib

    @contextlib.contextmanager
    def installed():
        from transformers.modeling_outputs import CausalLMOutputWithPast
        lm = causal_lm(model)
        had_own = "forward" in vars(lm)
        original = lm.forward

        def forward(*args, labels=None, **kwargs):
            if labels is None or args:
                return original(*args, labels=labels, **kwargs)
            loss = fused_causal_lm_loss(lm, kwargs["input_ids"], labels, kwargs.get("attention_mask"))
            return CausalLMOutputWithPast(loss=loss)

        lm.forward = forward
        try:
            yield
        finally:
            if had_own:
                lm.forward = original
            else:
                del lm.forward

    return installed()


def loss_sum(model, input_ids, labels, fused: bool) -> tuple[float, int]:
    """(sum of the next-token cross-entropy over the target tokens, their count) for one batch,
    without gradients: the evaluation of held-out data. ``fused``: chunk by chunk through the LM
    head (no full logits), else through the model's own logits."""
    import torch
    lm = causal_lm(model)
    y = labels[:, 1:].reshape(-1)
    valid = y != -100
    count = int(valid.sum())
    if count == 0:
        return 0.0, 0
    with torch.no_grad():
        if fused:
            hidden = lm.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
            h = hidden[:, :-1, :].reshape(-1, hidden.shape[-1])
            weight = lm.get_output_embeddings().weight
            chunk = loss_chunk_rows(weight.shape[0])
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            for s in range(0, h.shape[0], chunk):
                v = valid[s:s + chunk]
                if not bool(v.any()):
                    continue
                logits = (h[s:s + chunk][v] @ weight.t()).float()
                total += torch.nn.functional.cross_entropy(logits, y[s:s + chunk][v], reduction="sum")
            return float(total), count
        logits = lm(input_ids=input_ids, use_cache=False).logits[:, :-1, :].float()
        total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y, ignore_index=-100,
                                                  reduction="sum")
        return float(total), count
