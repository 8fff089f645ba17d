"""Attention backends: which ones work on this device and why the others don't, and checking a
choice before anything is loaded.

Transformers itself only checks a GPU's capability when the flash-attn package is missing, falls
back to a Hub kernel without saying so, fails offline with a DNS error inside an ImportError, and
silently disables kernels when the ``kernels`` version is outside its range. ``attention_backends``
answers those questions up front, from package metadata, NVML and the local kernel cache, without
creating a CUDA context (so a GPU selection made afterwards still counts).

``"auto"`` picks the first available backend in ``AUTO_ORDER``, ordered by what ``nvkit.bench``
measured on the H200 (docs/benchmarks.md, "Attention backends"): sdpa was fastest in prefill and
decode and the others agree with its greedy tokens, so sdpa (which itself dispatches to PyTorch's
flash / memory-efficient kernels) comes first; the FlashAttention backends follow for when sdpa is
unavailable, newest first (FA2/FA3 were not measurable offline: their Hub kernels could not be
fetched). Measure your GPU and lengths with
``nvkit.bench(MODEL, backends=["sdpa", "flash_attention_4"], prompt_len=...)``; pass a backend by
name to use it regardless.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import NvkitError
from ..hardware.inventory import gpus
from ..hardware.selection import selection

BUILTIN = ("eager", "sdpa")
NAMES = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention")
AUTO_ORDER = ("sdpa", "flash_attention_4", "flash_attention_3", "flash_attention_2", "eager")  # see the docstring

# What transformers 5.22 falls back to when the FlashAttention package is missing, and the kernel
# major version it asks for (transformers.modeling_flash_attention_utils.FLASH_ATTN_KERNEL_*).
HUB_KERNELS = {
    "flash_attention_2": ("kernels-community/flash-attn2", 4),
    "flash_attention_3": ("kernels-community/vllm-flash-attn3", 1),
    "flash_attention_4": ("kernels-community/flash-attn4", 0),
}
MIN_CAPABILITY = {"flash_attention_2": (8, 0), "flash_attention_3": (8, 0), "flash_attention_4": (9, 0)}
PACKAGES = {  # backend -> (distribution, module that must be importable)
    "flash_attention_2": ("flash-attn", "flash_attn"),
    "flash_attention_3": ("flash-attn-3", "flash_attn_interface"),
    "flash_attention_4": ("flash-attn-4", "flash_attn.cute"),
}
# transformers 5.20-5.22 accept kernels >= 0.17.2, < 0.18 (transformers.utils.import_utils)
KERNELS_RANGE = ("0.17.2", "0.18.0")


@dataclass(frozen=True)
class Choice:
    """One option (attention backend or quantization method) on one device."""

    name: str
    available: bool
    reason: str          # why not (or, when available, a short note; "" when nothing to add)
    source: str          # "built-in", "package flash-attn-4 4.0.0b36", "Hub kernel org/repo", "local kernel directory ..."

    def __str__(self) -> str:
        return f"{'yes' if self.available else 'no '} {self.name:<20} {self.source:<40} {self.reason}"


class ChoiceList(list):
    """A list of Choice that prints as a table (and as HTML in a notebook)."""

    def names(self, available: bool = True) -> list[str]:
        return [c.name for c in self if c.available == available]

    def __getitem__(self, key):
        if isinstance(key, str):
            for c in self:
                if c.name == key:
                    return c
            raise KeyError(key)
        return super().__getitem__(key)

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self)

    def _repr_html_(self) -> str:
        import html
        rows = "".join(
            f"<tr><td>{html.escape(c.name)}</td><td>{'✔' if c.available else '✘'}</td>"
            f"<td>{html.escape(c.source)}</td><td style='text-align:left'>{html.escape(c.reason)}</td></tr>"
            for c in self)
        return ("<table class='nvkit-choices'><tr><th>name</th><th>available</th><th>source</th>"
                f"<th>why / note</th></tr>{rows}</table>")


# --- facts about this machine (no CUDA context) ------------------------------------------------

def package_version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def version_tuple(v: str) -> tuple:
    from packaging.version import Version
    return Version(v).release


def kernels_problem() -> str | None:
    """Why Hub kernels can't be used with this transformers, or None."""
    v = package_version("kernels")
    if v is None:
        return "the `kernels` package is not installed (pip install kernels==0.17.2)"
    lo, hi = KERNELS_RANGE
    if not (version_tuple(lo) <= version_tuple(v) < version_tuple(hi)):
        return (f"kernels {v} is outside the range transformers {package_version('transformers')} accepts "
                f"(>= {lo}, < {hi}); transformers then silently disables Hub kernels: pip install kernels=={lo}")
    return None


def hub_offline() -> bool:
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")


_reach_lock = threading.Lock()
_reach_cache: tuple[float, bool] | None = None


def hub_reachable(timeout: float = 1.5) -> bool:
    """False when HF_HUB_OFFLINE is set; otherwise whether huggingface.co answers on 443 (cached 60 s)."""
    global _reach_cache
    if hub_offline():
        return False
    with _reach_lock:
        if _reach_cache and time.monotonic() - _reach_cache[0] < 60:
            return _reach_cache[1]
        try:
            from huggingface_hub import constants
            host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
            socket.create_connection((host.split(":")[0], 443), timeout=timeout).close()
            ok = True
        except OSError:
            ok = False
        _reach_cache = (time.monotonic(), ok)
        return ok


def local_kernels() -> dict[str, Path]:
    """LOCAL_KERNELS (``org/repo=/path:org/repo2=/path2``) as a dict; bad entries are skipped here
    (kernels itself raises on them, and ``nvkit.load`` reports that)."""
    out = {}
    for entry in (os.environ.get("LOCAL_KERNELS") or "").split(":"):
        if "=" in entry:
            repo, path = entry.split("=", 1)
            out[repo.strip()] = Path(path.strip()).expanduser()
    return out


def _cache_roots() -> list[Path]:
    from huggingface_hub import constants
    roots = [os.environ.get("KERNELS_CACHE"), constants.HF_HUB_CACHE]
    return [Path(r) for r in roots if r]


def kernel_in_cache(repo_id: str, version: int | None = None) -> Path | None:
    """The cached snapshot folder of a Hub kernel (for that major ``version`` if given), or None.
    Same layout kernels reads offline: ``kernels--org--name/refs/v{N}`` (or the legacy ``models--``)."""
    for root in _cache_roots():
        for kind in ("kernels", "models"):
            d = root / f"{kind}--{repo_id.replace('/', '--')}"
            if not d.is_dir():
                continue
            if version is None:
                snaps = d / "snapshots"
                if snaps.is_dir() and any(snaps.iterdir()):
                    return d
                continue
            ref = d / "refs" / f"v{version}"
            if ref.is_file() and (d / "snapshots" / ref.read_text().strip()).is_dir():
                return d
    return None


def kernel_source(repo_id: str, version: int | None = None) -> tuple[bool, str, str]:
    """(usable, source, reason) for a Hub kernel repo: LOCAL_KERNELS, then the local cache, then
    the Hub itself."""
    local = local_kernels().get(repo_id)
    if local is not None:
        if local.is_dir():
            return True, f"local kernel directory {local}", f"LOCAL_KERNELS maps {repo_id} here"
        return False, f"Hub kernel {repo_id}", f"LOCAL_KERNELS points {repo_id} at {local}, which does not exist"
    cached = kernel_in_cache(repo_id, version)
    if cached is not None:
        return True, f"Hub kernel {repo_id} (cached)", f"in the local cache at {cached}"
    if hub_reachable():
        return True, f"Hub kernel {repo_id}", "downloaded from the Hub at first use"
    why = "HF_HUB_OFFLINE is set" if hub_offline() else "the Hugging Face Hub is unreachable"
    return False, f"Hub kernel {repo_id}", (
        f"{why} and {repo_id}{f' v{version}' if version is not None else ''} {_NOT_HERE}. "
        f"{how_to_bring_in(repo_id, version)}")


_NOT_HERE = "is neither in the local kernel cache nor in LOCAL_KERNELS"
# a flash backend's reason when its package is missing and its Hub kernel is out of reach
# (_flash_choice wrapping kernel_source's reason)
_KERNEL_GAP = re.compile(r"(?P<head>.*Hub kernel fallback: )(?P<why>.+?) and (?P<kernel>\S+(?: v(?P<v>\d+))?) "
                         + re.escape(_NOT_HERE) + r"\. Bring it in: .*", re.S)


def fold_kernel_gaps(reasons: dict) -> tuple[dict, str | None]:
    """For a listing of several backends (``nvkit doctor``): each name's reason, with the part
    that several share (the Hub is out of reach, the kernel is not here, how to bring one in) said
    once, in the returned note, which the shortened reasons refer to. Other reasons, and a listing
    where no reason has that part, come back as they are (note None)."""
    short, gaps = {}, []
    for name, reason in reasons.items():
        m = _KERNEL_GAP.fullmatch(reason or "")
        if m is None:
            short[name] = reason
            continue
        short[name] = f"{m['head']}{m['kernel']} is not here (see Hub kernels below)"
        gaps.append(m)
    if not gaps:
        return short, None
    whys = " / ".join(dict.fromkeys(m["why"] for m in gaps))
    first = gaps[0]
    example = how_to_bring_in(first["kernel"].split(" ")[0], int(first["v"]) if first["v"] else None)
    return short, (f"Hub kernels ({', '.join(m['kernel'] for m in gaps)}): {whys}, and none of them is in the local "
                   f"kernel cache or in LOCAL_KERNELS. {example.replace('Bring it in:', 'Bring one in, e.g.', 1)}")


def how_to_bring_in(repo_id: str, version: int | None = None) -> str:
    v = f" --revision v{version}" if version is not None else ""
    return (f"Bring it in: on a machine online run `hf download {repo_id} --repo-type kernel{v}` and copy the "
            f"HF cache folder (~/.cache/huggingface/hub/kernels--{repo_id.replace('/', '--')}) here, "
            f"or put the kernel directory here and set LOCAL_KERNELS={repo_id}=/path/to/it.")


def _find_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# --- the device --------------------------------------------------------------------------------

def device_spec(device) -> tuple[str, int]:
    """("cpu"|"cuda", index) for None / "cpu" / "cuda" / "cuda:1" / 1 / torch.device."""
    if device is None:
        return ("cuda", 0) if _visible_gpu_count() > 0 else ("cpu", 0)
    if isinstance(device, bool):
        raise NvkitError(f"device must be 'cpu', 'cuda', 'cuda:N' or a GPU number, not {device!r}.")
    if isinstance(device, int):
        if device < 0:
            raise NvkitError(f"device must be 'cpu', 'cuda', 'cuda:N' or a GPU number ≥ 0, not {device!r}.")
        return "cuda", device
    text = str(device).strip().lower()
    if text == "cpu":
        return "cpu", 0
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise NvkitError(f"device must be 'cpu', 'cuda', 'cuda:N' or a GPU number, not {device!r}.")


def existing_device(device) -> tuple[str, int]:
    """``device_spec(device)``, and for a CUDA device the check that it exists in this process."""
    device_type, index = device_spec(device)
    if device_type == "cuda":
        n = _visible_gpu_count()
        if index >= n:
            raise NvkitError(f"cuda:{index} does not exist here: {n} CUDA device(s) visible"
                             + (f" (cuda:0..cuda:{n - 1})." if n else ". Use device='cpu'."))
    return device_type, index


def _torch_cuda_up() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _visible_gpu_count() -> int:
    if _torch_cuda_up():
        return sys.modules["torch"].cuda.device_count()
    try:
        return len(selection().devices)
    except NvkitError:
        raise
    except Exception:  # selection/NVML unavailable: no GPU we could name
        return 0


def device_capability(index: int = 0) -> tuple[tuple[int, int] | None, str]:
    """(capability, GPU name) of cuda:``index``, from torch if CUDA is already up, else NVML."""
    if _torch_cuda_up():
        torch = sys.modules["torch"]
        return tuple(torch.cuda.get_device_capability(index)), torch.cuda.get_device_name(index)
    devs = selection().devices
    if index >= len(devs):
        return None, "?"
    phys = devs[index].index
    for g in gpus(processes=False):
        if g.index == phys:
            return g.capability, g.name
    return None, devs[index].name or "?"


# --- the backends ------------------------------------------------------------------------------

def _flash_choice(name: str, device_type: str, capability, gpu_name: str) -> Choice:
    dist, module = PACKAGES[name]
    repo, version = HUB_KERNELS[name]
    need = MIN_CAPABILITY[name]
    family = "Hopper" if need >= (9, 0) else "Ampere"
    if device_type != "cuda":
        return Choice(name, False, f"needs a CUDA GPU ({family} or newer); this is the CPU", "-")
    if capability is None:
        return Choice(name, False, "the GPU's compute capability is unknown (NVML did not report it)", "-")
    if tuple(capability) < need:
        return Choice(name, False, f"GPU too old: {name} needs {family} (compute capability ≥ {need[0]}.{need[1]}); "
                                   f"{gpu_name} is {capability[0]}.{capability[1]}", "-")
    pkg = package_version(dist)
    if pkg is not None:
        if name == "flash_attention_2" and version_tuple(pkg) < (2, 3, 3):
            return Choice(name, False, f"flash-attn {pkg} is older than the 2.3.3 transformers accepts", f"package {dist} {pkg}")
        if not _find_module(module):
            return Choice(name, False, f"{dist} {pkg} is installed but `{module}` is not importable", f"package {dist} {pkg}")
        if name == "flash_attention_4" and not _find_module("cutlass"):
            return Choice(name, False, "flash-attn-4 is installed but the CuTe DSL (`cutlass`) is not importable: the "
                                       "nvidia-cutlass-dsl `dsl_packages` folder is not on sys.path (reinstall "
                                       "nvidia-cutlass-dsl; its .pth adds it)", f"package {dist} {pkg}")
        return Choice(name, True, "", f"package {dist} {pkg}")
    problem = kernels_problem()
    if problem:
        return Choice(name, False, f"package {dist} is not installed and Hub kernels can't be used: {problem}",
                      f"Hub kernel {repo}")
    ok, source, why = kernel_source(repo, version)
    if ok:
        return Choice(name, True, f"package {dist} not installed; transformers uses the Hub kernel ({why})", source)
    install = "pip install 'nvkit[fa4]'" if name == "flash_attention_4" else f"pip install {dist}"
    return Choice(name, False, f"package {dist} is not installed ({install}); Hub kernel fallback: {why}", source)


def _flex_choice(device_type: str) -> Choice:
    # torch's flex_attention runs on CPU too (compiled by inductor with a C++ compiler), but only
    # as a slow correctness path; transformers lets it through on any device but TPU.
    torch_v = package_version("torch") or "?"
    if device_type == "cpu":
        import shutil
        if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
            return Choice("flex_attention", False, "on the CPU torch compiles flex_attention with a C++ compiler and "
                                                   "none is on PATH; it is a CUDA feature at heart", f"torch {torch_v}")
        return Choice("flex_attention", True, "works on the CPU through torch.compile, but slowly (compiles at first "
                                              "use); its purpose is custom masks on a CUDA GPU", f"torch {torch_v}")
    return Choice("flex_attention", True, "compiles at first use (seconds); for custom attention masks",
                  f"torch {torch_v}")


def attention_backends(device=None) -> ChoiceList:
    """Every attention backend transformers knows, for ``device`` (None: cuda:0 when a GPU is
    visible, else the CPU): ``.name``, ``.available``, ``.reason`` (why not), ``.source``."""
    device_type, index = existing_device(device)
    capability, gpu_name = (None, "")
    if device_type == "cuda":
        capability, gpu_name = device_capability(index)
    out = ChoiceList([
        Choice("eager", True, "plain PyTorch matmuls; slowest, but every model supports it", "built-in"),
        Choice("sdpa", True, "torch.nn.functional.scaled_dot_product_attention"
               + ("; picks flash / memory-efficient kernels itself" if device_type == "cuda" else ""), "built-in"),
    ])
    for name in ("flash_attention_2", "flash_attention_3", "flash_attention_4"):
        out.append(_flash_choice(name, device_type, capability, gpu_name))
    out.append(_flex_choice(device_type))
    return out


_CLASS_FLAGS = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn",
                "flash_attention_3": "_supports_flash_attn", "flash_attention_4": "_supports_flash_attn",
                "flex_attention": "_supports_flex_attn"}


def class_backends(model_class) -> tuple[str, ...]:
    """The backends of ``NAMES`` a transformers model class declares support for (all of them
    when the class is unknown, e.g. remote code: transformers then checks at load)."""
    if model_class is None:
        return NAMES
    return tuple(n for n in NAMES if n == "eager" or getattr(model_class, _CLASS_FLAGS[n], True) is not False)


def model_class_for(config):
    """The causal-LM class transformers would build for ``config`` (None when it is not a known one)."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ImportError, ValueError):
        return None


def resolve_attention(name: str, device_type: str, device=None, model_class=None) -> str:
    """The ``attn_implementation`` to pass to transformers for ``name`` on ``device_type``
    ("cuda"/"cpu"), or NvkitError listing the backends that work here. No silent fallback:
    only ``"auto"`` chooses: the first of ``AUTO_ORDER`` that works here and that
    ``model_class`` supports (Gemma2, say, refuses sdpa). A backend asked for by name that the
    model class does not support is an NvkitError naming the ones it does."""
    if not isinstance(name, str) or not name.strip():
        raise NvkitError(f"attn_implementation must be a backend name such as 'sdpa' (or 'auto'), not {name!r}.")
    name = name.strip()
    if device_type not in ("cpu", "cuda"):
        raise NvkitError(f"device type must be 'cpu' or 'cuda', not {device_type!r}.")
    supported = class_backends(model_class)
    if name in NAMES and name not in supported:
        cls = getattr(model_class, "__name__", "This model")
        works = [n for n in supported if n in BUILTIN or attention_backends(device if device is not None else device_type)[n].available]
        raise NvkitError(f"{cls} does not support attention backend {name!r}. It supports: {', '.join(supported)}; "
                         f"of those, these work here: {', '.join(works)}. Leave attn_implementation out (or 'auto') "
                         "and nvkit picks the best of them.")
    if name in BUILTIN:
        return name
    choices = attention_backends(device if device is not None else device_type)
    works = choices.names(True)
    if name == "auto":
        for cand in AUTO_ORDER:
            if cand in works and cand in supported:
                return cand
        return "eager"
    if name.startswith("paged|"):
        raise NvkitError(f"{name!r}: paged attention is chosen by continuous batching itself (generate_batch); "
                         f"load with a plain backend. Backends that work here: {', '.join(works)}.")
    if "/" in name:  # a Hub kernel repo used directly as attention, e.g. "kernels-community/flash-attn2"
        problem = kernels_problem()
        if problem:
            raise NvkitError(f"Attention kernel {name!r} needs Hub kernels, but {problem}.")
        if device_type != "cuda":
            raise NvkitError(f"Attention kernel {name!r} needs a CUDA GPU. Backends that work here: {', '.join(works)}.")
        repo = name.split(":")[0].split("@")[0]
        ok, _src, why = kernel_source(repo)
        if not ok:
            raise NvkitError(f"Attention kernel {name!r} can't be loaded: {why}")
        return name
    if name not in NAMES:
        raise NvkitError(f"Unknown attention backend {name!r}. Known: {', '.join(NAMES)}, or 'auto'. "
                         f"Backends that work here: {', '.join(works)}.")
    c = choices[name]
    if not c.available:
        raise NvkitError(f"Attention backend {name!r} can't be used here: {c.reason}. "
                         f"Backends that work here: {', '.join(works)} (see nvkit.attention_backends()).")
    return name


def set_attention(session, name: str) -> str:
    """Switch the loaded model to ``name`` (checked first; the model keeps its backend on error)."""
    dev = session.device
    base = session.model.get_base_model() if hasattr(session.model, "get_base_model") else session.model
    impl = resolve_attention(name, dev.type, dev.index if dev.type == "cuda" else "cpu", model_class=type(base))
    try:
        session.model.set_attn_implementation(impl)
    except (ValueError, ImportError, RuntimeError) as e:
        raise NvkitError(f"{session.model_id} could not switch to {impl!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}. "
                         f"It keeps {session.model.config._attn_implementation!r}.") from e
    return impl
