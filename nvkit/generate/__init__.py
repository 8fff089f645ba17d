"""Generation: which path runs a request (``paths``), plain ``generate``, continuous batching
(``batch``), nvkit's CUDA-graph fast path (``fast``) and its Triton kernels (``kernels``)."""
