"""The loaded model: ``nvkit.load`` → ``Session`` (generate, stop, unload, info).

One session is current per kernel (``nvkit.session()``); loading another unloads it first, so two
models never hold GPU memory by accident. Generation runs in a worker thread (see ``threads``):
``generate`` joins it in short slices (Interrupt = clean stop), ``agenerate`` awaits it so the
kernel keeps serving widget clicks.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .. import events
from ..checks import byte_size, flag, positive_int, whole_number
from ..errors import NvkitError, require
from ..generate import options as generation_options, paths
from ..generate.fast.decoders import Decoders
from ..generate.stats import GenerationStats
from ..memory import peaks
from ..memory.oom import oom_error
from ..memory.unload import usage_snapshot, verified_release
from ..memory.usage import cuda_in_use, release, rss_bytes, settle, torch_allocated
from ..state import STATE
from ..quiet import routed
from ..threads import Job, Worker
from ..units import fmt_bytes
from . import adapters, compare, export
from .backends import model_class_for, resolve_attention, set_attention
from .kernels import apply_kernels, enable_kernels, plan_kernels
from .precision import load_dtype
from .quant import quantization_config

_DEVICE_MAPS = ("cuda", "auto", "cpu", "balanced", "balanced_low_0", "sequential")
_ROLES = ("system", "user", "assistant", "tool")


def session(required: bool = True) -> "Session | None":
    """The session loaded last in this kernel (NvkitError if none and ``required``)."""
    current = STATE.session
    if current is None and required:
        raise NvkitError("No model is loaded. Load one first: s = nvkit.load('demo') (or a Hub id / local directory).")
    return current


# --- argument checks ---------------------------------------------------------------------------

def resolve_model(model: str) -> tuple[str, bool]:
    """(path or Hub id, is_local) for what the user typed."""
    require(isinstance(model, (str, os.PathLike)) and str(model).strip() != "",
            f"model must be 'demo', a Hub id like 'Qwen/Qwen3-0.6B' or a local directory, not {model!r}.")
    model = os.fspath(model).strip()
    if model == "demo":
        from .. import demo
        return demo.path(), True
    expanded = os.path.expanduser(model)
    if os.path.isdir(expanded):
        require(os.path.isfile(os.path.join(expanded, "config.json")),
                f"{expanded} is a directory but holds no config.json: point nvkit.load at a checkpoint directory "
                "(the one save_pretrained wrote).")
        return expanded, True
    if os.path.exists(expanded) or model.startswith(("/", "./", "../", "~")):
        raise NvkitError(f"{model!r} is not a checkpoint directory. Give a directory holding config.json and the weights, "
                         "a Hub id such as 'Qwen/Qwen3-0.6B', or 'demo'.")
    return model, False




def _placement(what: str, v, torch) -> str:
    """The device kind ("cuda", "cpu", "disk") of one placement: a GPU number, "cuda", "cuda:N",
    "cpu", "disk" or a torch.device; NvkitError for anything else or a GPU that is not there."""
    if isinstance(v, torch.device):
        v = str(v)
    if isinstance(v, int) and not isinstance(v, bool):
        idx = v
    elif isinstance(v, str) and v.strip() in ("cpu", "disk", "cuda"):
        idx = None
        v = v.strip()
    elif isinstance(v, str) and re.fullmatch(r"cuda:\d+", v.strip()):
        idx = int(v.strip()[5:])
    else:
        raise NvkitError(f"{what}: {v!r} is not a device; use 'cuda', 'cuda:0' (or the GPU number 0), 'cpu' or 'disk'.")
    if v in ("cpu", "disk"):
        return v
    if not torch.cuda.is_available():
        raise NvkitError(f"{what} places modules on {v!r} but no CUDA GPU is visible here. Use device_map='cpu'.")
    n = torch.cuda.device_count()
    if idx is not None and not 0 <= idx < n:
        raise NvkitError(f"{what}: cuda:{idx} does not exist; {n} CUDA device(s) are visible (cuda:0..cuda:{n - 1}).")
    return "cuda"


def resolve_device_map(device_map):
    """(device_map for from_pretrained, main device type)."""
    import torch
    has_cuda = torch.cuda.is_available()
    if device_map is None:
        return ("cuda" if has_cuda else "cpu"), ("cuda" if has_cuda else "cpu")
    if isinstance(device_map, dict):
        require(len(device_map) > 0, "device_map dict is empty: map module names to devices, e.g. {'': 'cuda:0'}.")
        kinds = set()
        for module, where in device_map.items():
            require(isinstance(module, str), f"device_map keys are module names such as '' (the whole model) or "
                                             f"'model.layers.0', not {module!r}.")
            kinds.add(_placement(f"device_map[{module!r}]", where, torch))
        return device_map, "cuda" if "cuda" in kinds else "cpu"
    require(isinstance(device_map, str), f"device_map must be 'cuda', 'auto', 'cpu' or a dict, not {device_map!r}.")
    dm = device_map.strip()
    if dm.startswith("cuda:"):
        require(dm[5:].isdigit(), f"Bad device {device_map!r}: use 'cuda', 'cuda:0', 'auto' or 'cpu'.")
        _placement("device_map", dm, torch)
        return dm, "cuda"
    require(dm in _DEVICE_MAPS, f"Unknown device_map {device_map!r}: use 'cuda', 'auto', 'cpu' or a dict.")
    if dm == "cpu":
        return "cpu", "cpu"
    if not has_cuda:
        if dm == "auto":
            return "cpu", "cpu"  # accelerate would do the same; say it in info
        raise NvkitError(f"device_map={device_map!r} needs a CUDA GPU and none is visible here "
                         "(check `nvkit doctor`). Use device_map='cpu'.")
    return dm, "cuda"


def check_max_memory(max_memory, device_type: str):
    """``max_memory`` for from_pretrained, checked: a dict from GPU numbers (and "cpu", "disk",
    "mps") to sizes such as "20GiB" or bytes. A GPU number is checked to exist when the model goes
    to CUDA (on the CPU accelerate ignores the GPU entries)."""
    if max_memory is None:
        return None
    require(isinstance(max_memory, dict) and max_memory,
            f"max_memory must be a dict such as {{0: '20GiB', 1: '20GiB', 'cpu': '64GiB'}}, not {max_memory!r}.")
    n = None
    for key, size in max_memory.items():
        if isinstance(key, int) and not isinstance(key, bool):
            require(key >= 0, f"max_memory: GPU {key} does not exist; keys are GPU numbers 0, 1, ... or 'cpu', 'disk'.")
            if device_type == "cuda":
                import torch
                n = torch.cuda.device_count() if n is None else n
                require(key < n, f"max_memory names GPU {key}, but {n} CUDA device(s) are visible (0..{n - 1}).")
        elif key not in ("cpu", "disk", "mps"):
            hint = f" (write the GPU number: {key[5:]})" if isinstance(key, str) and key.startswith("cuda:") else ""
            raise NvkitError(f"max_memory: {key!r} is not a device key{hint}; use GPU numbers 0, 1, ... and 'cpu', 'disk'.")
        byte_size(f"max_memory[{key!r}]", size)
    return max_memory


# --- the session -------------------------------------------------------------------------------

@dataclass
class Session:
    """A model and tokenizer loaded by ``nvkit.load``; ``.model`` / ``.tokenizer`` are the plain
    transformers objects for anything nvkit does not wrap."""

    model_id: str
    path: str
    model: Any
    tokenizer: Any
    load_kwargs: dict
    load_seconds: float = 0.0
    quantization: Any = None
    kernels: dict | None = None          # what Hub/local kernels replaced (nvkit.kernels_support)
    measured_bytes: int | None = None    # memory the load took, measured (allocator on CUDA, RSS on CPU)
    last_stats: GenerationStats | None = None
    training: Any = None                 # the nvkit.FinetuneRun training this model, while it runs
    unload_report: Any = None            # nvkit.memory.UnloadReport of the last unload
    #: the fast path's runners (nvkit.generate.fast.decoders): built on first use, released on unload
    decoders: Decoders = field(default_factory=Decoders, repr=False)
    _job: Job | None = field(default=None, repr=False)
    # every generation runs on this one thread: the CUDA libraries' per-thread caches (cuDNN's
    # attention plans, cuBLAS handles) are set up once per session, not once per request
    _worker: Worker = field(default_factory=lambda: Worker("nvkit-generate"), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # --- facts ---------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self.model is not None

    def _require_loaded(self):
        if self.model is None:
            raise NvkitError(f"{self.model_id} was unloaded. Load it again: nvkit.load({self.model_id!r}).")

    @property
    def device(self):
        """Where inputs go: the device of the input embeddings."""
        self._require_loaded()
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self):
        self._require_loaded()
        return self.model.dtype

    @property
    def info(self) -> dict:
        self._require_loaded()
        m = self.model
        dev_map = getattr(m, "hf_device_map", None)
        placement: dict[str, list[str]] = {}
        if dev_map:
            for module, dev in dev_map.items():
                placement.setdefault(str(dev if not isinstance(dev, int) else f"cuda:{dev}"), []).append(module)
        else:
            placement[str(self.device)] = ["(whole model)"]
        n_params = sum(p.numel() for p in m.parameters())
        return {
            "model": self.model_id,
            "path": self.path,
            "architecture": type(m).__name__,
            "dtype": str(self.dtype).replace("torch.", ""),
            "devices": sorted(placement),
            "placement": placement,
            "attention": getattr(m.config, "_attn_implementation", None),
            "quantization": self.quantization,
            "parameters": n_params,
            "footprint_bytes": int(m.get_memory_footprint()),
            "measured_bytes": self.measured_bytes,
            "kernels": self.kernels,
            "adapters": list(getattr(m, "peft_config", {}) or {}),
            "load_seconds": round(self.load_seconds, 2),
        }

    def summary(self) -> str:
        i = self.info
        q = f" · {i['quantization']}" if i["quantization"] else ""
        return (f"{i['model']}: {i['architecture']} · {i['parameters'] / 1e6:.1f} M params · {i['dtype']}{q} · "
                f"{', '.join(i['devices'])} · attention {i['attention']} · {fmt_bytes(i['footprint_bytes'])} · "
                f"loaded in {i['load_seconds']:.1f} s")

    def __repr__(self) -> str:
        return f"<nvkit.Session {self.summary() if self.model is not None else self.model_id + ' (unloaded)'}>"

    # --- generation ----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._job is not None and not self._job.done

    def _prompt_text(self, prompt, chat: bool, system: str | None, history: list | None) -> str:
        if not isinstance(prompt, str):
            raise NvkitError(f"Each prompt must be a string, not {type(prompt).__name__}.")
        if not prompt.strip():
            raise NvkitError("The prompt is empty: give some text to continue, e.g. 'NVIDIA GPUs are'.")
        if not chat:
            return prompt
        if not getattr(self.tokenizer, "chat_template", None):
            raise NvkitError(f"{self.model_id}'s tokenizer has no chat template: generate without chat=True.")
        messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
        messages.append({"role": "user", "content": prompt})
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:  # noqa: BLE001 - a template (Jinja) error is about the messages given
            raise NvkitError(f"{self.model_id}'s chat template could not format these messages: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e

    @staticmethod
    def _check_chat(chat, system, history) -> None:
        flag("chat", chat)
        if not chat:
            require(system is None and history is None,
                    "system= and history= only apply to chat: pass chat=True with them (or leave them out).")
            return
        require(system is None or isinstance(system, str),
                f"system must be a string (the system prompt) or None, not {type(system).__name__}.")
        if history is None:
            return
        require(isinstance(history, (list, tuple)),
                "history must be a list of messages such as [{'role': 'user', 'content': 'Hi'}, "
                f"{{'role': 'assistant', 'content': 'Hello!'}}], not {type(history).__name__}.")
        for i, m in enumerate(history):
            ok = isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str)
            require(ok, f"history[{i}] must be a message {{'role': one of {', '.join(_ROLES)}, 'content': a string}}, "
                        f"not {m!r}.")

    def _generation_kwargs(self, max_new_tokens, do_sample, kw: dict) -> dict:
        positive_int("max_new_tokens", max_new_tokens)
        flag("do_sample", do_sample)
        g = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
        # unknown names are refused with the accepted ones; the values are range-checked
        g.update(generation_options.check(self.model, kw, base=g, tokenizer=self.tokenizer))
        if self.tokenizer.pad_token_id is not None:
            g.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        return g

    def _start(self, prompt, max_new_tokens=50, do_sample=False, stream=None, *, chat=False, system=None,
               history=None, seed=None, fast=None, on_progress=None, deterministic=False, **generation_kwargs) -> Job:
        self._require_loaded()
        single = isinstance(prompt, str)
        if not single:
            require(isinstance(prompt, (list, tuple)), f"prompt must be a string or a list of strings, not {type(prompt).__name__}.")
            require(len(prompt) > 0, "The prompt list is empty: pass at least one prompt.")
        self._check_chat(chat, system, history)
        prompts = [prompt] if single else list(prompt)
        texts = [self._prompt_text(p, chat, system, history) for p in prompts]
        gen = self._generation_kwargs(max_new_tokens, do_sample, dict(generation_kwargs))
        require(stream is None or callable(stream), "stream must be a function that takes a text piece, or None.")
        require(on_progress is None or callable(on_progress),
                "on_progress must be a function that takes the generation stats, or None.")
        flag("fast", fast, allow_none=True)
        flag("deterministic", deterministic)
        whole_number("seed", seed, 0, 2**64 - 1, allow_none=True)
        if stream is not None and not single:
            raise NvkitError("Streaming works with one prompt at a time; pass a string, or drop stream= for a list.")
        if fast and self.device.type != "cuda":
            raise NvkitError("fast=True needs the model on a CUDA GPU (the fast path replays CUDA graphs); this one is on "
                             f"{self.device}. Drop fast=True on CPU.")
        with self._lock:
            if self.busy:
                raise NvkitError("A generation is already running in this session: wait for it or call s.stop() first.")
            if self.training is not None and not self.training.done:
                raise NvkitError("A fine-tune is training this model: wait for it (await run) or run.stop() it first.")
            box: dict = {}

            def work(job: Job):
                return self._run_generation(box["request"], seed)

            dev = self.device.index if self.device.type == "cuda" else None
            job = Job(work, name="nvkit-generate", device=dev, worker=self._worker)
            req = box["request"] = paths.Request(job, texts, gen, stream, fast, on_progress, deterministic=deterministic)
            self.last_stats = req.stats
            self._job = job.start()
        job.single = single  # type: ignore[attr-defined]
        return job

    def _run_generation(self, req: paths.Request, seed):
        import torch
        peaks.expect_generation(self, req.texts, req.gen)  # the chart's "predicted peak" for this call
        events.record("generate-start", f"{len(req.texts)} prompt(s), up to {req.gen['max_new_tokens']} tokens",
                      subject=self)
        req.t0 = time.perf_counter()
        stats = req.stats
        try:
            if seed is not None:
                torch.manual_seed(seed)
            with torch.inference_mode():
                outs = paths.run(self, req)
        except torch.OutOfMemoryError as e:
            raise oom_error(e, "generate", self) from e
        finally:
            stats.seconds = time.perf_counter() - req.t0
            stats.stopped = req.job.stop_event.is_set()
            events.record("generate-end", str(stats), subject=self)
        return outs

    def generate(self, prompt, max_new_tokens: int = 50, do_sample: bool = False, stream=None, **kwargs):
        """Generate a continuation: str in → str out, list in → list out (input order).

        ``stream`` is a callback that receives text pieces as they come. Extra keywords: ``chat``,
        ``system``, ``history``, ``seed``, ``fast``, ``deterministic`` and any transformers generation
        argument (temperature, top_p, top_k, repetition_penalty, ...). Interrupt stops it cleanly.

        ``deterministic=True``: each prompt's text is the one it gets alone, in a list of any size
        (batch-invariant kernels on the GPU, at a cost in list throughput: docs/fast-path.md; each
        prompt alone on plain ``generate`` where those cannot run); its text streams in one piece."""
        job = self._start(prompt, max_new_tokens, do_sample, stream, **kwargs)
        outs = job.result()
        return outs[0] if job.single else outs

    async def agenerate(self, prompt, max_new_tokens: int = 50, do_sample: bool = False, stream=None, **kwargs):
        """Like ``generate``, awaitable: the kernel keeps serving widgets (a Stop click) meanwhile."""
        job = self._start(prompt, max_new_tokens, do_sample, stream, **kwargs)
        outs = await job
        return outs[0] if job.single else outs

    def stop(self) -> None:
        """End the running generation within a token or two (no-op when idle)."""
        job = self._job
        if job is not None and not job.done:
            job.stop()
            events.record("stop", "generation stopped by the user")

    # --- lifecycle -----------------------------------------------------------------------------
    def unload(self) -> int:
        """Free the model; returns the bytes freed, measured (PyTorch allocator on CUDA, process
        RSS on CPU)."""
        if self.model is None:
            return 0
        if self.busy:
            self.stop()
            try:
                self._job.result(timeout=30)
            except Exception:
                pass
        ft = self.training
        if ft is not None and not ft.done:  # a training step must not find its model gone
            ft.stop()
            try:
                ft.result(timeout=120)
            except Exception:
                pass
        on_cuda = self.device.type == "cuda"
        where = str(self.device) if on_cuda else "cpu"
        release()
        before = usage_snapshot()
        self.decoders.release()  # the fast path's graphs, caches and compiled steps hold the model too
        self.model = None
        self.tokenizer = None
        self._job = None
        self._worker.close()  # its thread's caches go with it
        # NVML, torch and RSS drops, and the live tensors that still hold memory if any
        self.unload_report = verified_release(self.model_id, where, before)
        freed = self.unload_report.freed
        with STATE.lock:
            if STATE.session is self:
                STATE.session = None
        events.record("unload", f"{self.model_id}: {fmt_bytes(freed)} freed", subject=self)
        return freed

    # --- model choices and adapters (implemented in their own modules) -----------------------
    def set_attention(self, name: str) -> str:
        """Switch the attention backend of the loaded model; returns the backend now in use."""
        self._require_loaded()
        impl = set_attention(self, name)
        events.record("attention", f"attention → {impl}")
        return impl

    def enable_kernels(self, kernel_config=None) -> dict:
        """Kernelize the loaded model with Hub/local kernels (checked first: on error the model
        is left as it was); returns which layers were replaced."""
        self._require_loaded()
        info = enable_kernels(self, kernel_config)
        events.record("kernels", f"kernels: {info['replaced'] or 'no layer replaced'}")
        return info

    def load_adapter(self, adapter_dir: str, name: str | None = None):
        self._require_loaded()
        return adapters.load_adapter(self, adapter_dir, name)

    def merge_adapter(self):
        self._require_loaded()
        return adapters.merge_adapter(self)

    def unload_adapter(self):
        self._require_loaded()
        return adapters.unload_adapter(self)

    def compare(self, prompts, max_new_tokens: int = 50, do_sample: bool = False, seed: int = 0, **kwargs):
        """Each prompt with the adapter off (base) and on (tuned), same seed and settings, one
        loaded model: a side-by-side ``Comparison`` with tok/s per side (``nvkit.model.compare``)."""
        return compare.compare(self, prompts, max_new_tokens, do_sample, seed, **kwargs)

    def export(self, directory, merge: bool = True) -> str:
        """Write a standalone checkpoint (``merge=True``) or the adapter (``merge=False``), with the
        tokenizer and a model card, into ``directory``; returns it (``nvkit.model.export``)."""
        return export.export(self, directory, merge)


def load(model: str = "demo", dtype="auto", device_map=None, attn_implementation: str = "auto",
         use_kernels: bool = False, kernel_config=None, quantization=None, max_memory=None,
         trust_remote_code: bool = False, **from_pretrained_kwargs) -> Session:
    """Load a model and its tokenizer into this kernel and make it the current session.

    ``model``: "demo" (nvkit's offline demo model), a Hub id, or a local checkpoint directory.
    ``attn_implementation="auto"`` picks the best backend that works here and that the model class
    supports (``s.info["attention"]`` says which). ``dtype="auto"``: bfloat16 on GPUs that have it
    (Ampere on), float16 on older ones and for int8 (LLM.int8() multiplies in float16), float32 on
    the CPU. The previous session is unloaded first."""
    path, is_local = resolve_model(model)
    dm, device_type = resolve_device_map(device_map)
    import torch
    capability = torch.cuda.get_device_capability(0) if device_type == "cuda" else None
    torch_dtype = load_dtype(dtype, device_type, capability, quantization)
    qconfig = quantization_config(quantization, torch_dtype, device_type)
    flag("trust_remote_code", trust_remote_code)
    check_max_memory(max_memory, device_type)
    config_overrides = _split_from_pretrained_kwargs(from_pretrained_kwargs)
    if device_type == "cuda":
        # Triton's once-a-process costs beside the load (config, tokenizer and weights), not in the
        # first request's warm-up: started as soon as the arguments are known to be good
        from ..generate.kernels import warm
        warm.start()

    kwargs = dict(dtype=torch_dtype, device_map=dm, trust_remote_code=trust_remote_code, **from_pretrained_kwargs)
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
    # Hub/local kernels are planned (and imported) now, before the current model is unloaded, and
    # applied after the weights load (see nvkit.model.kernels for why not via from_pretrained).
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    t0 = time.perf_counter()
    # Config and tokenizer first: they are small and fail fast (offline Hub, wrong path), so a bad
    # request leaves the current session loaded and usable.
    try:
        config, unused = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, return_unused_kwargs=True,
                                                    **config_overrides)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, ImportError) as e:
        raise _load_error(model, path, is_local, e) from e
    if unused:
        raise _unknown_load_keyword(sorted(unused)[0])
    kwargs["attn_implementation"] = resolve_attention(attn_implementation, device_type,
                                                      model_class=model_class_for(config))
    kernel_plan = plan_kernels(path, device_type, use_kernels, kernel_config, trust_remote_code)
    old = STATE.session
    if old is not None and old.model is not None:
        print(f"Unloading {old.model_id} first.")
        old.unload()
    release()
    mem_before = torch_allocated() if cuda_in_use() else rss_bytes()
    peaks.tracker()  # the load's peak is measured from its start event on
    events.record("load-start", str(model))
    from transformers.utils import logging as hf_logging
    # The demo model loads in well under a second: a weight-loading bar would only interleave with
    # the text that %nvkit generate prints right after it. Real checkpoints keep their bar.
    quiet = model == "demo" and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        with routed():  # a 4-bit load is bitsandbytes' first import (see nvkit.quiet)
            hf_model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except torch.OutOfMemoryError as e:
        release()
        raise oom_error(e, "load", None) from e
    except (OSError, ValueError, ImportError, RuntimeError) as e:
        release()
        raise _load_error(model, path, is_local, e) from e
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    hf_model.eval()
    kernels_info = apply_kernels(hf_model, kernel_plan)
    measured = (torch_allocated() if cuda_in_use() else rss_bytes()) - mem_before
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    s = Session(model_id=str(model), path=path, model=hf_model, tokenizer=tokenizer,
                load_kwargs={k: v for k, v in kwargs.items()}, load_seconds=time.perf_counter() - t0,
                quantization=quantization if isinstance(quantization, (str, type(None))) else (
                    quantization.get("method") if isinstance(quantization, dict) else type(quantization).__name__),
                kernels=kernels_info, measured_bytes=max(0, int(measured)))
    with STATE.lock:
        STATE.session = s
    events.record("load", s.summary(), subject=s)
    settle()  # the loaded session's objects out of the garbage collector's later passes
    return s


# from_pretrained's loading options that nvkit passes on as given (transformers 5.20-5.22: those it
# takes from **kwargs; its named parameters are read from its signature).
_LOADING_OPTIONS = ("adapter_kwargs", "adapter_name", "device_mesh", "distributed_config", "experts_implementation",
                    "generation_config", "gguf_file", "key_mapping", "offload_buffers", "offload_folder", "proxies",
                    "state_dict", "subfolder", "tp_plan", "tp_size", "tqdm_class", "variant")
# transformers' names for what load() takes under its own name, or what would break the session
_NOT_THROUGH_KWARGS = {
    "torch_dtype": "use dtype=", "quantization_config": "use quantization= (it takes a transformers config too)",
    "output_loading_info": "nvkit.load returns a Session; call AutoModelForCausalLM.from_pretrained yourself for it",
}


def _loading_options() -> tuple[str, ...]:
    import inspect
    from transformers import PreTrainedModel
    named = [n for n, p in inspect.signature(PreTrainedModel.from_pretrained).parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "pretrained_model_name_or_path"]
    return tuple(sorted(set(named) | set(_LOADING_OPTIONS)))


def _split_from_pretrained_kwargs(kw: dict) -> dict:
    """The extra keywords of ``load`` that are not loading options: overrides of config fields,
    which the config read must consume (what it does not is refused before anything is unloaded)."""
    for name in kw:
        if name in _NOT_THROUGH_KWARGS:
            raise NvkitError(f"load() does not take {name!r}: {_NOT_THROUGH_KWARGS[name]}.")
    options = set(_loading_options())
    return {k: v for k, v in kw.items() if k not in options}


def _unknown_load_keyword(name: str) -> NvkitError:
    import difflib
    accepted = ["model", "dtype", "device_map", "attn_implementation", "use_kernels", "kernel_config", "quantization",
                "max_memory", "trust_remote_code", *_loading_options()]
    close = difflib.get_close_matches(name, accepted, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return NvkitError(f"load() does not take {name!r}: it is neither one of load's arguments, a from_pretrained "
                      f"loading option nor a field of this model's config.{hint} load takes: {', '.join(accepted)} "
                      "(and config fields to override, e.g. use_cache=False).")


def _load_error(model, path, is_local, e: Exception) -> NvkitError:
    msg = str(e)
    if not is_local:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        why = ("the Hugging Face Hub is unreachable (HF_HUB_OFFLINE is set)" if offline
               else "the Hugging Face Hub could not be reached or has no such model")
        return NvkitError(
            f"Could not load {model!r}: it is not a local directory and {why}.\n"
            f"Load a local checkpoint directory instead (one with config.json and weights, e.g. written by "
            f"save_pretrained): nvkit.load('/path/to/model'); or use nvkit's offline demo model: nvkit.load('demo').\n"
            f"(transformers said: {msg.splitlines()[0] if msg else type(e).__name__})")
    return NvkitError(f"Could not load {model!r} from {path}: {msg.splitlines()[0] if msg else type(e).__name__}")
