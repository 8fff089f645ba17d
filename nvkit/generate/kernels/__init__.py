"""nvkit's Triton kernels, one op per module (each op's torch reference lives in its test,
tests/generate/kernels/test_<op>.py):

- ``decode_attention``: one new token's attention over a contiguous static cache at batch 1, split
  over the cache length (``nvkit::decode_attention``), and its variant with the q/k norms, RoPE and
  the cache write fused in (``nvkit::decode_attention_rope``).
- ``paged_attention``: many rows, each at its own position, over a paged KV pool (the batched fast
  path; ``nvkit::paged_decode_attention``).
- ``add_rms_norm``, ``silu_mul``, ``lora_add`` (with ``linear``, a projection with an adapter's
  products): the elementwise work of the decode steps that run without ``torch.compile``.
- ``prefill_rope``: the eager rows prefill's q/k norms, RoPE and KV pool writes in one launch.
- ``invariant_linear``: a projection whose every row is computed as it is alone, whatever the row
  count (the batch-invariant step of ``deterministic=True``).
- ``common``: what several of them share (the attention kernels' slice merge and RoPE, row views).

Importing this package imports no Triton; importing one of its modules does.
"""
