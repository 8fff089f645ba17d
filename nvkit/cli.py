"""The ``nvkit`` console script: ``doctor``, ``lab``, ``bench``."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import shutil
import subprocess
import sys

from .errors import NvkitError

PACKAGES = ("torch", "transformers", "peft", "accelerate", "kernels", "bitsandbytes", "flash-attn-4",
            "liger-kernel", "nvidia-ml-py", "ipywidgets", "plotly", "jupyterlab")


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def doctor_report() -> dict:
    """What the guide checks first, as data: CUDA usable?, GPUs, versions, backends and
    quantizations that work here and why the others don't."""
    import torch
    report: dict = {"python": sys.version.split()[0], "versions": {p: _version(p) for p in PACKAGES}}
    report["cuda_available"] = bool(torch.cuda.is_available())
    report["cuda_device_count"] = torch.cuda.device_count() if report["cuda_available"] else 0
    report["torch_cuda_build"] = torch.version.cuda
    report["env"] = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_HUB_OFFLINE")}
    try:
        from .hardware.inventory import gpus, nvml_status
        report["gpus"] = [g.to_dict() for g in gpus()]
        report["nvml"] = nvml_status()
    except ImportError:  # the GPU module is optional for the doctor's first lines
        report["gpus"], report["nvml"] = [], "nvkit.hardware.inventory unavailable"
    for name, fn in (("attention_backends", "model.backends:attention_backends"), ("quantization_methods", "model.quant:quantization_methods")):
        mod, attr = fn.split(":")
        try:
            entries = getattr(importlib_import(f"nvkit.{mod}"), attr)()
            report[name] = [{"name": e.name, "available": e.available, "reason": e.reason, "source": e.source} for e in entries]
        except (ImportError, AttributeError):
            report[name] = []
    return report


def importlib_import(name):
    import importlib
    return importlib.import_module(name)


def _print_doctor(r: dict) -> None:
    print("nvkit doctor")
    print(f"  python {r['python']} · " + " · ".join(f"{k} {v}" for k, v in r["versions"].items() if v))
    missing = [k for k, v in r["versions"].items() if not v]
    if missing:
        print(f"  not installed: {', '.join(missing)}")
    print(f"  torch.cuda.is_available() = {r['cuda_available']} · torch.cuda.device_count() = {r['cuda_device_count']}"
          f" · torch built for CUDA {r['torch_cuda_build'] or '(CPU build)'}")
    env = " ".join(f"{k}={v!r}" for k, v in r["env"].items() if v is not None)
    if env:
        print(f"  environment: {env}")
    if not r["cuda_available"]:
        why = r.get("nvml") or "no NVIDIA driver found"
        print(f"  No CUDA GPU is visible here ({why}). nvkit runs on the CPU with the demo model; "
              "GPU-only features say why they are off.")
    for g in r["gpus"]:
        print(f"  GPU {g['index']}: {g['name']} · {g.get('architecture', '?')} (capability {g.get('capability')}) · "
              f"{g['memory_used'] / 2**30:.1f}/{g['memory_total'] / 2**30:.1f} GiB used · bus {g.get('pci_bus_id')}")
    from .model.backends import fold_kernel_gaps
    for title, key in (("attention backends", "attention_backends"), ("quantization", "quantization_methods")):
        if r.get(key):
            print(f"  {title}:")
            # the flash backends share one Hub-kernel explanation: said once, after them
            reasons, note = fold_kernel_gaps({e["name"]: e["reason"] for e in r[key]})
            for e in r[key]:
                mark = "yes" if e["available"] else "no "
                print(f"    {mark} {e['name']:<22} {reasons[e['name']] or ''}")
            if note:
                print(f"  {note}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="nvkit", description="Hugging Face Transformers on NVIDIA GPUs, from JupyterLab.")
    sub = parser.add_subparsers(dest="cmd")
    d = sub.add_parser("doctor", help="is CUDA usable, which GPUs, versions, what works here and why not")
    d.add_argument("--json", action="store_true")
    lab = sub.add_parser("lab", help="start JupyterLab on nvkit's tutorials")
    lab.add_argument("--dir", default=None, help="where to copy the tutorials (default: ./nvkit-tutorials)")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER)
    b = sub.add_parser("bench", help="side-by-side runs: backends, quantization, fast path, LoRA")
    b.add_argument("bench_args", nargs=argparse.REMAINDER)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # its options, --help included, are the benchmark's own (nvkit.bench.cli_main)
        from .benchmarks.backends import cli_main
        return cli_main(argv[1:])
    # `nvkit lab`'s options other than --dir are JupyterLab's (`nvkit lab --port 9999`): argparse
    # knows none of them, and its REMAINDER only starts at the first word that is not an option
    args, extra = parser.parse_known_args(argv)
    if extra and args.cmd != "lab":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.cmd == "doctor":
            r = doctor_report()
            if args.json:
                import json
                print(json.dumps(r, indent=2, default=str))
            else:
                _print_doctor(r)
            return 0
        if args.cmd == "lab":
            rest = args.lab_args[1:] if args.lab_args[:1] == ["--"] else args.lab_args
            return _lab(args.dir, extra + rest)
        if args.cmd == "bench":
            from .benchmarks.backends import cli_main
            return cli_main(args.bench_args)
        parser.print_help()
        return 0
    except NvkitError as e:
        print(f"nvkit: {e}", file=sys.stderr)
        return 2


def tutorials_dir() -> str:
    """Where the tutorial notebooks are: the checkout's notebooks/ or the copy inside the wheel."""
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(os.path.dirname(here), "notebooks"), os.path.join(here, "tutorials")):
        if os.path.isdir(cand):
            return cand
    raise NvkitError("nvkit's tutorial notebooks were not found (neither notebooks/ in a checkout nor nvkit/tutorials in the package).")


def copy_new(src: str, dst: str) -> bool:
    """Copy ``src`` to ``dst`` only when nothing is at ``dst``, not even a link to a missing file
    (``os.path.exists`` is False for one, and a plain copy would create the file it points to):
    the create is exclusive and does not follow a link. False when something is there."""
    if os.path.lexists(dst):
        return False
    try:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError:  # appeared since the check
        return False
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
            shutil.copyfileobj(f, out)
    except BaseException:
        os.unlink(dst)  # the half copy is the file created just above, nobody else's
        raise
    return True


def copy_tutorials(dest: str) -> list[str]:
    """Copy the tutorial notebooks into ``dest``, never over anything already there (the user's
    edited copy, or a link); returns a line for each name that holds no tutorial because of that
    (a link, or something other than a file); a file already there is the user's copy, kept."""
    src = tutorials_dir()
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as e:
        raise NvkitError(f"Cannot create {dest} for the tutorials: {e.strerror or e}. Give another --dir.") from e
    missing = []
    for name in sorted(os.listdir(src)):
        if not name.endswith(".ipynb"):
            continue
        target = os.path.join(dest, name)
        try:
            if copy_new(os.path.join(src, name), target):
                continue
        except OSError as e:
            raise NvkitError(f"Cannot copy the tutorial {name} into {dest}: {e.strerror or e}.") from e
        if os.path.islink(target):
            missing.append(f"{target} is a symbolic link: nvkit does not copy through links, so this tutorial is not "
                        "there; remove the link to get it.")
        elif not os.path.isfile(target):
            missing.append(f"{target} is not a file: this tutorial is not there; move it away to get it.")
    return missing


def _lab(target: str | None, lab_args: list[str]) -> int:
    dest = os.path.abspath(target or "nvkit-tutorials")
    for line in copy_tutorials(dest):
        print(f"nvkit: {line}", file=sys.stderr)
    print(f"Tutorials in {dest}")
    return subprocess.call([sys.executable, "-m", "jupyterlab", f"--notebook-dir={dest}", *lab_args])


if __name__ == "__main__":
    sys.exit(main())
