"""What several of nvkit's Triton kernels share: the split-K attention kernels' q/k norm with RoPE
(``norm_rope``; the lanes and tables of a full or partial rotation from ``rope_lanes``, the rule
for the tables' width in ``rotary_width_fits``), one block's step of their online softmax
(``attend_block``), their score soft-capping (``tanh``) and the check
of its and the sliding window's arguments (``window_softcap_why``), their merge of the slices per
query head (``combine_kernel``; ``merge_kernel`` with the slice count at run time), the most slices
per KV head, the row view the elementwise kernels take their inputs in, and the SM count the
automatic launches are sized for (``device_sms``)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

try:  # Grid Dependency Control (Hopper on): what Programmatic Dependent Launch waits and signals with
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: pdl=True says so (``pdl_why``), nothing else needs them
    gdc_launch_dependents = gdc_wait = None

_SM_COUNT: dict = {}


def device_sms(device, interpreted: int) -> int:
    """The SM count of the CUDA ``device``, read once per device, that the kernels size their
    automatic launches for; elsewhere (Triton's interpreter, which runs the programs one after
    another) ``interpreted``, the caller's figure."""
    if device.type != "cuda":
        return interpreted
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SM_COUNT:
        _SM_COUNT[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SM_COUNT[key]


MAX_SPLITS = 16  # slices of the cache per KV head: 8 KV heads x 16 programs fill a large GPU's SMs about once
#: the caches whose attention runs on tensor cores (``tl.dot``) by default on a GPU; an fp32 cache
#: keeps the fp32 products (``tl.dot`` on fp32 inputs would round them to TF32), and so does
#: Triton's interpreter (its bf16 ``tl.dot`` is not the GPU's)
DOT_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def rope_lanes(COS, SIN, d, HD: tl.constexpr, ROT: tl.constexpr):
    """For the lanes ``d`` (0..HD) of a head: each lane's rotate-half partner ``rd``, its ``sign``
    and the fp32 ``cos``/``sin`` of the current position, read from ``COS``/``SIN`` (ROT values).

    ROT < HD is partial rotary embedding (transformers' ``partial_rotary_factor``, e.g. Phi-3 and
    Phi-4-mini): only the first ROT dims rotate, among themselves (partner (d + ROT/2) mod ROT,
    negated in the first ROT/2), and the rest pass unchanged — their own partner, cos 1 and sin 0,
    so ``norm_rope`` gives x · 1 + x · 0 = x. ROT is a constexpr: a model's one width compiles one
    variant, and a full table (ROT == HD) compiles the plain rotation with no masks."""
    if ROT == HD:
        rd = (d + HD // 2) % HD                      # rotate_half: the other half of the head...
        sign = tl.where(d < HD // 2, -1.0, 1.0)      # ...negated for the first half
        cos = tl.load(COS + d).to(tl.float32)
        sin = tl.load(SIN + d).to(tl.float32)
    else:
        rot = d < ROT
        rd = tl.where(rot, (d + ROT // 2) % ROT, d)  # the pass dims are their own partner
        sign = tl.where(d < ROT // 2, -1.0, 1.0)
        cos = tl.load(COS + d, mask=rot, other=1.0).to(tl.float32)
        sin = tl.load(SIN + d, mask=rot, other=0.0).to(tl.float32)
    return rd, sign, cos, sin


def rotary_width_fits(rot: int, hd: int) -> bool:
    """Whether a rotary table ``rot`` values wide fits heads of ``hd``: the rotation pairs dim d
    with d + rot/2, so ``rot`` is even, and it covers at least one pair and at most the head."""
    return rot % 2 == 0 and 2 <= rot <= hd


@triton.jit
def norm_rope(x, xr, W, d, rd, sign, cos, sin, eps, HAS_NORM: tl.constexpr, HD: tl.constexpr):
    """RMS-normalise rows of ``x`` (fp32, (rows, HD); ``xr`` the same rows at the partner lanes
    ``rd``) over the whole head with weight ``W`` when HAS_NORM, then apply rotary embedding
    (rotate-half form; lanes, signs and tables from ``rope_lanes``, so partial rotation too: the
    norm covers every dim, as transformers' q_norm/k_norm run before RoPE)."""
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HD + eps)
        x = x * rstd[:, None] * tl.load(W + d).to(tl.float32)[None, :]
        xr = xr * rstd[:, None] * tl.load(W + rd).to(tl.float32)[None, :]
    return x * cos[None, :] + sign[None, :] * xr * sin[None, :]


@triton.jit
def attend_block(q, k, v, ok, m, s_sum, acc, scale, softcap, SOFTCAP: tl.constexpr, DOT: tl.constexpr):
    """One block of cache positions in a slice's online softmax: the scores of the query heads
    ``q`` (rows, head_dim) against the block's keys ``k`` (block, head_dim), soft-capped where
    ``SOFTCAP``, the positions outside ``ok`` (block,) masked, and the running max ``m``, sum
    ``s_sum`` (rows,) and weighted sum of values ``acc`` (rows, head_dim; all float32) updated.
    ``DOT``: both products on tensor cores (``tl.dot``: ``q`` in the cache's dtype, rows a multiple
    of 16, the weights rounded to that dtype as a 16-bit matmul rounds them); else ``q`` in float32
    and the products and sums in float32. Returns (m, s_sum, acc)."""
    if DOT:
        s = tl.dot(q, tl.trans(k)) * scale
    else:
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2) * scale
    if SOFTCAP:
        s = softcap * tanh(s / softcap)
    s = tl.where(ok[None, :], s, float("-inf"))
    # finite: the callers' every block holds a position the query sees (the first block holds the
    # window's first key or starts past it; every later block's first position is seen)
    m_new = tl.maximum(m, tl.max(s, axis=1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    s_sum = s_sum * alpha + tl.sum(p, axis=1)
    if DOT:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    else:
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
    return m_new, s_sum, acc


@triton.jit
def tanh(x):
    """tanh in plain ``tl.exp`` (Triton's interpreter has no libdevice): on -|x|, so the exponential
    lies in (0, 1] and never overflows to inf/inf = NaN, then the sign restored."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


def launch_why(num_stages=None, dot: bool = False, **powers_of_two) -> str | None:
    """Why a split kernel's launch shape cannot run (None: it can): each of ``powers_of_two``
    (slices, blocks or pages per loop step, warps) a power of two or None, ``dot`` a bool,
    ``num_stages`` a whole number from 1 to 8 or None."""
    for name, value in powers_of_two.items():
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1
                                      and value & (value - 1) == 0):
            return f"{name} must be a power of two, not {value!r}"
    if not isinstance(dot, bool):
        return f"dot must be True or False, not {dot!r}"
    if num_stages is not None and not (isinstance(num_stages, int) and not isinstance(num_stages, bool)
                                       and 1 <= num_stages <= 8):
        return f"num_stages must be a whole number from 1 to 8, not {num_stages!r}"
    return None


def pdl_why(device, pdl: bool = True) -> str | None:
    """Why a kernel cannot be launched with Programmatic Dependent Launch (``pdl=True``) on
    ``device`` (None: it can, or ``pdl`` is False); a ``pdl`` argument that is not a bool is refused."""
    if not isinstance(pdl, bool):
        return f"pdl must be True or False, not {pdl!r}"
    if not pdl:
        return None
    if gdc_wait is None:
        return f"pdl=True needs a Triton with grid dependency control (this one is {triton.__version__})"
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return "pdl=True needs a CUDA GPU of compute capability 9.0 or more (Hopper on)"
    return None


def window_softcap_why(window, softcap) -> str | None:
    """Why the attention kernels' ``window`` (keys pos - window < j <= pos; 0: every key up to pos)
    and ``softcap`` (scores softcap · tanh(score / softcap); 0: none) do not fit (None when they do)."""
    if not (isinstance(window, int) and not isinstance(window, bool) and window >= 0):
        return f"window must be a whole number >= 0 (0: no window), not {window!r}"
    if not (isinstance(softcap, (int, float)) and not isinstance(softcap, bool)
            and math.isfinite(softcap) and softcap >= 0):
        return f"softcap must be a finite number >= 0 (0: no soft-capping), not {softcap!r}"
    return None


# A window wider than any position is no window; past this the kernels' run-time argument would
# change type (Triton passes a larger int as int64) and compile a second variant.
MAX_WINDOW = 2 ** 31 - 1


@triton.jit
def combine_kernel(M, L, O, OUT, N_SPLITS: tl.constexpr, HD: tl.constexpr, PDL: tl.constexpr = False):
    """Merges one query head's slices (running max ``M``, sum ``L``, weighted sum ``O``) into ``OUT``;
    ``PDL``: launched with Programmatic Dependent Launch after the kernel that wrote the slices."""
    if PDL:
        gdc_wait()  # the slices are the kernel before's outputs
        gdc_launch_dependents()
    h = tl.program_id(0)
    sp = tl.arange(0, N_SPLITS)
    d = tl.arange(0, HD)
    m = tl.load(M + h * N_SPLITS + sp)
    s_sum = tl.load(L + h * N_SPLITS + sp)
    # a slice with no position up to pos (m = -inf: a short sequence in a long cache) wrote a
    # weighted sum of zeros; it is not read
    o = tl.load(O + (h * N_SPLITS + sp)[:, None] * HD + d[None, :], mask=(m > float("-inf"))[:, None], other=0.0)
    top = tl.max(m, axis=0)  # finite: the slice that holds pos has at least pos itself
    w = tl.exp(m - top)      # 0 for the slices with no position in the window up to pos (m = -inf)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * s_sum, axis=0)
    tl.store(OUT + h * HD + d, out.to(OUT.dtype.element_ty))


# the slice count is not specialised on (Triton compiles a variant for a count of 1): one compiled
# merge serves every count, so a new count (another row count of the paged kernel) compiles nothing
@triton.jit(do_not_specialize=["n_splits"])
def merge_kernel(M, L, O, OUT, n_splits, MAX_N: tl.constexpr, HD: tl.constexpr):
    """``combine_kernel`` with the number of slices a run-time value, up to ``MAX_N``."""
    h = tl.program_id(0)
    sp = tl.arange(0, MAX_N)
    live = sp < n_splits
    d = tl.arange(0, HD)
    m = tl.load(M + h * n_splits + sp, mask=live, other=float("-inf"))
    s_sum = tl.load(L + h * n_splits + sp, mask=live, other=0.0)
    o = tl.load(O + (h * n_splits + sp)[:, None] * HD + d[None, :], mask=(live & (m > float("-inf")))[:, None],
                other=0.0)
    top = tl.max(m, axis=0)  # finite: the slice that holds pos has at least pos itself
    # 0 for the slices with no position in the window up to pos (m = -inf; their sums are 0 too)
    # and for the lanes past n_splits
    w = tl.exp(m - top)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w * s_sum, axis=0)
    tl.store(OUT + h * HD + d, out.to(OUT.dtype.element_ty))


def next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` (..., n) as (rows, n) with a contiguous last dimension (a view where it can be)."""
    x = x.reshape(-1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()
