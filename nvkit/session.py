"""The loaded model: ``nvkit.load`` → ``Session`` (generate, stop, unload, info).

One session is current per kernel (``nvkit.session()``); loading another unloads it first, so two
models never hold GPU memory by accident. Generation runs in a worker thread (see ``threads``):
``generate`` joins it in short slices (Interrupt = clean stop), ``agenerate`` awaits it so the
kernel keeps serving widget clicks.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import events
from .errors import NvkitError, require
from .memory import fmt_bytes, release, rss_bytes, torch_allocated
from .threads import Job, run_in_worker

_DTYPES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
}
_DEVICE_MAPS = ("cuda", "auto", "cpu", "balanced", "balanced_low_0", "sequential")

_current: "Session | None" = None
_current_lock = threading.Lock()


def session(required: bool = True) -> "Session | None":
    """The session loaded last in this kernel (NvkitError if none and ``required``)."""
    if _current is None and required:
        raise NvkitError("No model is loaded. Load one first: s = nvkit.load('demo') (or a Hub id / local directory).")
    return _current


# --- argument checks ---------------------------------------------------------------------------

def resolve_model(model: str) -> tuple[str, bool]:
    """(path or Hub id, is_local) for what the user typed."""
    require(isinstance(model, (str, os.PathLike)) and str(model).strip() != "",
            f"model must be 'demo', a Hub id like 'Qwen/Qwen3-0.6B' or a local directory, not {model!r}.")
    model = os.fspath(model).strip()
    if model == "demo":
        from . import demo
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


def resolve_dtype(dtype, device_type: str, capability: tuple[int, int] | None = None):
    import torch
    if isinstance(dtype, torch.dtype):
        return dtype
    require(isinstance(dtype, str), f"dtype must be 'auto', 'bfloat16', 'float16' or 'float32', not {dtype!r}.")
    key = dtype.lower().replace("torch.", "")
    if key == "auto":
        if device_type == "cuda":
            # bf16 needs Ampere (8.0); is_bf16_supported() says True on older GPUs through emulation.
            return torch.bfloat16 if capability and capability >= (8, 0) else torch.float16
        return torch.float32
    require(key in _DTYPES, f"Unknown dtype {dtype!r}: use 'auto', 'bfloat16', 'float16' or 'float32'.")
    return getattr(torch, _DTYPES[key])


def resolve_device_map(device_map):
    """(device_map for from_pretrained, main device type)."""
    import torch
    has_cuda = torch.cuda.is_available()
    if device_map is None:
        return ("cuda" if has_cuda else "cpu"), ("cuda" if has_cuda else "cpu")
    if isinstance(device_map, dict):
        require(len(device_map) > 0, "device_map dict is empty: map module names to devices, e.g. {'': 'cuda:0'}.")
        kinds = {str(v).split(":")[0] if not isinstance(v, int) else "cuda" for v in device_map.values()}
        if "cuda" in kinds and not has_cuda:
            raise NvkitError("device_map places modules on CUDA but no CUDA GPU is visible here. Use device_map='cpu'.")
        return device_map, "cuda" if "cuda" in kinds else "cpu"
    require(isinstance(device_map, str), f"device_map must be 'cuda', 'auto', 'cpu' or a dict, not {device_map!r}.")
    dm = device_map.strip()
    if dm.startswith("cuda:"):
        idx = dm.split(":", 1)[1]
        require(idx.isdigit(), f"Bad device {device_map!r}: use 'cuda', 'cuda:0', 'auto' or 'cpu'.")
        if not has_cuda:
            raise NvkitError(f"device_map={device_map!r} but no CUDA GPU is visible here. Use device_map='cpu'.")
        n = torch.cuda.device_count()
        require(int(idx) < n, f"device_map={device_map!r} but only {n} CUDA device(s) are visible (cuda:0..cuda:{n - 1}).")
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


# --- generation plumbing -----------------------------------------------------------------------

class _StopOnEvent:
    """StoppingCriteria that ends generation within a step once the event is set."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs):
        import torch
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class _CallbackStreamer:
    """A transformers streamer that decodes incrementally and hands text pieces to a callback in
    the worker thread (no queue, so nothing can block forever if generate raises)."""

    def __init__(self, tokenizer, callback: Callable[[str], Any], on_token: Callable[[], None] | None = None):
        self.tokenizer = tokenizer
        self.callback = callback
        self.on_token = on_token
        self.ids: list[int] = []
        self.sent = 0
        self.prompt_skipped = False

    def put(self, value):
        if not self.prompt_skipped:  # the first put is the prompt
            self.prompt_skipped = True
            return
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())
        if self.on_token:
            self.on_token()
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        # Hold back an incomplete UTF-8 sequence (shown as U+FFFD) until its bytes arrive.
        if text.endswith("\ufffd"):
            return
        if len(text) > self.sent:
            piece, self.sent = text[self.sent:], len(text)
            self.callback(piece)

    def end(self):
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if len(text) > self.sent:
            self.callback(text[self.sent:])
            self.sent = len(text)


@dataclass
class GenerationStats:
    """What one request did. Two rates, because a first request can spend seconds before its first
    token (the fast path's one-time capture) and then decode in milliseconds: one number for both
    would be either the wait or the speed, never the truth about the other."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    time_to_first_token: float | None = None
    stopped: bool = False
    path: str = "generate"
    prompts_done: int = 0  # batch paths: prompts finished so far (for progress displays)
    detail: str = ""       # how the path ran (the fast path: FastDecoder.describe), or why the fast path was off

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the whole request, first-token wait included."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first one over the time after it (None when there are none to time)."""
        if self.time_to_first_token is None:
            return None
        decode = self.seconds - self.time_to_first_token
        return (self.new_tokens - 1) / decode if self.new_tokens > 1 and decode > 0 else None

    @property
    def how(self) -> str:
        """The path, with how it ran where it can run several ways: "fast (fused step, ...)"."""
        return f"{self.path} ({self.detail})" if self.detail else self.path

    def __str__(self) -> str:
        ttft = f"{self.time_to_first_token * 1000:.0f} ms" if self.time_to_first_token is not None else "n/a"
        decode = self.decode_tokens_per_second
        after = f" · then {decode:.1f} tok/s decode" if decode is not None else ""
        return (f"{self.new_tokens} tokens in {self.seconds:.2f} s · {self.tokens_per_second:.1f} tok/s overall · "
                f"first token {ttft}{after} · {self.how}{' · stopped' if self.stopped else ''}")


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
    _job: Job | None = field(default=None, repr=False)
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
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _generation_kwargs(self, max_new_tokens, do_sample, kw: dict) -> dict:
        require(isinstance(max_new_tokens, int) and not isinstance(max_new_tokens, bool) and max_new_tokens > 0,
                f"max_new_tokens must be a whole number ≥ 1, not {max_new_tokens!r}.")
        require(isinstance(do_sample, bool), f"do_sample must be True or False, not {do_sample!r}.")
        g = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
        if "temperature" in kw:
            t = kw.pop("temperature")
            require(isinstance(t, (int, float)) and t > 0, f"temperature must be > 0, not {t!r}.")
            g["temperature"] = float(t)
        if "top_p" in kw:
            p = kw.pop("top_p")
            require(isinstance(p, (int, float)) and 0 < p <= 1, f"top_p must be in (0, 1], not {p!r}.")
            g["top_p"] = float(p)
        if "top_k" in kw:
            k = kw.pop("top_k")
            require(isinstance(k, int) and k >= 0, f"top_k must be a whole number ≥ 0, not {k!r}.")
            g["top_k"] = k
        if "repetition_penalty" in kw:
            r = kw.pop("repetition_penalty")
            require(isinstance(r, (int, float)) and r > 0, f"repetition_penalty must be > 0, not {r!r}.")
            g["repetition_penalty"] = float(r)
        g.update(kw)  # anything else goes to transformers' generate as is
        if self.tokenizer.pad_token_id is not None:
            g.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        return g

    def _start(self, prompt, max_new_tokens=50, do_sample=False, stream=None, *, chat=False, system=None,
               history=None, seed=None, fast=None, on_progress=None, **generation_kwargs) -> Job:
        self._require_loaded()
        single = isinstance(prompt, str)
        if not single:
            require(isinstance(prompt, (list, tuple)), f"prompt must be a string or a list of strings, not {type(prompt).__name__}.")
            require(len(prompt) > 0, "The prompt list is empty: pass at least one prompt.")
        prompts = [prompt] if single else list(prompt)
        texts = [self._prompt_text(p, chat, system, history) for p in prompts]
        gen = self._generation_kwargs(max_new_tokens, do_sample, dict(generation_kwargs))
        require(stream is None or callable(stream), "stream must be a function that takes a text piece, or None.")
        require(seed is None or (isinstance(seed, int) and not isinstance(seed, bool)), f"seed must be a whole number, not {seed!r}.")
        if stream is not None and not single:
            raise NvkitError("Streaming works with one prompt at a time; pass a string, or drop stream= for a list.")
        if fast and self.device.type != "cuda":
            raise NvkitError("fast=True needs the model on a CUDA GPU (the fast path replays CUDA graphs); this one is on "
                             f"{self.device}. Drop fast=True on CPU.")
        with self._lock:
            if self.busy:
                raise NvkitError("A generation is already running in this session: wait for it or call s.stop() first.")
            ft = getattr(self, "_finetune", None)
            if ft is not None and not ft.done:
                raise NvkitError("A fine-tune is training this model: wait for it (await run) or run.stop() it first.")
            stats = GenerationStats()
            self.last_stats = stats

            def work(job: Job):
                return self._run_generation(job, texts, gen, stream, seed, fast, stats, on_progress)

            dev = self.device.index if self.device.type == "cuda" else None
            self._job = run_in_worker(work, name="nvkit-generate", device=dev)
            job = self._job
        job.single = single  # type: ignore[attr-defined]
        return job

    def _run_generation(self, job: Job, texts, gen, stream, seed, fast, stats: GenerationStats, on_progress):
        import torch
        from . import generation
        from .memory import expect_generation
        expect_generation(self, texts, gen)  # the chart's "predicted peak" for this call
        events.record("generate-start", f"{len(texts)} prompt(s), up to {gen['max_new_tokens']} tokens")
        t0 = time.perf_counter()
        try:
            if seed is not None:
                torch.manual_seed(seed)
            with torch.inference_mode():
                outs = generation.run(self, job, texts, gen, stream, fast, stats, t0, on_progress)
        except torch.OutOfMemoryError as e:
            from .memory import oom_error
            raise oom_error(e, "generate", self) from e
        finally:
            stats.seconds = time.perf_counter() - t0
            stats.stopped = job.stop_event.is_set()
            events.record("generate-end", str(stats))
        return outs

    def generate(self, prompt, max_new_tokens: int = 50, do_sample: bool = False, stream=None, **kwargs):
        """Generate a continuation: str in → str out, list in → list out (input order).

        ``stream`` is a callback that receives text pieces as they come. Extra keywords: ``chat``,
        ``system``, ``history``, ``seed``, ``fast`` and any transformers generation argument
        (temperature, top_p, top_k, repetition_penalty, ...). Interrupt stops it cleanly."""
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
        global _current
        if self.model is None:
            return 0
        if self.busy:
            self.stop()
            try:
                self._job.result(timeout=30)
            except Exception:
                pass
        ft = getattr(self, "_finetune", None)
        if ft is not None and not ft.done:  # a training step must not find its model gone
            ft.stop()
            try:
                ft.result(timeout=120)
            except Exception:
                pass
        from . import memory
        on_cuda = self.device.type == "cuda"
        where = str(self.device) if on_cuda else "cpu"
        release()
        before = memory.usage_snapshot()
        from .fast import forget
        forget(self.model)  # the fast path's graphs, caches and compiled step hold the model too
        self.model = None
        self.tokenizer = None
        self._job = None
        # NVML, torch and RSS drops, and the live tensors that still hold memory if any
        self.unload_report = memory.verified_release(self.model_id, where, before)
        freed = self.unload_report.freed
        with _current_lock:
            if _current is self:
                _current = None
        events.record("unload", f"{self.model_id}: {fmt_bytes(freed)} freed")
        self.freed_bytes = freed
        return freed

    # --- model choices and adapters (implemented in their own modules) -----------------------
    def set_attention(self, name: str) -> str:
        """Switch the attention backend of the loaded model; returns the backend now in use."""
        self._require_loaded()
        from .backends import set_attention
        impl = set_attention(self, name)
        events.record("attention", f"attention → {impl}")
        return impl

    def enable_kernels(self, kernel_config=None) -> dict:
        """Kernelize the loaded model with Hub/local kernels (checked first: on error the model
        is left as it was); returns which layers were replaced."""
        self._require_loaded()
        from .kernels_support import enable_kernels
        info = enable_kernels(self, kernel_config)
        events.record("kernels", f"kernels: {info['replaced'] or 'no layer replaced'}")
        return info

    def load_adapter(self, adapter_dir: str, name: str | None = None):
        self._require_loaded()
        from .adapters import load_adapter
        return load_adapter(self, adapter_dir, name)

    def merge_adapter(self):
        self._require_loaded()
        from .adapters import merge_adapter
        return merge_adapter(self)

    def unload_adapter(self):
        self._require_loaded()
        from .adapters import unload_adapter
        return unload_adapter(self)


def load(model: str = "demo", dtype="auto", device_map=None, attn_implementation: str = "sdpa",
         use_kernels: bool = False, kernel_config=None, quantization=None, max_memory=None,
         trust_remote_code: bool = False, **from_pretrained_kwargs) -> Session:
    """Load a model and its tokenizer into this kernel and make it the current session.

    ``model``: "demo" (nvkit's offline demo model), a Hub id, or a local checkpoint directory.
    The previous session is unloaded first."""
    global _current
    path, is_local = resolve_model(model)
    dm, device_type = resolve_device_map(device_map)
    import torch
    capability = torch.cuda.get_device_capability(0) if device_type == "cuda" else None
    torch_dtype = resolve_dtype(dtype, device_type, capability)
    from .backends import resolve_attention
    attn = resolve_attention(attn_implementation, device_type)
    from .quant import quantization_config
    qconfig = quantization_config(quantization, torch_dtype, device_type)
    require(isinstance(trust_remote_code, bool), "trust_remote_code must be True or False.")
    require(max_memory is None or isinstance(max_memory, dict),
            "max_memory must be a dict such as {0: '20GiB', 1: '20GiB', 'cpu': '64GiB'}.")


    kwargs = dict(dtype=torch_dtype, device_map=dm, attn_implementation=attn,
                  trust_remote_code=trust_remote_code, **from_pretrained_kwargs)
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    if qconfig is not None:
        kwargs["quantization_config"] = qconfig
    # Hub/local kernels are planned (and imported) now, before the current model is unloaded, and
    # applied after the weights load (see nvkit.kernels_support for why not via from_pretrained).
    from .kernels_support import apply_kernels, plan_kernels

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    t0 = time.perf_counter()
    # Config and tokenizer first: they are small and fail fast (offline Hub, wrong path), so a bad
    # request leaves the current session loaded and usable.
    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, ImportError) as e:
        raise _load_error(model, path, is_local, e) from e
    kernel_plan = plan_kernels(path, device_type, use_kernels, kernel_config, trust_remote_code)
    with _current_lock:
        old = _current
    if old is not None and old.model is not None:
        print(f"Unloading {old.model_id} first.")
        old.unload()
    from .memory import cuda_in_use
    release()
    mem_before = torch_allocated() if cuda_in_use() else rss_bytes()
    events.record("load-start", str(model))
    from transformers.utils import logging as hf_logging
    # The demo model loads in well under a second: a weight-loading bar would only interleave with
    # the text that %nvkit generate prints right after it. Real checkpoints keep their bar.
    quiet = model == "demo" and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except torch.OutOfMemoryError as e:
        release()
        from .memory import oom_error
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
    with _current_lock:
        _current = s
    events.record("load", s.summary())
    return s


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
