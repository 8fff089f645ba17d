"""The CUDA graphs nvkit captures (``fast.cuda_graphs.capture``) keep working whatever happens to
the graphs captured before them.

cuBLAS keeps a workspace per (handle, stream), and every ``torch.cuda.graph`` captures on one
stream: without ``cuda_graphs.own_blas_workspace`` a graph bakes in the workspace an earlier graph
allocated in its own pool, and destroying that earlier graph (or a compiled model's CUDA graph
trees clearing the workspaces) leaves the later one writing into freed memory: an illegal memory
access, or another tensor overwritten (pytorch/pytorch#193402). On the H200 this crashed
``nvkit bench shape:qwen3-0.6b --decode --repeats 3 --paths "static+compile,fast"`` in its third round.
"""

import contextlib

import torch

from nvkit.generate.fast import cuda_graphs

# a decode-like GEMM (few rows, a long reduction): cuBLAS splits the reduction and needs its workspace
ROWS, K, N = 8, 8192, 2048


def _graph(a, b, out):
    def body():
        torch.matmul(a, b, out=out)
    return cuda_graphs.capture(torch.device("cuda"), body, lambda: None, compiling=False, warmups=1,
                               inductor=contextlib.nullcontext(), pool=torch.cuda.graph_pool_handle())


def test_a_graph_outlives_the_graph_captured_before_it():
    torch.manual_seed(0)
    dt = dict(device="cuda", dtype=torch.bfloat16)
    a1, b1, out1 = torch.randn(ROWS, K, **dt), torch.randn(K, N, **dt), torch.empty(ROWS, N, **dt)
    a2, b2, out2 = torch.randn(ROWS, K, **dt), torch.randn(K, N, **dt), torch.empty(ROWS, N, **dt)
    first = _graph(a1, b1, out1)
    second = _graph(a2, b2, out2)
    first.replay()
    second.replay()
    torch.cuda.synchronize()
    want = out2.clone()
    assert torch.equal(out1, torch.matmul(a1, b1))  # same kernel, same workspace size: the same bits
    del first  # its pool is freed; torch clears the capture stream's workspaces with it
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    filler = [torch.full((64 << 20,), 7, device="cuda", dtype=torch.uint8) for _ in range(16)]  # reuses the memory
    torch._C._cuda_clearCublasWorkspaces()  # as torch.compile's CUDA graph trees do around their captures
    for _ in range(3):
        second.replay()
    torch.cuda.synchronize()
    assert torch.equal(out2, want)
    assert all(bool((f == 7).all()) for f in filler)  # nothing of anyone else's was written over
