"""Multi-GPU fine-tunes and tensor-parallel generation: ``nvkit.launch(config)`` writes a run folder
and runs nvkit's training program (``nvkit.train.worker``) on it with torchrun or ``accelerate
launch``, one process per selected GPU, and streams every rank's metrics back;
``nvkit.launch_generate(prompts)`` runs the same program in generation mode and returns the texts.

A notebook kernel is one process, so DDP, FSDP2, DeepSpeed ZeRO and tensor parallelism over several
GPUs have to run outside it (``nvkit.train.strategies`` says what each does, needs and costs per
GPU, and refuses a combination that cannot run before anything starts). The run folder holds
``config.json`` (the settings, including the session's attention backend, dtype, quantization and
kernels), ``data.jsonl`` (the examples, already tokenized and checked in the notebook by
``nvkit.train.data``, so a bad example fails here in a second instead of on every rank after the
model loaded), ``launch.sh`` (the shell line), ``accelerate.yaml`` for ``launcher="accelerate"``,
and ``logs/``. Nothing the user typed is pasted into Python source: the run folder reaches the
worker as a command-line argument. The same line starts the run on any machine where nvkit is
installed: ``python -m torch.distributed.run [options] -m nvkit.train.worker RUN_DIR``.

Each rank prints JSON lines (``{"nvkit": 1, "rank": r, ...}``); torchrun's ``--tee`` prefixes them
with the rank and also writes per-rank log files under ``logs/``. ``LaunchRun.stop()`` writes a
``STOP`` file that every rank reads at the end of a step and agrees on through an all-reduce (so no
rank is left waiting in a collective), the adapter is saved, and the process group exits; if it has
not exited after ``grace`` seconds, the whole group gets SIGTERM, then SIGKILL.

Multi-node (documented, not testable here): run the same line on every node with
``nnodes=N, node_rank=i, rdzv_endpoint="host:29500"`` (rendezvous backend c10d), e.g.
``nvkit.launch(cfg, nproc_per_node=8, nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29500", start=False)``
gives ``run.command`` to paste on node 0, and ``node_rank=1`` the one for node 1.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
import time

from ..cache import write_atomic
from ..checks import positive_int
from ..errors import NvkitError, require
from ..hardware.selection import launch_command
from ..model.precision import PRECISIONS
from ..model.saving import MARKER, check_target, make_folder, owned, write_marker
from ..model.session import resolve_model, session as current_session
from . import data as train_data
from . import strategies as strat
from .launch_run import LaunchRun
from .lora import DEFAULT_LORA, check_lora

_CONFIG_KEYS = {"model", "data", "lora", "max_steps", "epochs", "learning_rate", "batch_size", "grad_accum",
                "seq_len", "packing", "gradient_checkpointing", "seed", "log_every", "quantization", "precision",
                "attn_implementation", "dtype", "kernels"}
def session_settings(s) -> dict:
    """What a launched run takes over from a loaded session: its model, quantization, attention
    backend, load dtype and kernels. NvkitError, with the reason, for what cannot be carried over."""
    require(getattr(s, "model", None) is not None,
            "No model is loaded to launch from: load one (nvkit.load) or give config['model'] (a path or Hub id).")
    out: dict = {}
    q = s.quantization
    if q is not None and not isinstance(q, str):
        raise NvkitError(f"The session's model is quantized with {q} (a transformers config object); a launched run "
                         "takes bitsandbytes 'nf4'/'fp4' by name. Give config['quantization']='nf4' and "
                         "config['model'] explicitly, or load the session with quantization='nf4'.")
    if q == "int8":
        raise NvkitError("The session's model is loaded in 8-bit (int8); a launched run trains QLoRA on 4-bit weights "
                         "('nf4'/'fp4'), which FSDP and DeepSpeed can shard. Give config['quantization']='nf4' (or "
                         "None) with config['model'], or reload the session with quantization='nf4'.")
    out["quantization"] = q
    attn = getattr(getattr(s.model, "config", None), "_attn_implementation", None)
    if isinstance(attn, str) and attn:
        out["attn_implementation"] = attn
    if q is None:  # a 4-bit model's dtype is its compute dtype, chosen again by the run's precision
        out["dtype"] = str(s.dtype).replace("torch.", "")
    kernels = s.kernels
    if kernels:
        request = kernels.get("request") if isinstance(kernels, dict) else None
        if request is None:
            raise NvkitError("The session runs Hub kernels asked for with a KernelConfig holding repository objects, "
                             "which a run folder cannot hold. Give config['kernels'] = {'use_kernels': True, "
                             "'kernel_config': {'RMSNorm': {'cuda': 'org/repo:Layer'}}} (strings), or "
                             "{'use_kernels': False} to launch without them.")
        out["kernels"] = request
    return out


def _config(config, overrides: dict) -> dict:
    require(config is None or isinstance(config, dict),
            f"config must be a dict of fine-tune settings (model, data, lora, max_steps, ...), not {type(config).__name__}.")
    cfg = {**(config or {}), **overrides}
    unknown = set(cfg) - _CONFIG_KEYS
    require(not unknown, f"Unknown launch setting(s) {sorted(unknown)}; known: {', '.join(sorted(_CONFIG_KEYS))}.")
    model = cfg.get("model")
    if model is None or hasattr(model, "model_id"):  # a Session, or the current one
        s = model if model is not None else current_session()
        for k, v in session_settings(s).items():
            cfg.setdefault(k, v)
        model = s.path
    path, is_local = resolve_model(model)
    cfg["model"] = path
    require(cfg.get("data") is not None, "launch needs data: config['data'] = a list of examples or a local file.")
    cfg["lora"] = check_lora(cfg.get("lora") or DEFAULT_LORA)
    for key, default in (("batch_size", 8), ("grad_accum", 1), ("seq_len", 512), ("log_every", 1)):
        positive_int(key, cfg.setdefault(key, default))
    seed = cfg.setdefault("seed", 0)
    require(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, f"seed must be a whole number ≥ 0, not {seed!r}.")
    positive_int("max_steps", cfg.get("max_steps"), allow_none=True)
    epochs = cfg.get("epochs")
    require(epochs is None or (isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and epochs > 0),
            f"epochs must be > 0, not {epochs!r}.")
    require(not (cfg.get("max_steps") and epochs), "Give max_steps or epochs, not both.")
    lr = cfg.setdefault("learning_rate", 2e-4)
    require(isinstance(lr, (int, float)) and not isinstance(lr, bool) and 0 < lr < 1,
            f"learning_rate must be in (0, 1), not {lr!r}.")
    q = cfg.get("quantization")
    require(q in (None, "nf4", "fp4"),
            f"quantization for a launch must be None, 'nf4' or 'fp4' (QLoRA), not {q!r}: 8-bit weights and "
            "quantization config objects are not written into a run folder.")
    p = cfg.get("precision")
    require(p is None or p in PRECISIONS or p == "auto",
            f"precision must be 'bf16', 'fp16', 'fp32' or None (automatic), not {p!r}.")
    attn = cfg.get("attn_implementation")
    require(attn is None or (isinstance(attn, str) and attn.strip()),
            f"attn_implementation must be a backend name such as 'sdpa', not {attn!r}.")
    dt = cfg.get("dtype")
    require(dt is None or (isinstance(dt, str) and dt.replace("torch.", "") in
                           ("auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32")),
            f"dtype must be 'auto', 'bfloat16', 'float16' or 'float32', not {dt!r}.")
    k = cfg.get("kernels")
    require(k is None or (isinstance(k, dict) and set(k) <= {"use_kernels", "kernel_config"}
                          and isinstance(k.get("use_kernels", False), bool)
                          and (k.get("kernel_config") is None or isinstance(k.get("kernel_config"), dict))),
            f"kernels must be None or {{'use_kernels': True, 'kernel_config': None or {{'RMSNorm': {{'cuda': "
            f"'org/repo:Layer'}}}}}}, not {k!r}.")
    if k is not None:
        try:
            json.dumps(k)
        except (TypeError, ValueError) as e:
            raise NvkitError(f"kernels must be plain data (strings), not {k!r}: it is written into config.json.") from e
    gc_on = cfg.setdefault("gradient_checkpointing", False)
    require(isinstance(gc_on, bool), f"gradient_checkpointing must be True or False, not {gc_on!r}.")
    packing = cfg.setdefault("packing", "auto")
    require(packing is True or packing is False or packing == "auto",
            f"packing must be True, False or 'auto', not {packing!r}.")
    return cfg


WORKER = "nvkit.train.worker"


def _run_dir(run_dir) -> str:
    """The run folder: a new unique one under ./nvkit-runs by default; a given one must be new,
    empty, or a run folder nvkit made (nvkit replaces its own config.json, data.jsonl, launch.sh
    and adapter/ there, and nothing else)."""
    if run_dir is None:
        root = make_folder(os.path.abspath("nvkit-runs"), "folder for launched runs")
        path = tempfile.mkdtemp(prefix=f"launch-{time.strftime('%Y%m%d-%H%M%S')}-", dir=root)
    else:
        path = check_target(run_dir, ("launch-run",), "run_dir")
        # the run ends by writing adapter/ here: refuse now, not after training, if it cannot be replaced
        check_target(os.path.join(path, "adapter"), ("adapter",), "adapter")
        make_folder(path, "run_dir")
    if not owned(path, "launch-run"):
        write_marker(path, "launch-run")
    return path


def _forget_if_empty(run_dir: str) -> None:
    """A run that failed its checks leaves no folder behind when nvkit made it just now."""
    try:
        names = os.listdir(run_dir)
        if names == [MARKER]:
            os.remove(os.path.join(run_dir, MARKER))
            os.rmdir(run_dir)
    except OSError:
        pass


def _write(run_dir: str, name: str, data: str, mode: int = 0o644) -> None:
    """One run file, written whole and atomically; a link or file planted at the name is replaced,
    never written through (a reused run folder may hold anything)."""
    path = os.path.join(run_dir, name)
    try:
        write_atomic(path, data, mode)
    except OSError as e:
        raise NvkitError(f"Cannot write {path}: {e.strerror or e}. Move what is at that name away, or give "
                         "another run_dir.") from e


def write_run(cfg: dict, run_dir: str, strategy: str, device: str, command: str = "", *, launcher: str = "torchrun",
              accelerate_yaml: str | None = None, offload=None, mode: str = "train") -> dict:
    """Write config.json, data.jsonl (training) and launch.sh into ``run_dir`` (and accelerate.yaml
    for ``launcher="accelerate"``); returns the data facts. ``command`` is the launch line
    (``K=V ... argv``, names checked by ``_command``)."""
    from transformers import AutoTokenizer
    os.makedirs(run_dir, exist_ok=True)
    facts: dict = {}
    tok = AutoTokenizer.from_pretrained(cfg["model"])
    if mode == "train":
        rows, facts = train_data.prepare(cfg["data"], tok, cfg["seq_len"], cfg["packing"])
        _write(run_dir, "data.jsonl",
               "".join(json.dumps({"input_ids": r.input_ids, "labels": r.labels}) + "\n" for r in rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    worker_cfg = {k: v for k, v in cfg.items() if k != "data"}
    worker_cfg.update(strategy=strategy, device=device, pad_token_id=pad, mode=mode, launcher=launcher, offload=offload)
    if mode == "train":
        worker_cfg["data_facts"] = facts
    _write(run_dir, "config.json", json.dumps(worker_cfg, indent=2))
    if accelerate_yaml is not None:
        _write(run_dir, "accelerate.yaml", accelerate_yaml)
    if command:
        what = ("tensor-parallel generation" if mode == "generate"
                else f"LoRA fine-tune, {strat.STRATEGIES[strategy].title}")
        # A shell script, not Python: every word of the line is shell-quoted. `exec K=V cmd` is not
        # shell (exec takes a command, and sh looks for one named "K=V"): `env` sets the variables.
        _write(run_dir, "launch.sh",
               f"#!/bin/sh\n# Written by nvkit.launch: {what}, one process per GPU (nvkit.train.worker), "
               f"started by {launcher}.\n"
               "# Multi-node: the same line on every node, with --nnodes=N --node_rank=I "
               "--rdzv_backend=c10d --rdzv_endpoint=HOST:PORT\n"
               "# Touch STOP in the run folder to end the run after the current step.\n"
               f"exec env {command}\n", 0o755)
    return facts


def _whole(name: str, v, lo: int = 1, allow_none: bool = True):
    if v is None and allow_none:
        return None
    require(isinstance(v, int) and not isinstance(v, bool) and v >= lo, f"{name} must be a whole number ≥ {lo}, not {v!r}.")
    return v


def _check_nodes(nnodes, node_rank, rdzv_endpoint) -> None:
    _whole("nnodes", nnodes)
    if nnodes and nnodes > 1:
        require(isinstance(rdzv_endpoint, str) and re.fullmatch(r"[^\s:]+:\d{1,5}", rdzv_endpoint or "") is not None,
                f"A multi-node launch needs rdzv_endpoint='host:port' (the rendezvous on node 0), not {rdzv_endpoint!r}.")
        require(node_rank is not None, "A multi-node launch needs node_rank (0 on the first node, 1 on the next...).")
        require(isinstance(node_rank, int) and not isinstance(node_rank, bool) and 0 <= node_rank < nnodes,
                f"node_rank must be a whole number from 0 to {nnodes - 1}, not {node_rank!r}.")
    else:
        require(node_rank in (None, 0) and rdzv_endpoint is None,
                "node_rank and rdzv_endpoint are for a multi-node launch: give nnodes=N (N ≥ 2) with them.")


def _launcher_options(launcher: str, run_dir: str, device: str, nnodes, node_rank, rdzv_endpoint) -> dict:
    """The launcher's options (besides the process count) for this run."""
    logs = os.path.join(run_dir, "logs")
    multi = bool(nnodes and nnodes > 1)
    if launcher == "torchrun":
        opts: dict = dict(tee=3, log_dir=logs)
        if multi:
            opts.update(nnodes=nnodes, node_rank=node_rank, rdzv_backend="c10d", rdzv_endpoint=rdzv_endpoint,
                        rdzv_id=os.path.basename(run_dir))
        else:
            opts.update(standalone=True)
        opts["module"] = True  # the worker is a module of nvkit: nothing to write as a script
        return opts
    opts = dict(config_file=os.path.join(run_dir, "accelerate.yaml"), tee=3, log_dir=logs)
    if multi:
        host, port = rdzv_endpoint.rsplit(":", 1)
        opts.update(num_machines=nnodes, machine_rank=node_rank, main_process_ip=host, main_process_port=port,
                    rdzv_backend="c10d", same_network=True)
    elif device == "cuda":
        opts["main_process_port"] = 0  # a free port: two runs on one machine do not collide
    opts["module"] = True
    return opts


def _command(nproc_per_node, gpus, launcher: str, run_dir: str, device: str, nnodes=None, node_rank=None,
             rdzv_endpoint=None):
    """(LaunchCommand, the variables on the line, the shell line) for a run in ``run_dir``."""
    kw = {} if gpus is ... else {"gpus": gpus}
    opts = _launcher_options(launcher, run_dir, device, nnodes, node_rank, rdzv_endpoint)
    cmd = launch_command(WORKER, nproc_per_node=nproc_per_node, launcher=launcher, args=[run_dir], **kw, **opts)
    # this process's NCCL settings go on the line as well, so the line pasted into a terminal runs
    # like the launched group (which inherits them), e.g. NVLink multicast off where a host needs it
    env_vars = {**cmd.env, **{k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}}
    check_env_names(env_vars)
    line = " ".join([f"{k}={shlex.quote(str(v))}" for k, v in env_vars.items()] + [shlex.quote(a) for a in cmd.argv])
    return cmd, env_vars, line


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_names(names) -> None:
    """NvkitError for a variable name that is not a plain shell name: the line and launch.sh put
    names unquoted before ``=`` (a name cannot be quoted), so ``NCCL_X;touch f;Y`` would run."""
    for k in names:
        if not (isinstance(k, str) and _ENV_NAME.fullmatch(k)):
            raise NvkitError(f"The environment variable {k!r} cannot go on a launch line: a name must be letters, "
                             "digits and _ (not starting with a digit). This process's NCCL_* variables are passed "
                             "on to the run: unset that one (del os.environ[name]) and launch again.")


def launch_line(nproc_per_node: int | None = None, *, gpus=..., launcher: str = "torchrun",
                run_dir: str = "RUN_DIR") -> str:
    """The shell line ``nvkit.launch`` runs for these processes, GPUs and launcher, with ``run_dir``
    standing for the run folder (made when the run starts): what the Launch panel shows."""
    require(launcher in strat.LAUNCHERS, f"launcher must be 'torchrun' or 'accelerate', not {launcher!r}.")
    _whole("nproc_per_node", nproc_per_node)
    gpus, device = _where(gpus)
    return _command(nproc_per_node, gpus, launcher, run_dir, device)[2]


def _where(gpus):
    """(the GPUs for the line, "cuda" or "cpu") of a launch from here. Without CUDA in this torch
    the processes train on the CPU whatever the GPU selection (NVKIT_FAKE_GPUS fakes NVML's list,
    not CUDA): the default line then names no GPU, so it says where the run goes."""
    import torch
    if gpus == [] or not torch.cuda.is_available():
        return ([] if gpus is ... else gpus), "cpu"
    return gpus, "cuda"


def _nproc_of(argv: list) -> int:
    for a in argv:
        for key in ("--nproc_per_node=", "--num_processes="):
            if a.startswith(key):
                return int(a.split("=", 1)[1])
    return 1


def _capability(cmd) -> tuple[int, int] | None:
    """The lowest compute capability of the GPUs the line makes visible, read with NVML (no CUDA
    context in the notebook)."""
    visible = cmd.env.get("CUDA_VISIBLE_DEVICES")
    try:
        from ..hardware.inventory import gpus as list_gpus
        gs = list_gpus()
    except Exception:  # noqa: BLE001 - no NVML: the ranks decide for themselves
        return None
    chosen = [g for g in gs if visible is None or str(g.index) in visible.split(",")]
    caps = [g.capability for g in chosen if g.capability]
    return min(caps) if caps else None


def _prepare(cfg: dict, strategy: str, nproc_per_node, *, gpus, launcher: str, offload, nnodes, node_rank,
             rdzv_endpoint, run_dir, mode: str, starting: bool) -> LaunchRun:
    """Check everything, write the run folder and build the LaunchRun (not started)."""
    require(strategy in strat.STRATEGIES,
            f"strategy must be one of {', '.join(repr(x) for x in strat.STRATEGIES)}, not {strategy!r}.")
    require(launcher in strat.LAUNCHERS, f"launcher must be 'torchrun' or 'accelerate', not {launcher!r}.")
    _whole("nproc_per_node", nproc_per_node)
    _check_nodes(nnodes, node_rank, rdzv_endpoint)
    check_env_names(k for k in os.environ if k.startswith("NCCL_"))  # before any folder is made
    import torch
    gpus, device = _where(gpus)
    kw = {} if gpus is ... else {"gpus": gpus}
    probe = launch_command(WORKER, nproc_per_node=nproc_per_node, **kw)
    n = _nproc_of(probe.argv)
    if device == "cuda" and starting:  # a plan for another machine (start=False) may name its GPUs
        visible = probe.env.get("CUDA_VISIBLE_DEVICES")
        strat.check_processes(n, len(visible.split(",")) if visible else torch.cuda.device_count())
    from transformers import AutoConfig
    try:
        model_config = AutoConfig.from_pretrained(cfg["model"])
    except (OSError, ValueError) as e:
        raise NvkitError(f"Cannot read the model's config from {cfg['model']}: {e}") from e
    notes = strat.check(strategy, device=device, nproc=n * (nnodes or 1), mode=mode,
                        quantization=cfg.get("quantization"), offload=offload, launcher=launcher, config=model_config)
    # precision and attention are checked here, in a second, not on every rank after the model loaded
    from ..model.precision import precision
    capability = _capability(probe) if device == "cuda" else None
    if mode == "train" and (device == "cpu" or capability is not None):
        cfg["precision"] = precision(device, capability, cfg.get("precision"))
    attn = cfg.get("attn_implementation")
    if attn:
        from ..model.backends import model_class_for, resolve_attention
        cfg["attn_implementation"] = resolve_attention(attn, device, model_class=model_class_for(model_config))
    kernels = cfg.get("kernels")
    if kernels and (kernels.get("use_kernels") or kernels.get("kernel_config")):
        from ..model.kernels import plan_kernels
        plan_kernels(cfg["model"], device, bool(kernels.get("use_kernels")) or kernels.get("kernel_config") is not None,
                     kernels.get("kernel_config"))
    run_dir = _run_dir(run_dir)
    cmd, env_vars, line = _command(nproc_per_node, gpus, launcher, run_dir, device, nnodes, node_rank, rdzv_endpoint)
    yaml = None
    if launcher == "accelerate":
        yaml = strat.accelerate_config(n * (nnodes or 1), device, cfg.get("precision") or "auto")
    try:
        facts = write_run(cfg, run_dir, strategy, device, line, launcher=launcher, accelerate_yaml=yaml,
                          offload=offload, mode=mode)
    except NvkitError:
        _forget_if_empty(run_dir)
        raise
    import math
    total = 0
    if mode == "train":
        shards = n * (nnodes or 1) if strat.STRATEGIES[strategy].data_parallel else 1
        per_rank_rows = math.ceil(facts["rows"] / shards)
        total = cfg.get("max_steps") or max(1, math.ceil(math.ceil(per_rank_rows / cfg["batch_size"]) / cfg["grad_accum"]
                                                         * float(cfg.get("epochs") or 1)))
    argv = list(cmd.argv)
    if argv and argv[0] == "torchrun":
        # the kernel's own interpreter, whatever PATH holds
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    elif argv[:2] == ["accelerate", "launch"]:
        argv = [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
    env = {**os.environ, **{k: str(v) for k, v in env_vars.items()}, "PYTHONUNBUFFERED": "1"}
    return LaunchRun(line, argv, env, run_dir, total, strategy=strategy, launcher=launcher, mode=mode, notes=notes)


def launch(config: dict | None = None, nproc_per_node: int | None = None, strategy: str = "ddp", *,
           gpus=..., launcher: str = "torchrun", offload: str | None = None, nnodes: int | None = None,
           node_rank: int | None = None, rdzv_endpoint: str | None = None, run_dir: str | None = None,
           start: bool = True, **settings) -> LaunchRun:
    """Fine-tune with LoRA over several GPUs: write a run folder for ``config`` and run nvkit's
    training program on it, one process per GPU of the selection (NCCL; gloo on CPU) under the
    selection's ``CUDA_DEVICE_ORDER``/``CUDA_VISIBLE_DEVICES``. Returns a ``LaunchRun`` whose
    history fills with every rank's metrics.

    ``config``: {"model": path/id/Session (default: the current session, whose quantization,
    attention backend, dtype and kernels the run takes over), "data": ..., "lora": ...,
    "max_steps": ..., "batch_size": ..., "precision": "bf16"/"fp16"/"fp32", ...} (the
    ``nvkit.finetune`` settings; keywords work too).
    ``strategy``: "ddp" (a model copy per GPU), "fsdp" (FSDP2, sharded), "zero2" / "zero3" (DeepSpeed
    ZeRO; ``offload="optimizer"`` or, for ZeRO-3, ``"all"`` moves state to CPU memory) or "tp"
    (tensor parallel). ``launcher``: "torchrun" or "accelerate" (``accelerate launch`` with a config
    file nvkit writes into the run folder). Multi-node: ``nnodes``, ``node_rank``,
    ``rdzv_endpoint="host:port"`` go on the line (run it on each node; ``start=False`` only writes
    the run and returns it with ``.command``). Started here on CUDA, more processes than GPUs are
    chosen is an NvkitError before anything is written."""
    require(isinstance(start, bool), f"start must be True or False, not {start!r}.")
    cfg = _config(config, settings)
    run = _prepare(cfg, strategy, nproc_per_node, gpus=gpus, launcher=launcher, offload=offload, nnodes=nnodes,
                   node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, run_dir=run_dir, mode="train", starting=start)
    return run.start() if start else run


def launch_generate(prompts, model=None, nproc_per_node: int | None = None, *, gpus=..., max_new_tokens: int = 50,
                    do_sample: bool = False, seed: int = 0, launcher: str = "torchrun", run_dir: str | None = None,
                    start: bool = True, **settings) -> LaunchRun:
    """Generate with the model cut across several GPUs (tensor parallel, transformers' plan for the
    model), one process per GPU; returns a ``LaunchRun`` whose ``.texts`` are the continuations
    of ``prompts`` (a string or a list), in order, once it is done (``await run`` or
    ``run.result()``). ``model``: path/id/Session (default: the current session, whose attention
    backend, dtype and kernels the run takes over). Runs on the CPU too (gloo)."""
    require(isinstance(start, bool), f"start must be True or False, not {start!r}.")
    single = isinstance(prompts, str)
    plist = [prompts] if single else prompts
    require(isinstance(plist, (list, tuple)) and len(plist) > 0 and all(isinstance(p, str) and p.strip() for p in plist),
            f"prompts must be a non-empty string or a list of them, not {prompts!r}.")
    _whole("max_new_tokens", max_new_tokens)
    require(isinstance(do_sample, bool), f"do_sample must be True or False, not {do_sample!r}.")
    _whole("seed", seed, lo=0, allow_none=False)
    unknown = set(settings) - {"attn_implementation", "dtype", "kernels"}
    require(not unknown, f"Unknown launch_generate setting(s) {sorted(unknown)}; known: attn_implementation, dtype, "
                         "kernels (and the keywords of the signature).")
    cfg: dict = dict(settings)
    if model is None or hasattr(model, "model_id"):
        s = model if model is not None else current_session()
        for k, v in session_settings(s).items():
            cfg.setdefault(k, v)
        model = s.path
    require(not cfg.get("quantization"),
            f"Tensor-parallel generation cannot cut bitsandbytes' packed 4/8-bit weights ({cfg.get('quantization')!r}); "
            "load the model unquantized, or give model= a path.")
    cfg.pop("quantization", None)
    path, _ = resolve_model(model)
    cfg.update(model=path, prompts=list(plist), max_new_tokens=max_new_tokens, do_sample=do_sample, seed=seed)
    run = _prepare(cfg, "tp", nproc_per_node, gpus=gpus, launcher=launcher, offload=None, nnodes=None, node_rank=None,
                   rdzv_endpoint=None, run_dir=run_dir, mode="generate", starting=start)
    return run.start() if start else run
