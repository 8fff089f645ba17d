"""Write the tutorial notebooks in notebooks/ from the cells below: ``python scripts/make_notebooks.py``.

The notebooks are generated so that all ten share one layout (title, parameters, explanation and
code, light assertions) and so that a change reads as a plain diff of this file. They are written
without outputs or execution counts; ``tests/test_notebooks.py`` runs every one of them.

Conventions inside the notebooks:
- the first cell is markdown starting with ``# Title`` (the lab launcher shows that line);
- the second is the parameters cell (``MODEL = os.environ.get("NVKIT_MODEL", "demo")``, ...), so
  CI runs them on the CPU with the demo model and the GPU run swaps in a real-size model;
- a cell that needs a CUDA GPU prints ``Skipped: ...`` with the reason when there is none;
- ``assert`` lines check the key results, so executing a notebook is a test.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "notebooks"

PARAMS = '''\
import os

# Parameters: CI runs these notebooks on the CPU with nvkit's demo model; on a GPU machine set
# NVKIT_MODEL to a real checkpoint directory, a Hub id, or nvkit.demo.shaped("qwen3-0.6b").
MODEL = os.environ.get("NVKIT_MODEL", "demo")
'''


def md(text: str):
    return ("markdown", textwrap.dedent(text).strip("\n"))


def code(text: str):
    return ("code", textwrap.dedent(text).strip("\n"))


def params(extra: str = ""):
    return code(PARAMS + textwrap.dedent(extra))


# --- 00 ------------------------------------------------------------------------------------------

START = [
    md("""
    # Start here: nvkit in ten minutes

    nvkit runs Hugging Face Transformers on NVIDIA GPUs from a notebook. You pick GPUs, an attention
    backend, Hub kernels and quantization in small panels, load a model into the kernel, generate
    text, run a short LoRA fine-tune and watch GPU memory live. Every panel can print the Python it
    runs (`panel.code()`), so whatever you click can become a cell you keep.

    Everything in these tutorials also runs on a laptop without a GPU: nvkit ships a tiny demo model
    (`nvkit.load("demo")`, a 4 M parameter Qwen3 trained on a small corpus) and never needs the
    Hugging Face Hub for it. Cells that only make sense on a CUDA GPU print why they were skipped.

    | notebook | topic |
    |---|---|
    | 00-start-here | what nvkit is, `nvkit doctor`, the whole app in one widget |
    | 01-check-the-gpu | is CUDA usable here, how many GPUs, the driver's view vs PyTorch's |
    | 02-select-gpus | choosing and ordering GPUs: `CUDA_VISIBLE_DEVICES`, `PCI_BUS_ID`, torchrun lines |
    | 03-attention-backends | sdpa, FlashAttention 2/3/4, switching, measuring |
    | 04-inference | load, `device_map`, generate, chat, batches, `%nvkit generate`, the fast path |
    | 05-hub-kernels | `use_kernels`, `KernelConfig`, local kernels, train/eval switching |
    | 06-quantization | 4-bit and 8-bit, footprint, estimate vs measurement |
    | 07-training | Trainer, bf16/fp16, LoRA and QLoRA with the fine-tune panel |
    | 08-distributed-training | torchrun, DDP vs FSDP2, `nvkit.launch` |
    | 09-gpu-memory | where memory goes, the live monitor, estimates, out-of-memory post-mortems |
    """),
    params(),
    md("""
    ## Is this machine ready? `nvkit doctor`

    In a terminal, `nvkit doctor` answers the first questions: can PyTorch use CUDA, which GPUs the
    driver reports, which versions are installed, and which attention backends and quantization
    methods work here (and why the others don't). The same entry point runs inside the notebook:
    """),
    code("""
    from nvkit.cli import doctor_report, main as nvkit_cli

    exit_code = nvkit_cli(["doctor"])  # prints exactly what `nvkit doctor` prints in a terminal
    assert exit_code == 0
    """),
    md("The same facts come as data from `doctor_report()`, for your own checks:"),
    code("""
    report = doctor_report()
    working = [b["name"] for b in report["attention_backends"] if b["available"]]
    print("CUDA usable:", report["cuda_available"], "· CUDA devices:", report["cuda_device_count"])
    print("attention backends that work here:", ", ".join(working))
    assert "sdpa" in working  # PyTorch's own attention works everywhere
    """),
    md("""
    ## The whole kit in one widget: `nvkit.panel()`

    Five tabs, one per step: **GPUs** (choose and order them), **Model** (what to load and how, with
    a memory estimate before loading), **Generate**, **Fine-tune** and **Memory** (a live chart).
    Each tab is also a panel of its own: `nvkit.GPUSelector()`, `nvkit.LoadPanel()`,
    `nvkit.GeneratePanel()`, `nvkit.FinetunePanel()`, `nvkit.MemoryChart()`.
    """),
    code("""
    import nvkit

    app = nvkit.panel()
    app.parts["Model"].model.value = MODEL  # the Model tab starts on this notebook's model
    app
    """),
    md("`app.code()` is the Python for what the tabs are set to now; change a tab and run it again:"),
    code("""
    print(app.code())
    assert "nvkit.select_gpus(" in app.code() and "nvkit.load(" in app.code()
    """),
    md("""
    ## The same thing from code

    `nvkit.load` returns a `Session`; `s.model` and `s.tokenizer` are the plain transformers objects.
    Generation runs in a worker thread: Interrupt stops it cleanly, and `await s.agenerate(...)`
    keeps the notebook's widgets responsive while it runs.
    """),
    code("""
    s = nvkit.load(MODEL)
    print(s.summary())

    prompt = "NVIDIA GPUs are"
    text = s.generate(prompt, max_new_tokens=24)
    print(prompt + text)
    print(s.last_stats)
    assert isinstance(text, str) and text
    """),
    md("""
    ## Or from a cell: `%nvkit`

    `%load_ext nvkit` adds the `%nvkit` magic (`%nvkit?` lists its commands). It uses the model that
    is loaded, or loads the demo model when none is.
    """),
    code("""
    %load_ext nvkit
    %nvkit generate -n 16 "A GPU is"
    """),
    code("""
    freed = s.unload()
    print(f"unloaded, {freed / 2**20:.1f} MiB freed")
    """),
    md("Next: **01-check-the-gpu**."),
]

# --- 01 ------------------------------------------------------------------------------------------

CHECK = [
    md("""
    # Check the GPU: is CUDA usable here?

    Two programs can tell you about your GPUs, and they don't always agree:

    - the **driver**, through NVML (the library behind `nvidia-smi`): every GPU in the machine,
      in PCI bus order, with memory and utilization. Asking NVML does not start CUDA.
    - **PyTorch**, through the CUDA runtime: only the GPUs this process may use
      (`CUDA_VISIBLE_DEVICES`), numbered `cuda:0`, `cuda:1`, ... Asking it starts CUDA's driver.

    nvkit lists GPUs with NVML, so a GPU choice made afterwards (tutorial 02) still counts.
    """),
    params(),
    md("## What the driver sees"),
    code("""
    import nvkit
    from nvkit.gpus import nvml_status

    gpus = nvkit.gpus()
    print(nvml_status())
    for g in gpus:
        print(g)
    print("CUDA started in this process yet?", nvkit.selection().cuda_initialized)
    assert not nvkit.selection().cuda_initialized  # reading NVML never starts CUDA
    """),
    md("`%nvkit gpus` prints the same as a table, with the processes using each GPU:"),
    code("""
    %load_ext nvkit
    %nvkit gpus
    """),
    md("""
    ## What PyTorch sees

    The guide's check. On a machine with four usable GPUs it prints `True 4`; without a GPU (or
    without a working driver) `False 0`.
    """),
    code("""
    import torch

    print(torch.cuda.is_available(), torch.cuda.device_count())
    """),
    md("""
    `torch.cuda.is_available()` already starts the CUDA driver when there is one. From then on, this
    process keeps the GPUs it saw, whatever `CUDA_VISIBLE_DEVICES` says later: choose GPUs before
    anything touches CUDA.
    """),
    code("""
    print("CUDA started in this process now?", nvkit.selection().cuda_initialized)
    # NVML lists every GPU of the machine; CUDA only those this process may use
    assert len(gpus) >= torch.cuda.device_count()
    """),
    md("""
    ## Each CUDA device in detail

    The compute capability decides what a GPU can do: bf16 arithmetic and FlashAttention 2/3 need
    8.0 (Ampere) or newer, FlashAttention-4 9.0 (Hopper) or newer.
    """),
    code("""
    if not torch.cuda.is_available():
        print("Skipped: per-device properties need a CUDA GPU (this machine has none).")
    else:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            cc = (p.major, p.minor)
            precision = "bf16" if cc >= (8, 0) else "fp16 (bf16 needs Ampere or newer)"
            print(f"cuda:{i}: {p.name} · capability {p.major}.{p.minor} · "
                  f"{p.total_memory / 2**30:.1f} GiB · {p.multi_processor_count} SMs · train in {precision}")
        free, total = torch.cuda.mem_get_info(0)
        print(f"cuda:0 free now: {free / 2**30:.1f} of {total / 2**30:.1f} GiB")
        assert total > 0
    """),
    md("## The doctor agrees"),
    code("""
    from nvkit.cli import doctor_report

    r = doctor_report()
    print({k: r[k] for k in ("cuda_available", "cuda_device_count", "torch_cuda_build")})
    assert r["cuda_available"] == torch.cuda.is_available()
    assert r["cuda_device_count"] == torch.cuda.device_count()
    """),
    md("""
    ## Where a model lands

    Without a `device_map`, `nvkit.load` puts the model on `cuda` when a GPU is usable and on the CPU
    otherwise, and says which in its summary.
    """),
    code("""
    s = nvkit.load(MODEL)
    print(s.summary())
    assert s.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.ones(3, device=s.device)
    print("a tensor on the model's device:", x.device)
    s.unload();
    """),
    md("Next: **02-select-gpus**."),
]

# --- 02 ------------------------------------------------------------------------------------------

SELECT = [
    md("""
    # Select and order GPUs

    `CUDA_VISIBLE_DEVICES` chooses which GPUs a process may use and in which order:
    `CUDA_VISIBLE_DEVICES=2,0` makes GPU 2 `cuda:0` and GPU 0 `cuda:1`; an empty value means no GPU
    at all. Three rules make it work as intended:

    1. **Put it on the same line as the command** (`CUDA_VISIBLE_DEVICES=2,0 torchrun train.py`).
       An `export` you forgot sends later runs to the wrong GPUs without a word.
    2. **Set `CUDA_DEVICE_ORDER=PCI_BUS_ID`.** By default CUDA numbers GPUs fastest first, which can
       differ from `nvidia-smi`'s numbering; with PCI_BUS_ID the indices are `nvidia-smi`'s.
    3. **Set it before CUDA starts.** CUDA reads it once per process.

    `nvkit.select_gpus` does all three for this kernel; `nvkit.launch_command` writes the line for
    scripts. This notebook never starts CUDA before the last section, so every choice takes effect.
    """),
    params(),
    md("""
    ## The GPUs of this machine

    Indices are `nvidia-smi`'s. On a machine without an NVIDIA GPU this tutorial uses nvkit's fake
    inventory (`NVKIT_FAKE_GPUS=4`, four H200s): only nvkit's view of the hardware is fake, the
    variables it sets and the mapping it computes are the real ones.
    """),
    code("""
    import nvkit

    gpus = nvkit.gpus()
    if not gpus:
        os.environ["NVKIT_FAKE_GPUS"] = "4"
        gpus = nvkit.gpus()
        print("No NVIDIA GPU on this machine: using NVKIT_FAKE_GPUS=4 (four fake H200s) below.")
    for g in gpus:
        print(g)
    """),
    md("""
    ## Choose and order: `nvkit.select_gpus`

    The guide's example: GPU 2 as `cuda:0` and GPU 0 as `cuda:1` (on a machine with fewer GPUs, the
    ones there are, in reverse order).
    """),
    code("""
    usable = [d.index for d in nvkit.selection().devices]  # all GPUs, unless the kernel started with a subset
    choice = [2, 0] if {0, 2} <= set(usable) else usable[::-1]
    sel = nvkit.select_gpus(choice)
    print(sel)
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, choice))
    assert [d.index for d in sel.devices] == choice  # cuda:i is the i-th GPU of the choice
    """),
    md("`nvkit.selection()` tells what is in force in this process at any time:"),
    code("""
    print(nvkit.selection())
    print(nvkit.selection().mapping["cuda:0"])
    """),
    md("""
    ## CPU only

    An empty `CUDA_VISIBLE_DEVICES` hides every GPU: PyTorch then runs on the CPU.
    `nvkit.select_gpus([])` sets it (and `%nvkit select cpu` does the same from a cell).
    """),
    code("""
    cpu = nvkit.select_gpus([])
    print(cpu)
    assert cpu.cpu_only and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    """),
    md("""
    ## nvidia-smi's order and CUDA's: `PCI_BUS_ID`

    `nvidia-smi` numbers GPUs by PCI bus id. CUDA, unless told otherwise, puts the fastest first, so
    in a machine with mixed GPUs "GPU 1" can mean two different cards. Here is what nvkit notices
    when the order variable is missing:
    """),
    code("""
    for g in gpus:
        print(f"nvidia-smi GPU {g.index}: bus {g.pci_bus_id} · {g.name}")

    os.environ.pop("CUDA_DEVICE_ORDER")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, choice))  # as a hand-written export would
    print(nvkit.selection())
    assert any("PCI_BUS_ID" in note for note in nvkit.selection().notes)
    """),
    md("Selecting through nvkit always sets both variables:"),
    code("""
    sel = nvkit.select_gpus(choice)
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not any("is not PCI_BUS_ID" in note for note in sel.notes), sel.notes
    print(sel.env_line)
    """),
    md("""
    ## The selector panel

    Tick GPUs in the order you want them (`cuda:0` first), reorder with the arrows, or choose
    *CPU only* / *All GPUs*, then **Apply**. The panel starts from the choice in force and shows the
    `cuda:i` mapping and the matching torchrun line as you click; `.code()` is the call Apply makes.
    """),
    code("""
    selector = nvkit.GPUSelector()
    selector
    """),
    code("""
    print(selector.code())
    assert selector.code().strip().endswith(f"nvkit.select_gpus({choice})")
    """),
    md("""
    ## The line for scripts: torchrun and accelerate

    A training script runs in a new process, so it needs the variables on its own command line.
    `nvkit.launch_command` writes it for this kernel's choice (or `gpus=` another one); the process
    count defaults to the number of GPUs chosen.
    """),
    code("""
    line = nvkit.launch_command("train.py")
    print(line)
    print(nvkit.launch_command("train.py", launcher="accelerate"))
    print(nvkit.launch_command("train.py", gpus=[]))  # no GPU: CUDA_VISIBLE_DEVICES= (empty)
    expected = (f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={','.join(map(str, choice))} "
                f"torchrun --nproc_per_node={len(choice)} train.py")
    assert line == expected, line
    """),
    md("""
    ## Once CUDA has started, a new choice waits for a restart

    After the first CUDA call the process keeps its GPUs. nvkit then changes nothing, says so, and
    keeps the new choice for this kernel: after *Kernel ▸ Restart* it is applied as soon as nvkit is
    imported, before any CUDA work. (The selector panel shows the same warning.)
    """),
    code("""
    if os.environ.get("NVKIT_FAKE_GPUS"):
        print("Skipped: starting CUDA needs a real NVIDIA GPU (this machine has none; the GPUs above are fake).")
    else:
        import torch

        nvkit.select_gpus(None)  # all GPUs again
        if not torch.cuda.is_available():  # this call starts CUDA
            print("Skipped: the driver lists GPUs but CUDA is not usable in this process (see nvkit doctor).")
        else:
            torch.cuda.init()
            later = nvkit.select_gpus([])
            print(later)
            assert later.restart_needed and not later.in_force
            print(nvkit.select_gpus(None))  # back to what is in force: nothing waits for a restart
    """),
    md("Next: **03-attention-backends**."),
]

# --- 03 ------------------------------------------------------------------------------------------

ATTENTION = [
    md("""
    # Attention backends

    `attn_implementation` chooses the attention code when a model is loaded, for inference and for
    training alike:

    | backend | needs | when the package is missing |
    |---|---|---|
    | `sdpa` (default) | PyTorch | built in; on CUDA it picks flash / memory-efficient kernels itself |
    | `eager` | PyTorch | built in; plain matmuls, slowest |
    | `flash_attention_2` | Ampere or newer | Hub kernel `kernels-community/flash-attn2` |
    | `flash_attention_3` | Ampere or newer (written for Hopper) | Hub kernel `kernels-community/vllm-flash-attn3` |
    | `flash_attention_4` | Hopper or newer | Hub kernel `kernels-community/flash-attn4` |

    Transformers falls back to a Hub kernel without saying so, and offline that fails deep inside
    `from_pretrained`. nvkit checks first: each backend is listed with whether it works on this
    device and, when it doesn't, why.
    """),
    params(),
    code("""
    import nvkit
    import torch

    backends = nvkit.attention_backends()
    backends
    """),
    code("""
    for c in backends:
        if not c.available:
            print(f"{c.name}: {c.reason}")
    assert backends["sdpa"].available and backends["eager"].available
    """),
    md("""
    ## Choosing a backend in the Model panel

    Unavailable backends are greyed out (hover for the reason). Here the panel is set to `eager`
    from code, as a click would, then loads; `.code()` is the `nvkit.load` call it makes.
    """),
    code("""
    panel = nvkit.LoadPanel(model=MODEL)
    panel.select_attention("eager")
    panel
    """),
    code("""
    print(panel.code())
    s = await panel.load()  # loads in a worker thread; the notebook stays responsive
    print(s.summary())
    assert "attn_implementation='eager'" in panel.code()
    assert s.info["attention"] == "eager"
    """),
    md("""
    ## Switching on a loaded model

    `s.set_attention(name)` switches without reloading the weights; an unknown or unusable backend
    raises `NvkitError` with the reason and leaves the model as it was. `"auto"` picks by what
    `nvkit.bench` measured: on an H200 with the Qwen3-0.6B shape (prompt 512, batch 1) sdpa prefilled
    20.1 k tok/s against FlashAttention-4's 13.1 k, and decoded 41.8 against 33.7 tok/s, so sdpa comes
    first and the FlashAttention backends follow. Pass a backend by name to use it anyway.
    """),
    code("""
    prompt = "NVIDIA GPUs are"
    eager_text = s.generate(prompt, max_new_tokens=16)
    print("now:", s.set_attention("sdpa"))
    sdpa_text = s.generate(prompt, max_new_tokens=16)
    print("eager:", repr(eager_text))
    print("sdpa: ", repr(sdpa_text))
    print("same greedy text:", eager_text == sdpa_text)
    assert s.info["attention"] == "sdpa" and sdpa_text
    """),
    code("""
    unusable = [c.name for c in backends if not c.available]
    if not unusable:
        print("Every backend works on this device: no refusal to show.")
    else:
        try:
            s.set_attention(unusable[0])
            raise AssertionError(f"{unusable[0]} was accepted although it is listed as unavailable")
        except nvkit.NvkitError as e:
            print(e)
        assert s.info["attention"] == "sdpa"  # unchanged
    print("auto picks:", s.set_attention("auto"))
    """),
    md("""
    ## FlashAttention on this GPU

    On a GPU with FlashAttention installed (`pip install 'nvkit[fa4]'` brings FlashAttention-4 for
    Hopper and newer), load with it directly. Without the package, nvkit tells you which Hub kernel
    transformers would fetch instead and whether it is in your local cache.
    """),
    code("""
    flash = [c.name for c in backends if c.available and c.name.startswith("flash_attention")]
    if not torch.cuda.is_available():
        print("Skipped: FlashAttention needs a CUDA GPU (Ampere or newer; FA4 Hopper or newer), and this machine has none.")
    elif not flash:
        print("Skipped: no FlashAttention version is usable on this GPU:")
        for c in backends:
            if c.name.startswith("flash_attention"):
                print(f"  {c.name}: {c.reason}")
    else:
        s = nvkit.load(MODEL, attn_implementation=flash[0])
        text = s.generate(prompt, max_new_tokens=16)
        print(s.summary())
        print(prompt + text)
        assert s.info["attention"] == flash[0] and text
    """),
    md("""
    ## Measure: `nvkit.bench`

    Every available backend on the same random prompts, against plain transformers with sdpa: time
    to first token (prefill), decode speed, peak memory, and how many greedy tokens match the
    reference. On the CPU with the demo model the numbers are tiny; on a GPU use a real-size model.
    """),
    code("""
    to_try = ["sdpa", "eager"] + flash
    df = nvkit.bench(MODEL, backends=to_try, prompt_len=64, new_tokens=16, repeats=1)
    assert (df["error"] == "").all(), df[df["error"] != ""]
    assert len(df) == len(to_try) + 1  # plus the plain-transformers reference row
    df
    """),
    code("""
    from nvkit.bench import bench_chart

    bench_chart(df)
    """),
    md("Next: **04-inference**."),
]

# --- 04 ------------------------------------------------------------------------------------------

INFERENCE = [
    md("""
    # Inference: load, generate, chat, batch

    `device_map="cuda"` puts the whole model on one GPU; `device_map="auto"` spreads a model that
    does not fit one GPU over the visible ones (and the CPU if need be). nvkit's default is `cuda`
    when a GPU is usable, else the CPU.
    """),
    params('''
    DEVICE_MAP = os.environ.get("NVKIT_DEVICE_MAP") or None  # None: cuda when a GPU is usable, else cpu
    '''),
    code("""
    import nvkit
    import torch

    HAS_CUDA = torch.cuda.is_available()
    s = nvkit.load(MODEL, device_map=DEVICE_MAP)
    print(s.summary())
    print("placement:", s.info["placement"])
    """),
    md("""
    ## The guide's code, on the loaded model

    `s.model` and `s.tokenizer` are the plain transformers objects, so the guide's generate call
    works on them unchanged:
    """),
    code("""
    prompt = "NVIDIA GPUs are"
    inputs = s.tokenizer(prompt, return_tensors="pt").to(s.model.device)
    output = s.model.generate(**inputs, max_new_tokens=30, do_sample=False)
    plain = s.tokenizer.decode(output[0], skip_special_tokens=True)
    print(plain)
    assert plain.startswith(prompt) and len(plain) > len(prompt)
    """),
    md("""
    ## `s.generate`

    The same in one call, in a worker thread (Interrupt stops it cleanly), with statistics.
    `stream=` receives the text as it comes.
    """),
    code("""
    text = s.generate(prompt, max_new_tokens=30, stream=lambda piece: print(piece, end="", flush=True))
    print()
    print(s.last_stats)
    assert isinstance(text, str) and text
    if not HAS_CUDA:  # on the CPU both run transformers' generate: same greedy tokens
        assert prompt + text == plain
    """),
    md("""
    `await s.agenerate(...)` does the same while the notebook keeps serving widget clicks (a Stop
    button, for instance):
    """),
    code("""
    text = await s.agenerate("A GPU is", max_new_tokens=20)
    print("A GPU is" + text)
    assert text
    """),
    md("""
    ## Chat

    `chat=True` wraps the prompt with the tokenizer's chat template; `system=` and `history=` give
    the rest of the conversation.
    """),
    code("""
    reply = s.generate("What does CUDA_VISIBLE_DEVICES do?", chat=True, system="You answer briefly.",
                       max_new_tokens=40)
    print(reply)
    history = [{"role": "user", "content": "What does CUDA_VISIBLE_DEVICES do?"},
               {"role": "assistant", "content": reply}]
    follow_up = s.generate("And CUDA_DEVICE_ORDER?", chat=True, history=history, max_new_tokens=40)
    print(follow_up)
    assert isinstance(reply, str) and isinstance(follow_up, str)
    """),
    md("""
    ## Batches

    A list of prompts gives a list of answers in the same order. On a GPU nvkit runs them through
    transformers' continuous batching (requests join and leave the running batch, CUDA graphs where
    they help); on the CPU as one padded batch.
    """),
    code("""
    prompts = ["NVIDIA GPUs are", "Attention kernels", "Quantization saves"]
    outs = s.generate(prompts, max_new_tokens=20)
    for p, o in zip(prompts, outs):
        print(f"{p!r} -> {o!r}")
    print(s.last_stats)
    assert isinstance(outs, list) and len(outs) == len(prompts)
    """),
    md("""
    ## From a cell: `%nvkit generate`

    `-n` sets the number of new tokens; `%%nvkit generate --batch` takes one prompt per line.
    """),
    code("""
    %load_ext nvkit
    %nvkit generate -n 20 "Tensor cores"
    """),
    code("""
    %%nvkit generate --batch -n 12
    NVIDIA GPUs are
    The KV cache
    """),
    md("""
    ## The Generate panel

    Prompt, chat mode, greedy or sampled decoding, Generate and Stop, the streamed output and the
    statistics. Here it is filled in and started from code, as a click would.
    """),
    code("""
    gen = nvkit.GeneratePanel()
    gen.prompt.value = "NVIDIA GPUs are"
    gen.max_new_tokens.value = 24
    gen
    """),
    code("""
    await gen.start()  # Generate; gen.stop() is the Stop button
    print(gen.code())
    print(gen.stats.value)
    assert gen.text and gen.last_error is None
    """),
    md("""
    ## The fast path (GPU)

    For one prompt on a CUDA GPU nvkit decodes with a static KV cache and replays a CUDA graph that
    holds several decode steps, so the GPU is not kept waiting by Python between tokens. It is used
    automatically when it applies (`fast=None`); `fast=True` insists and says why when it can't.
    Capturing costs tens of seconds once per session, length bucket and sampling mode, so by default
    a short request (under 128 new tokens) that would have to wait for it runs plain `generate`
    instead, and the status says so; `fast=True` or a longer request captures it, and from then on
    every request of that size takes the fast path.
    """),
    code("""
    if not HAS_CUDA:
        print("Skipped: the fast path replays CUDA graphs and needs a CUDA GPU (this machine has none).")
    else:
        slow = s.generate(prompt, max_new_tokens=64, fast=False)
        slow_stats = s.last_stats
        fast = s.generate(prompt, max_new_tokens=64, fast=True)  # the first call captures the graphs
        fast = s.generate(prompt, max_new_tokens=64, fast=True)
        print("plain:", slow_stats)
        print("fast: ", s.last_stats)
        assert s.last_stats.path != slow_stats.path and fast
    """),
    md("""
    ## Spreading a model over GPUs: `device_map="auto"`

    With several GPUs, accelerate places whole layers on each in turn (`max_memory=` caps each one).
    """),
    code("""
    if not HAS_CUDA:
        print("Skipped: device_map='auto' spreads a model over CUDA GPUs (this machine has none).")
    else:
        n = torch.cuda.device_count()
        limits = None if n < 2 else {i: f"{max(1, torch.cuda.get_device_properties(i).total_memory // 2**30 // 4)}GiB"
                                    for i in range(n)}
        s = nvkit.load(MODEL, device_map="auto", max_memory=limits)
        print(s.summary())
        for dev, modules in s.info["placement"].items():
            print(f"{dev}: {len(modules)} module(s)")
        if n < 2:
            print("One GPU visible: everything lands on cuda:0.")
        assert s.generate(prompt, max_new_tokens=8)
    """),
    code("""
    print(f"{s.unload() / 2**20:.1f} MiB freed")
    """),
    md("Next: **05-hub-kernels**."),
]

# --- 05 ------------------------------------------------------------------------------------------

KERNEL_LAYERS = '''
import torch
from torch import nn

CALLS = [0]  # counts forward calls, so we can see the kernel run


class RMSNorm(nn.Module):
    """Replaces the forward of the model's RMSNorm layers. A kernel layer defines no __init__:
    kernels swaps in its forward and keeps the module's own weight and epsilon."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        CALLS[0] += 1
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)
'''

KERNELS = [
    md("""
    # Hub kernels

    `use_kernels=True` replaces supported layers (activations, RMSNorm, rotary embeddings, MoE
    layers, ...) with optimized kernels downloaded from the Hugging Face Hub; NVIDIA GPUs have the
    widest coverage. A `KernelConfig` chooses the kernels yourself, with `"cuda"` as the device key
    for NVIDIA-specific mappings. Kernels follow the model's mode: `model.train()` and
    `model.eval()` switch to the training or inference variant.

    Kernels come from the Hub, so they need the network (or a local copy). nvkit checks a kernels
    request before touching the loaded model and says what is missing; a local kernel directory
    works offline, and on the CPU too.
    """),
    params(),
    code("""
    import nvkit
    import torch
    from nvkit.backends import hub_offline, kernels_problem
    from nvkit.kernels_support import model_kernel_layers

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    print("kernels package:", kernels_problem() or "installed, in the range transformers accepts")
    print("Hub offline (HF_HUB_OFFLINE):", hub_offline())
    """),
    md("""
    Transformers marks the layers a kernel may replace; this model has these (the reference logits
    are for a comparison further down):
    """),
    code("""
    plain = nvkit.load(MODEL)
    layers = model_kernel_layers(plain.model)
    print("kernel layers:", layers)
    assert "RMSNorm" in layers
    ids = plain.tokenizer("NVIDIA GPUs are fast", return_tensors="pt").input_ids.to(plain.device)
    with torch.no_grad():
        reference = plain.model(ids).logits.float()
    plain.unload();
    """),
    md("""
    ## `use_kernels=True`

    nvkit reports, per layer, which kernel replaced it and from where, or why it stayed as it was.
    Offline without cached kernels, the load is refused before anything changes.
    """),
    code("""
    try:
        s = nvkit.load(MODEL, use_kernels=True)
        k = s.info["kernels"]
        print("replaced:", k["replaced"] or "nothing")
        for layer, why in k.get("unchanged", {}).items():
            print(f"  {layer}: {why}")
    except nvkit.NvkitError as e:
        print("nvkit.load(use_kernels=True) refused:", e)
    """),
    md("""
    ## `KernelConfig` with a `"cuda"` key

    The mapping goes from the model's kernel layer names to `"org/repo:LayerClass"` per device.
    """),
    code("""
    from transformers import KernelConfig

    kc = KernelConfig({"RMSNorm": {"cuda": "kernels-community/liger_kernels:LigerRMSNorm"}})
    print(kc.kernel_mapping)
    if DEVICE != "cuda":
        print("Skipped loading with it: a 'cuda' mapping applies on a CUDA GPU (this machine has none).")
    else:
        try:
            s = nvkit.load(MODEL, use_kernels=True, kernel_config=kc)
            print("replaced:", s.info["kernels"]["replaced"])
        except nvkit.NvkitError as e:
            print("refused before loading:", e)
    """),
    md("""
    ## A local kernel

    A kernel is a directory in the Hub's layout: `build/<variant>/<package>/` with a `layers`
    module, plus `metadata.json`. `torch-universal` is the variant for pure PyTorch or Triton code.
    We write a small RMSNorm kernel and load the model with it; `local_kernel_config` builds the
    `KernelConfig(use_local_kernel=True)` for a directory (a plain dict for the CPU, which
    `KernelConfig` does not accept but nvkit does).
    """),
    ("code", "# the kernel's code: a pure PyTorch RMSNorm (a real kernel would launch CUDA or Triton code here)\n"
             "LAYERS_PY = '''" + KERNEL_LAYERS.lstrip("\n") + "'''"),
    code('''
    import json
    import sys
    import tempfile
    from pathlib import Path

    kernel_dir = Path(tempfile.mkdtemp(prefix="nvkit-tutorial-")) / "my-rmsnorm"
    variant = kernel_dir / "build" / "torch-universal"
    (variant / "my_rmsnorm").mkdir(parents=True)
    (variant / "my_rmsnorm" / "__init__.py").write_text("from . import layers\\n")
    (variant / "my_rmsnorm" / "layers.py").write_text(LAYERS_PY)
    (variant / "metadata.json").write_text(json.dumps(
        {"id": "_my_rmsnorm_tutorial", "name": "my-rmsnorm", "version": 1, "license": "Apache-2.0",
         "python-depends": [], "backend": {"type": DEVICE}}))
    print(*sorted(str(p.relative_to(kernel_dir)) for p in kernel_dir.rglob("*") if p.is_file()), sep="\\n")
    '''),
    code("""
    from nvkit.kernels_support import local_kernel_config, replaced_modules

    s = nvkit.load(MODEL, use_kernels=True, kernel_config=local_kernel_config(kernel_dir, device=DEVICE))
    print(s.info["kernels"])
    calls = sys.modules["_my_rmsnorm_tutorial.layers"].CALLS
    before = calls[0]
    with torch.no_grad():
        out = s.model(ids).logits.float()
    print(f"the kernel ran {calls[0] - before} times in one forward pass")
    assert s.info["kernels"]["replaced"].get("RMSNorm", 0) > 0 and calls[0] > before
    torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)  # same maths, same logits
    """),
    md("""
    ## Training and inference modes

    `model.train()` switches every kernelized layer to the kernel's training variant (one with a
    backward) and `model.eval()` back; nvkit's fine-tunes (tutorial 07) rely on it.
    """),
    code("""
    s.model.train()
    print("training mode:", replaced_modules(s.model))
    loss = s.model(ids, labels=ids).loss
    loss.backward()
    print(f"loss {loss.item():.3f}, gradients through the kernel: "
          f"{sum(p.grad is not None for p in s.model.parameters())} tensors")
    s.model.eval()
    s.model.zero_grad(set_to_none=True)
    print("inference mode:", replaced_modules(s.model))
    assert replaced_modules(s.model).get("RMSNorm", 0) > 0
    text = s.generate("NVIDIA GPUs are", max_new_tokens=12)
    assert text
    s.unload();
    """),
    md("""
    Kernels can also be added to a model already loaded: `s.enable_kernels(kernel_config)` (checked
    first; on error the model stays as it was).

    Next: **06-quantization**.
    """),
]

# --- 06 ------------------------------------------------------------------------------------------

QUANT = [
    md("""
    # Quantization: 4-bit and 8-bit

    Quantization stores weights in fewer bits so bigger models fit in GPU memory. bitsandbytes gives
    `nf4` and `fp4` (4-bit, the QLoRA format) and `int8` (LLM.int8()). Since bitsandbytes 0.50 they
    run on the CPU too, so this tutorial runs anywhere; on the CPU they save memory, not time.

    For each choice nvkit estimates the memory before loading and measures it after, side by side.
    """),
    params('''
    QUANT = os.environ.get("NVKIT_QUANT", "nf4")  # nf4, fp4 or int8
    '''),
    code("""
    import nvkit
    import torch

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    methods = nvkit.quantization_methods()
    methods
    """),
    code("""
    assert methods[QUANT].available, methods[QUANT].reason
    """),
    md("""
    ## Estimate first

    `nvkit.estimate` works from the model's config alone (nothing is loaded): weights, KV cache,
    activations, logits and, on a GPU, the CUDA context.
    """),
    code("""
    s = nvkit.load(MODEL)
    dtype = str(s.dtype).replace("torch.", "")
    base_footprint = s.info["footprint_bytes"]
    print(s.summary())
    s.unload()

    estimates = {q: nvkit.estimate(MODEL, dtype=dtype, quantization=q, seq_len=256, device=DEVICE)
                 for q in dict.fromkeys((None, QUANT, "int8"))}
    print(estimates[QUANT])  # each part with the formula behind it
    assert estimates[QUANT].parts["weights"] < estimates[None].parts["weights"]
    """),
    code("""
    import pandas as pd

    table = pd.DataFrame({q or dtype: {**e.parts, "total": e.total} for q, e in estimates.items()}) / 2**20
    table.round(2)  # MiB
    """),
    md("""
    ## Load quantized: the Model panel

    Choose the method in the panel (4-bit has options: double quantization, compute dtype); `.code()`
    is the load call.
    """),
    code("""
    panel = nvkit.LoadPanel(model=MODEL)
    panel.quant.value = QUANT
    panel
    """),
    code("""
    print(panel.code())
    s = await panel.load()
    print(s.summary())
    assert s.info["quantization"] == QUANT
    """),
    md("## Estimate vs measured"),
    code("""
    q_footprint = s.info["footprint_bytes"]
    print(f"weights, unquantized ({dtype}): {base_footprint / 2**20:9.2f} MiB measured, "
          f"{estimates[None].parts['weights'] / 2**20:9.2f} MiB estimated")
    print(f"weights, {QUANT}:{' ' * (14 + len(dtype) - len(QUANT))}{q_footprint / 2**20:9.2f} MiB measured, "
          f"{estimates[QUANT].parts['weights'] / 2**20:9.2f} MiB estimated")
    print(f"saved: {1 - q_footprint / base_footprint:.0%}")
    assert q_footprint < base_footprint
    text = s.generate("NVIDIA GPUs are", max_new_tokens=16)
    print("NVIDIA GPUs are" + text)
    assert text
    """),
    md("""
    The saving is largest on big models: embeddings, norms and the output head stay in the compute
    dtype, and on a tiny model they are most of the weights.

    ## Speed and memory side by side

    `nvkit.bench` loads each choice in turn and compares it with the unquantized reference
    (greedy tokens that match, time to first token, decode speed, peak memory).
    """),
    code("""
    # int8 only on a GPU: on the CPU bitsandbytes casts float32 inputs to float16 at every matmul and
    # warns each time, which would bury the table
    quants = [None, QUANT] + (["int8"] if DEVICE == "cuda" and QUANT != "int8" else [])
    df = nvkit.bench(MODEL, quantizations=quants, prompt_len=32, new_tokens=8, repeats=1)
    assert (df["error"] == "").all(), df[df["error"] != ""]
    df
    """),
    md("""
    To fine-tune a model that does not fit in 16-bit, load it in 4-bit and train LoRA adapters on
    top (QLoRA): tutorial **07-training**.
    """),
]

# --- 07 ------------------------------------------------------------------------------------------

TRAINING = [
    md("""
    # Training: Trainer, precision, LoRA and QLoRA

    `TrainingArguments` finds the NVIDIA GPU by itself, so `Trainer` needs no device setting. Use
    bf16 mixed precision on Ampere or newer and fp16 on older GPUs. nvkit's fine-tunes are
    transformers' `Trainer` plus PEFT LoRA, run in a worker thread with the loss and memory drawn
    live.
    """),
    params('''
    STEPS = int(os.environ.get("NVKIT_STEPS", "4"))  # training steps per run; a few show the loop
    '''),
    code("""
    import tempfile

    import nvkit
    import torch
    from nvkit.finetune import precision
    from transformers import TrainingArguments

    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    capability = torch.cuda.get_device_capability(0) if device_type == "cuda" else None
    prec = precision(device_type, capability)  # bf16 from capability 8.0, fp16 before, fp32 on the CPU
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), bf16=prec == "bf16", fp16=prec == "fp16",
                             report_to=[])
    print("precision:", prec, "· TrainingArguments.device:", args.device)
    assert args.device.type == device_type
    """),
    md("""
    `torch.cuda.is_bf16_supported()` can say True on GPUs older than Ampere (it emulates), so nvkit
    checks the compute capability itself. On the CPU `bf16=True` raises: training stays in fp32.

    ## LoRA with the fine-tune panel

    Data (examples inline or a `.jsonl`/`.json`/`.csv`/`.txt` file), LoRA and training settings, an
    estimate of the peak memory, Start and Stop, then loss and memory on one time axis. Start
    returns at once; `await` the run (or `run.result()`) to wait for it.
    """),
    code("""
    s = nvkit.load(MODEL)
    panel = nvkit.FinetunePanel()
    panel.steps.value = STEPS
    panel.batch.value = 4
    panel.seq_len.value = 64
    panel
    """),
    code("""
    run = panel.start()  # the Start button
    await run
    print(run)
    print(panel.code())
    """),
    code("""
    import math

    import pandas as pd

    history = pd.DataFrame(run.history)
    history["memory_MiB"] = history["memory"] / 2**20  # GPU allocated on CUDA, process RSS on the CPU
    print(history[["step", "loss", "tokens_per_s", "memory_MiB"]].round(3).to_string(index=False))
    print(run.summary())
    assert run.error is None and run.step == STEPS
    assert all(math.isfinite(x) for x in history["loss"])
    assert os.path.isdir(run.adapter_dir)
    """),
    md("""
    What nvkit changes from PEFT + `Trainer` as documented: the loss runs the LM head chunk by chunk
    (the full logits, most of a small model's peak, never exist), and on a GPU each decoder layer is
    compiled under an activation-memory budget, so the compiler keeps half of what the backward
    needs and recomputes the cheapest rest. Measured on an H200 (Qwen3-0.6B shape, LoRA r=16,
    8 × 512): 27.8 k tokens/s at 4.8 GiB peak against 16.9 k at 17.0 GiB; `nvkit bench --lora`
    measures it on your GPU. The run predicted its own peak beforehand (`nvkit.estimate(...,
    path="nvkit")`), and the prediction stands beside the measurement:
    """),
    code("""
    from nvkit.memory import comparisons

    train = [c for c in comparisons(frame=False) if c.what == "train"][-1]
    print(train)
    print({k: run.info.get(k) for k in ("compile", "activation_budget", "loss")})
    assert train.estimate is not None and "fused loss" in train.estimate.formulas["logits"]
    """),
    md("""
    After the run the session generates with the adapter attached. `s.merge_adapter()` folds it into
    the weights; `s.unload_adapter()` removes it; `s.load_adapter(dir)` brings a saved one back.
    """),
    code("""
    print(s.info["adapters"])
    text = s.generate("What does nvkit do?", chat=True, max_new_tokens=24)
    print(text)
    assert s.info["adapters"] and isinstance(text, str)
    s.unload_adapter()
    assert not s.info["adapters"]
    """),
    md("""
    ## QLoRA: LoRA on a 4-bit model

    For a model that does not fit in 16-bit, load it in 4-bit (nf4) and train LoRA adapters on top;
    `nvkit.finetune` notices the quantized model and prepares it for k-bit training.
    """),
    code("""
    s = nvkit.load(MODEL, quantization="nf4")
    data = [
        {"prompt": "Which GPUs support bf16?", "response": "Ampere and newer, compute capability 8.0 and up."},
        {"prompt": "What does QLoRA train?", "response": "LoRA adapters on top of a 4-bit model."},
        {"prompt": "How does PyTorch reach an NVIDIA GPU?", "response": "Through CUDA, as the device 'cuda'."},
    ]
    run = nvkit.finetune(s, data, max_steps=STEPS, batch_size=2, seq_len=64)
    await run
    print(run)
    print({k: run.info[k] for k in ("precision", "qlora", "loss")})
    assert run.error is None and run.info["qlora"] and run.history
    """),
    md("""
    ## From a cell

    `%%nvkit finetune` takes one example per line (plain text, or JSON like below; one kind per run)
    and trains the loaded model, printing the loss as it goes. Here it trains a fresh adapter on the
    4-bit model, after the one above is removed.
    """),
    code("""
    %load_ext nvkit
    s.unload_adapter();
    """),
    code("""
    %%nvkit finetune --steps 2 --batch-size 2 --seq-len 64
    {"prompt": "What is a CUDA graph?", "response": "A recorded sequence of GPU work replayed with one launch."}
    {"prompt": "What is NCCL?", "response": "NVIDIA's library for collective communication between GPUs."}
    """),
    code("""
    assert nvkit.session().info["adapters"]  # the magic's run attached its adapter
    s.unload();
    """),
    md("Next: **08-distributed-training**."),
]

# --- 08 ------------------------------------------------------------------------------------------

DISTRIBUTED = [
    md("""
    # Distributed training: torchrun, DDP and FSDP2

    A notebook kernel is one process, and multi-GPU training wants one process per GPU talking over
    NCCL. `torchrun --nproc_per_node=4 train.py` (or `accelerate launch`) starts them. Which
    strategy:

    - **DDP**: every GPU holds a full copy of the model and sees different batches; gradients are
      averaged. Simple and fast when the model and its optimizer state fit one GPU.
    - **FSDP2**: parameters, gradients and optimizer state are sharded across GPUs and gathered
      layer by layer: for models that don't fit one GPU.
    - DeepSpeed ZeRO and tensor parallelism are the other options the guide names.

    `nvkit.launch` writes a plain transformers + PEFT training script for your settings and runs it
    with torchrun on the selected GPUs, streaming every rank's metrics back into the notebook. On
    the CPU it runs the same DDP script over gloo instead of NCCL.
    """),
    params('''
    NPROC = int(os.environ.get("NVKIT_NPROC", "0"))  # processes; 0: one per visible GPU (2 on the CPU)
    STEPS = int(os.environ.get("NVKIT_STEPS", "3"))
    '''),
    code("""
    import tempfile

    import nvkit
    import torch

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nproc = NPROC or n_gpus or 2
    print(f"{n_gpus} CUDA GPU(s) visible; running {nproc} process(es)")
    print(nvkit.launch_command("train.py", nproc_per_node=nproc))
    """),
    md("""
    ## `nvkit.launch`: a DDP run

    The settings are `nvkit.finetune`'s. The data is checked and tokenized here in the notebook, so
    a bad example fails in a second rather than on every rank. The run directory holds the script,
    its `config.json`, the data and per-rank logs: copy it to a cluster and run the same line.
    """),
    code("""
    data = [
        {"prompt": "What does DDP replicate?", "response": "The whole model, on every GPU."},
        {"prompt": "What does FSDP shard?", "response": "Parameters, gradients and optimizer state."},
        {"prompt": "Which backend do GPUs use?", "response": "NCCL."},
        {"prompt": "Which backend does the CPU use?", "response": "gloo."},
    ]
    config = {"model": MODEL, "data": data, "max_steps": STEPS, "batch_size": 2, "seq_len": 64}
    run = nvkit.launch(config, nproc_per_node=nproc, strategy="ddp", run_dir=tempfile.mkdtemp(prefix="nvkit-ddp-"))
    print(run.command)
    await run
    print(run)
    """),
    code("""
    import pandas as pd

    logs = pd.DataFrame([r for r in run.history if r.get("event") == "log"])
    print(logs[[c for c in ("step", "rank", "loss", "grad_norm", "learning_rate") if c in logs]]
          .sort_values(["step", "rank"]).to_string(index=False))
    assert run.returncode == 0 and run.ranks == list(range(nproc))
    assert os.path.isdir(run.adapter_dir)
    print(sorted(os.listdir(run.run_dir)))
    """),
    md("""
    ## FSDP2

    Sharding only pays off across GPUs, so FSDP needs CUDA (NCCL). With one GPU it runs, but there
    is nothing to shard across.
    """),
    code("""
    if n_gpus < 2:
        print(f"Skipped: FSDP2 shards the model across GPUs and needs at least 2 CUDA GPUs (this machine has {n_gpus}).")
    else:
        run = nvkit.launch(config, nproc_per_node=n_gpus, strategy="fsdp", run_dir=tempfile.mkdtemp(prefix="nvkit-fsdp-"))
        print(run.command)
        await run
        print(run)
        assert run.returncode == 0 and run.ranks == list(range(n_gpus))
    """),
    md("""
    ## Several machines

    Run the same line on every node with the node count, each node's rank and a rendezvous address
    (node 0's). `start=False` writes the run and gives the line without starting anything. Use the
    same run directory name on every node: it is the rendezvous id.
    """),
    code("""
    multinode_dir = os.path.join(tempfile.mkdtemp(), "nvkit-multinode")
    for node in (0, 1):
        plan = nvkit.launch(config, nproc_per_node=8, nnodes=2, node_rank=node, rdzv_endpoint="10.0.0.1:29500",
                            run_dir=multinode_dir, start=False)
        print(f"node {node}:", plan.command)
        assert f"--node_rank={node}" in plan.command and "--nnodes=2" in plan.command
        assert "--rdzv_id=nvkit-multinode" in plan.command
    """),
    md("Next: **09-gpu-memory**."),
]

# --- 09 ------------------------------------------------------------------------------------------

MEMORY = [
    md("""
    # GPU memory: where it goes

    What fills a GPU while a model runs:

    - **weights**: parameters × bytes per parameter (2 in bf16, about 0.5 in 4-bit);
    - **KV cache**: keys and values of every token so far, per layer; it grows with batch × context;
    - **activations**: the working set of a forward pass; training keeps them for the backward pass;
    - **gradients and optimizer state** when training (AdamW: two more numbers per trained weight);
    - **logits**: batch × vocabulary floats, large for 150k-token vocabularies;
    - the **CUDA context** and library workspaces (cuBLAS, NCCL): a few hundred MiB per GPU that
      PyTorch does not count;
    - the **allocator's cache**: PyTorch keeps freed blocks *reserved* for reuse, so `nvidia-smi`
      shows more than the live tensors.

    nvkit shows the driver's view (NVML: the whole device) beside PyTorch's (allocated / reserved),
    and every estimate beside the measurement it predicts.
    """),
    params('''
    BATCH = int(os.environ.get("NVKIT_BATCH", "4"))  # prompts generated at once in the measured run
    NEW_TOKENS = int(os.environ.get("NVKIT_NEW_TOKENS", "64"))
    '''),
    md("""
    ## The live chart: `nvkit.monitor()`

    Per GPU: NVML used, torch reserved and allocated, the device total, the predicted peak, and the
    events (load, generate, unload, your marks) as points you can hover. Without a GPU it draws the
    process memory. It keeps drawing while later cells run work in the background or `await` it.
    """),
    code("""
    import nvkit
    import torch
    from nvkit.memory import comparisons, format_report, live_tensors

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
    chart = nvkit.monitor()
    chart
    """),
    md("""
    ## The report: `nvkit.memory_report()`

    One row per GPU (or the process, without GPUs). `rest` is NVML used minus torch reserved: the
    CUDA context, library workspaces and other processes. `%nvkit memory` prints the same as text.
    """),
    code("""
    nvkit.mark("before loading")
    s = nvkit.load(MODEL)
    print(s.summary())
    report = nvkit.memory_report(unit="MiB")
    report
    """),
    code("""
    print(format_report())
    assert len(report) >= 1 and (report["used"] > 0).all()
    """),
    md("""
    ## Estimate, then measure

    `nvkit.estimate` predicts the peak from the config alone; nvkit also predicts every generation
    by itself and records the measured peak beside it (`comparisons()`). On a GPU the measurement is
    NVML's peak for the device; on the CPU it is the whole process (Python, PyTorch and all), so
    there the prediction is far below it.
    """),
    code("""
    prompt = "NVIDIA GPUs are"
    prompt_len = len(s.tokenizer(prompt)["input_ids"])
    est = nvkit.estimate(s, dtype=str(s.dtype).replace("torch.", ""), quantization=s.quantization,
                         seq_len=prompt_len + NEW_TOKENS, prompt_len=prompt_len, device=DEVICE)
    print(est)
    """),
    code("""
    nvkit.mark("one prompt")
    text = await s.agenerate(prompt, max_new_tokens=NEW_TOKENS, fast=False)
    last = comparisons().iloc[-1]
    print(f"predicted {last['predicted'] / 2**20:.1f} MiB, measured {last['measured'] / 2**20:.1f} MiB on {last['device']}")
    assert text and last["what"] == "generate" and last["predicted"] > 0 and last["measured"] > 0
    if DEVICE == "cuda":  # the estimate holds within a factor of two on a GPU
        assert 0.5 < last["predicted"] / last["measured"] < 2, last
    """),
    md("""
    A batch is a different story on a GPU: transformers' continuous batching reserves a share of the
    free memory for its paged KV cache up front (`max_memory_percent` of its config), so NVML shows
    far more than the batch itself needs. The memory is held, not used: the next batches reuse it.
    """),
    code("""
    nvkit.mark(f"batch of {BATCH}")
    outs = await s.agenerate([prompt] * BATCH, max_new_tokens=NEW_TOKENS)
    assert len(outs) == BATCH
    runs = comparisons()
    last = runs.iloc[-1]
    print(f"batch of {BATCH}: predicted {last['predicted'] / 2**20:.1f} MiB, measured {last['measured'] / 2**20:.1f} MiB"
          f" ({s.last_stats.path})")
    runs
    """),
    md("""
    ## What holds memory now

    `live_tensors` lists the largest tensors still alive and the names in the notebook that hold
    them: the first thing to look at when memory does not come back.
    """),
    code("""
    for t in live_tensors(DEVICE, limit=5):
        print(t)
    """),
    md("""
    ## An out-of-memory post-mortem

    When a CUDA allocation fails, PyTorch says how much was asked and how much was free. nvkit's
    load, generate and fine-tune turn that into an `NvkitError` after releasing the failed step,
    with the largest live tensors, other processes on the GPU and what to try next; the session
    stays usable. Here an allocation larger than the free memory fails on purpose.
    """),
    code("""
    if DEVICE != "cuda":
        print("Skipped: a CUDA out-of-memory error needs a CUDA GPU (this machine has none).")
    else:
        from nvkit.memory import oom_error

        free, total = torch.cuda.mem_get_info()
        torch.cuda.memory._record_memory_history(max_entries=10000)  # for the snapshot below
        try:
            too_big = torch.empty(free + 2**30, dtype=torch.uint8, device="cuda")
            raise AssertionError("the allocation should not fit")
        except torch.OutOfMemoryError as e:
            print("PyTorch:", str(e).splitlines()[0])
            print()
            print("nvkit:", oom_error(e, "generate", s))
        torch.cuda.memory._dump_snapshot("memory-snapshot.pickle")  # drag it onto https://pytorch.org/memory_viz
        torch.cuda.memory._record_memory_history(enabled=None)
        assert s.generate("NVIDIA GPUs are", max_new_tokens=8)  # still usable
    """),
    md("""
    ## Unloading gives it back

    `s.unload()` frees the model and checks that the memory really came back (a reference left in
    a variable, an exception's traceback or IPython's `Out` history would keep it).
    """),
    code("""
    nvkit.mark("unload")
    freed = s.unload()
    print(f"freed {freed / 2**20:.1f} MiB")
    print(s.unload_report)
    print(format_report())
    """),
    md("That is the whole path of the guide. Back to **00-start-here** for the list of tutorials."),
]

NOTEBOOKS = {
    "00-start-here": START,
    "01-check-the-gpu": CHECK,
    "02-select-gpus": SELECT,
    "03-attention-backends": ATTENTION,
    "04-inference": INFERENCE,
    "05-hub-kernels": KERNELS,
    "06-quantization": QUANT,
    "07-training": TRAINING,
    "08-distributed-training": DISTRIBUTED,
    "09-gpu-memory": MEMORY,
}


def build(name: str, cells) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, src) in enumerate(cells):
        cell = new_markdown_cell(src) if kind == "markdown" else new_code_cell(src)
        cell["id"] = f"{name[:2]}-{i:02d}"  # stable ids: regenerating changes nothing that did not change
        nb.cells.append(cell)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), name
    nbformat.validate(nb)
    return nb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if notebooks/ differs from what this script writes")
    a = p.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    stale = []
    for name, cells in NOTEBOOKS.items():
        text = nbformat.writes(build(name, cells)) + "\n"
        path = OUT / f"{name}.ipynb"
        if a.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path.name)
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("out of date (run python scripts/make_notebooks.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
