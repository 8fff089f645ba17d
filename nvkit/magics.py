"""``%nvkit`` / ``%%nvkit``: a line parsed into the same core calls the panels make.

Each subcommand is a small function ``_cmd_<name>(args, cell)`` registered in ``COMMANDS`` with its
argparse parser. Lines are split with ``shlex`` and parsed with ``parse_intermixed_args`` because
IPython's ``parse_argstring`` fails on ``-n 5 "Hello there"`` and keeps the quotes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Callable

from IPython.core.magic import Magics, line_cell_magic, magics_class

from .errors import NvkitError
from .units import counted


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting the kernel."""

    def error(self, message):
        raise NvkitError(f"%nvkit {self.prog.split()[-1]}: {message}\n\n{self.format_usage().strip().replace('usage: ', 'usage: %')}")

    def exit(self, status=0, message=None):
        if message:
            raise NvkitError(message)
        raise _HelpShown()


class _HelpShown(Exception):
    pass


COMMANDS: dict[str, tuple[_Parser, Callable]] = {}


def command(name: str, help: str):
    """Register ``_cmd`` under ``name``; the decorated function receives (args, cell) and a parser
    it may add arguments to through its ``arguments`` attribute."""
    def deco(fn):
        COMMANDS[name] = (None, fn)  # the parser is built on first use, once every @arg has run
        fn.help = help
        fn.command_name = name
        return fn
    return deco


def _parser_for(name: str) -> "_Parser":
    parser, fn = COMMANDS[name]
    if parser is None:
        # no "%" in prog: argparse %-formats it into its messages
        parser = _Parser(prog=f"nvkit {name}", description=fn.help, add_help=True)
        for args, kwargs in getattr(fn, "_arguments", []):
            parser.add_argument(*args, **kwargs)
        COMMANDS[name] = (parser, fn)
    return parser


def arg(*args, **kwargs):
    def deco(fn):
        fn._arguments = [(args, kwargs), *getattr(fn, "_arguments", [])]
        return fn
    return deco


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["%nvkit COMMAND [options]   (%%nvkit COMMAND: the cell body is the input)", ""]
    for name, (parser, fn) in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {fn.help}")
    lines += ["", "%nvkit COMMAND --help shows a command's options. Examples:",
              '  %nvkit load demo', '  %nvkit generate -n 30 "NVIDIA GPUs are"', "  %nvkit unload"]
    return "\n".join(lines)


def run_line(line: str, cell: str | None = None):
    """Parse and run one ``%nvkit`` line; returns what the command returns (shown by IPython)."""
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise NvkitError(f"%nvkit: cannot split the line ({e}); check the quotes.") from e
    if not words or words[0] in ("help", "-h", "--help"):
        print(usage())
        return None
    name, rest = words[0], words[1:]
    if name not in COMMANDS:
        raise NvkitError(f"%nvkit: unknown command {name!r}. Commands: {', '.join(COMMANDS)}.")
    parser, fn = _parser_for(name), COMMANDS[name][1]
    try:
        args = parser.parse_intermixed_args(rest)
    except _HelpShown:
        return None
    return fn(args, cell)


# --- the commands ----------------------------------------------------------------------------

# @command outermost: it builds the parser from the @arg entries below it.
@command("gpus", "list the GPUs (nvidia-smi order, read with NVML) and the cuda:i mapping in force")
@arg("--json", action="store_true", help="print the GPUs as JSON (what nvkit/api/gpus serves)")
def _cmd_gpus(args, cell):
    from .hardware.inventory import format_table, gpus
    from .hardware.selection import selection
    found = gpus()
    if args.json:
        import json
        print(json.dumps([g.to_dict() for g in found], indent=1))
        return None
    print(format_table(found))
    print()
    print(selection().describe())


@command("select", "choose the GPUs and their order: select 2,0 | select cpu | select all")
@arg("choice", nargs="*", help="nvidia-smi indices in cuda order (2,0 or 2 0), GPU UUIDs, cpu, or all")
def _cmd_select(args, cell):
    from .hardware.selection import select_gpus
    words = " ".join(args.choice).strip()
    if not words:
        raise NvkitError("%nvkit select needs a choice: e.g. %nvkit select 2,0 (cuda:0 = GPU 2), "
                         "%nvkit select cpu, %nvkit select all.")
    print(select_gpus(words).describe())


def _current_or_demo():
    from .model import session as _session
    s = _session.session(required=False)
    if s is None:
        print("No model loaded: loading nvkit's demo model (use %nvkit load MODEL for another).")
        s = _session.load("demo")
    return s


@command("load", "load a model into this kernel (replaces the current one)")
@arg("model", nargs="?", default="demo", help="'demo', a Hub id or a local directory")
@arg("--dtype", default="auto", help="auto, bfloat16, float16, float32")
@arg("--device-map", default=None, help="cuda, auto, cpu (default: cuda when available)")
@arg("--attn", default="auto", help="attention backend, or auto: the best one the model supports here (see %%nvkit backends)")
@arg("--quant", default=None, help="nf4, fp4, int8")
@arg("--kernels", action="store_true", help="use Hub kernels (use_kernels=True)")
@arg("--trust-remote-code", action="store_true", help="run code shipped with the model (off by default)")
def _cmd_load(args, cell):
    from .model import session as _session
    s = _session.load(args.model, dtype=args.dtype, device_map=args.device_map,
                      attn_implementation=args.attn, quantization=args.quant,
                      use_kernels=args.kernels, trust_remote_code=args.trust_remote_code)
    print(s.summary())
    if s.kernels is not None:
        print(f"kernels: {s.kernels['replaced'] or 'no layer replaced'} · unchanged: {', '.join(s.kernels['unchanged']) or '-'}")


@command("backends", "attention backends and quantization methods: which work here, and why the others don't")
@arg("--device", default=None, help="cpu, cuda, cuda:N (default: cuda:0 when a GPU is visible)")
def _cmd_backends(args, cell):
    from .model.backends import attention_backends
    from .model.quant import quantization_methods
    print("attention backends:")
    print(attention_backends(args.device))
    print("quantization:")
    print(quantization_methods(args.device))


@arg("prompt", nargs="*", help="the prompt (or the cell body with %%nvkit generate)")
@arg("-n", "--max-new-tokens", type=int, default=50)
@arg("--sample", action="store_true", help="sample instead of greedy decoding")
@arg("--temperature", type=float, default=None)
@arg("--top-p", type=float, default=None)
@arg("--top-k", type=int, default=None)
@arg("--seed", type=int, default=None)
@arg("--chat", action="store_true", help="wrap the prompt with the tokenizer's chat template")
@arg("--system", default=None, help="system prompt for --chat")
@arg("--stream", dest="stream", action="store_true", default=True, help="print text as it comes (default)")
@arg("--no-stream", dest="stream", action="store_false")
@arg("--fast", dest="fast", action="store_const", const=True, default=None, help="force the fast decode path")
@arg("--no-fast", dest="fast", action="store_const", const=False)
@arg("--batch", action="store_true", help="with %%nvkit generate: one prompt per line")
@arg("--deterministic", action="store_true",
     help="each prompt's text as it is alone, in any list (batch-invariant kernels; a streamed answer comes in one piece)")
@command("generate", "generate text from a prompt (loads the demo model if none is loaded)")
def _cmd_generate(args, cell):
    if cell is not None:
        if not cell.strip():
            raise NvkitError("%%nvkit generate takes its prompt from the cell body, and the body is empty: write the "
                             "prompt under the %%nvkit line (one prompt per line with --batch).")
        body = cell.strip("\n")
        prompts = [p for p in body.splitlines() if p.strip()] if args.batch else body
    else:
        if args.batch:
            raise NvkitError("%nvkit generate --batch takes its prompts from the cell body: use %%nvkit generate --batch, one prompt per line.")
        prompts = " ".join(args.prompt)
    if not prompts or (isinstance(prompts, str) and not prompts.strip()):
        raise NvkitError('%nvkit generate needs a prompt, e.g. %nvkit generate "NVIDIA GPUs are"')
    s = _current_or_demo()
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.sample)
    for key in ("temperature", "top_p", "top_k", "seed"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    if args.chat:
        kwargs["chat"] = True
        if args.system:
            kwargs["system"] = args.system
    if args.fast is not None:
        kwargs["fast"] = args.fast
    if args.deterministic:
        kwargs["deterministic"] = True
    if isinstance(prompts, list):
        for p, out in zip(prompts, s.generate(prompts, **kwargs)):
            print(f"--- {p}\n{out}")
        return None
    line = ProgressLine(prompts)
    if args.stream:
        s.generate(prompts, stream=line.piece, on_progress=line.progress, **kwargs)
        line.piece("")  # the prompt, if no piece came
        print()
    else:
        out = s.generate(prompts, on_progress=line.progress, **kwargs)
        line.clear()
        print(prompts + out)
    return None


class ProgressLine:
    """``%nvkit generate``'s output: while the fast path captures or compiles, "(preparing fast decode… 12 s)"
    on one line that updates in place; the prompt is echoed when the first piece of text arrives
    (the progress line is cleared first), then the pieces as they come."""

    def __init__(self, prompt: str):
        self.prompt = prompt
        self.shown = 0        # length of the progress text on the line now (0: none)
        self.started = False

    def progress(self, st) -> None:
        detail = str(getattr(st, "detail", "") or "")
        if not self.started and detail.startswith("preparing"):
            text = f"({detail})"
            # \r returns to the line's start; spaces cover a longer text written before
            print("\r" + text + " " * max(0, self.shown - len(text)), end="", flush=True)
            self.shown = len(text)

    def clear(self) -> None:
        if self.shown:
            print("\r" + " " * self.shown + "\r", end="", flush=True)
            self.shown = 0

    def piece(self, text: str) -> None:
        if not self.started:
            self.started = True
            self.clear()
            print(self.prompt, end="", flush=True)
        if text:
            print(text, end="", flush=True)


@command("unload", "unload the model and report the memory freed")
def _cmd_unload(args, cell):
    from .model import session as _session
    s = _session.session(required=False)
    if s is None:
        print("No model is loaded.")
        return None
    freed = s.unload()
    from .units import fmt_bytes
    report = getattr(s, "unload_report", None)
    print(report if report is not None else f"Unloaded {s.model_id}: {fmt_bytes(freed)} freed.")


@command("stop", "stop the generation or fine-tune running in the background")
def _cmd_stop(args, cell):
    from .model import session as _session
    s = _session.session(required=False)
    if s is not None:
        s.stop()
        run = s.training
        if run is not None and not run.done:
            run.stop()


@command("finetune", "LoRA fine-tune of the loaded model: finetune DATA_FILE | %%nvkit finetune (one example per line)")
@arg("data", nargs="?", default=None, help="a local .jsonl/.json/.csv/.txt file (or the cell body with %%nvkit finetune)")
@arg("--steps", type=int, default=None, help="training steps (default: one epoch)")
@arg("--epochs", type=float, default=None)
@arg("--r", type=int, default=16, help="LoRA rank")
@arg("--alpha", type=int, default=None, help="LoRA alpha (default 2 × r)")
@arg("--lr", type=float, default=2e-4, help="learning rate")
@arg("--batch-size", type=int, default=8)
@arg("--seq-len", type=int, default=512)
@arg("--grad-accum", type=int, default=1)
@arg("--gradient-checkpointing", action="store_true")
@arg("--output-dir", default=None)
@arg("--save-every", type=int, default=None, help="write a resumable checkpoint every N steps (Stop writes one too)")
@arg("--eval-split", type=float, default=None, help="hold this share of the data out for evaluation, e.g. 0.1")
@arg("--eval-data", default=None, help="a local file of held-out examples to evaluate on instead")
@arg("--eval-every", type=int, default=None, help="evaluate every N steps (and always before the first and at the end)")
@arg("--resume", action="store_true",
     help="continue the latest checkpoint of --output-dir (or of this session's last run); same data and settings")
@arg("--resume-from", default=None, metavar="CHECKPOINT", help="continue this checkpoint-N folder")
@arg("--background", action="store_true", help="return the run at once instead of waiting (see _.history)")
def _cmd_finetune(args, cell):
    from .train.data import parse_examples
    from .train.finetune import finetune
    if cell is not None and cell.strip():
        data = parse_examples(cell)
    elif args.data:
        data = args.data
    else:
        raise NvkitError("%nvkit finetune needs data: a file (%nvkit finetune data.jsonl --steps 50) or "
                         "examples in the cell body (%%nvkit finetune, one per line).")
    s = _current_or_demo()
    run = finetune(s, data, lora=dict(r=args.r, alpha=args.alpha if args.alpha is not None else 2 * args.r),
                   max_steps=args.steps, epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size,
                   seq_len=args.seq_len, grad_accum=args.grad_accum,
                   gradient_checkpointing=args.gradient_checkpointing, output_dir=args.output_dir,
                   save_every=args.save_every, eval_split=args.eval_split, eval_data=args.eval_data,
                   eval_every=args.eval_every,
                   resume=args.resume_from or args.resume)
    resumed = f", resuming at step {run.first_step} from {run.info['resumed_from']}" if run.info.get("resumed_from") else ""
    print(f"Fine-tuning {s.model_id}: {counted(run.total_steps, 'step')}, {run.info['precision']}, "
          f"LoRA r={args.r}{resumed} → {run.adapter_dir}")
    if args.background:
        return run
    # printed from this (the main) thread, so the lines land in this cell
    every = max(1, run.total_steps // 10)
    evals = 0
    try:
        for rec in run.follow():
            if rec["step"] % every == 0 or rec["step"] == run.total_steps:
                print(f"step {rec['step']}/{run.total_steps} · loss {rec['loss']:.4f} · "
                      f"{rec['tokens_per_s']:.0f} tok/s")
            evals = _print_evals(run, evals)
    except KeyboardInterrupt:
        print("Interrupted: stopped after the current step.")
    run.result()
    _print_evals(run, evals)
    sm = run.summary()
    print(f"{'Stopped' if run.stopped else 'Done'}: {counted(sm['steps'], 'step')} in {sm['seconds']:.1f} s · "
          f"{sm['tokens_per_s']:.0f} tok/s · adapter {sm['adapter_dir']}")
    if sm["eval_loss_before"] is not None:
        print(f"eval loss {sm['eval_loss_before']:.4f} → {sm['eval_loss_after']:.4f} · perplexity "
              f"{sm['eval_perplexity_before']:.2f} → {sm['eval_perplexity_after']:.2f}")
    if sm["stop_reason"]:
        print(f"ended early: {sm['stop_reason']}")
    if sm["checkpoint"]:
        print(f"checkpoint {sm['checkpoint']} (%nvkit finetune ... --resume continues from it)")
    return None


def _print_evals(run, shown: int) -> int:
    """Print the run's evaluations after the first ``shown``; returns how many there are now."""
    new = list(run.eval_history)[shown:]
    for e in new:
        print(f"eval at step {e['step']} · loss {e['eval_loss']:.4f} · perplexity {e['eval_perplexity']:.2f}")
    return shown + len(new)


@arg("--unit", default="auto", choices=("auto", "bytes", "MiB", "GiB"), help="auto (human sizes), bytes, MiB or GiB")
@arg("--reset", action="store_true", help="start a new peak window after printing")
@command("memory", "GPU memory per device: NVML used vs torch allocated/reserved, the rest, peaks, prediction")
def _cmd_memory(args, cell):
    from . import memory
    if args.unit == "auto":
        print(memory.format_report())
    else:
        print(memory.memory_report(unit=args.unit).to_string())
    if args.reset:
        memory.reset_peak()


@arg("text", nargs="*", help="what to write on the memory chart")
@command("mark", "put an event on the memory chart: mark before LoRA")
def _cmd_mark(args, cell):
    from .events import mark
    text = " ".join(args.text) or (cell or "").strip()
    if not text:  # checked here: argparse's own "required" message trips over the % in the prog name
        raise NvkitError("%nvkit mark needs a text, e.g. %nvkit mark before LoRA")
    ev = mark(text)
    print(f"marked at {ev.t:.1f} s: {ev.text}")


# --- IPython glue ------------------------------------------------------------------------------

@magics_class
class NvkitMagics(Magics):
    @line_cell_magic
    def nvkit(self, line, cell=None):
        try:
            return run_line(line, cell)
        except NvkitError as e:
            # One readable line, not a traceback: the session stays usable.
            print(f"NvkitError: {e}", file=sys.stderr)
            return None


def load_ipython_extension(ipython):
    # A GPU choice saved before a kernel restart is applied here, before any CUDA work.
    from .hardware.selection import apply_saved
    apply_saved()
    NvkitMagics.nvkit.__doc__ = usage()  # %nvkit? shows every command
    ipython.register_magics(NvkitMagics)
