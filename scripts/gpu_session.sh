#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the checkout root: installs the wheels that
# travelled with this call (../shared/gpu/wheels.sh fetches them into .whl-*), then runs one phase
# of the GPU tests and benchmarks, everything teed into $OUT. Usage:
#     bash scripts/gpu_session.sh PHASE
# Phases (each sized to end inside one 10-minute call):
#   decode   fast path: token identity, one compile per session, adapters, disk cache, prefill,
#            exact token counts; then the decode table          (carry .whl-core)
#   train    session, GPUs, memory estimates, LoRA runs, GPU memory by kernel
#                                         (carry .whl-core and .whl-server: scripts/gpu_wheels_server.sh)
#   loop     the fine-tune loop: 20- and 200-step runs against plain PEFT, cold and warm; export
#                                                                (carry .whl-core)
#   qlora    4-bit: QLoRA runs, eval during QLoRA, bitsandbytes; the LoRA benchmark's table
#                              (carry .whl-core and .whl-bnb13: scripts/gpu_wheels_bnb.sh, one call)
#   session  generation as a notebook user meets it: the cold process (≈ 330 s), then a fresh one
#            with its compile artifacts ("warm", ≈ 100 s)                        (carry .whl-core)
#   restart  the session benchmark's cold phase, then a restarted kernel on the same machine (its
#            torch and Triton caches kept), both with bytecode written           (carry .whl-core)
#   session-warm  the warm process again, on the same warm machine after a cut-short session call
#   batched  many prompts on the batched fast path (identity, targets), GPU memory by kernel, the
#            stats line's reasons                                (carry .whl-core)
#   regional  the steps with one layer compiled for every layer (FastOptions.regional, the
#            default) against the whole step compiled: token identity (batch-1 and batched), then
#            the batch-1 decode rate and preparation of both, with and without an adapter
#                                                                              (carry .whl-core)
#   fold     an adapter's first product folded into the base one (FastOptions.lora_fold): token
#            identity against PEFT with and without it, then the decode rate of fast, fast lora and
#            fast lora+fold in one process                                     (carry .whl-core)
#   batched-first  issue 20's targets alone: the first batched call against the first batch-1
#            request, each in a fresh process with empty caches (FIRST_PAIRS pairs, default 3),
#            identity with the eager and the compiled prefill, one prompt through the batched
#            decoder against the batch-1 path, and the two throughput targets  (carry .whl-core)
#   notebooks  every tutorial on the GPU (07's QLoRA included: carry .whl-bnb13 too, or its 4-bit
#            cells skip), then the panels' compile progress              (carry .whl-core)
#   lanes    several of the phases below at once, each in its own process on the one GPU, after one
#            install: for correctness runs whose timings nobody reads (they share the GPU and the
#            cores). Usage: bash scripts/gpu_session.sh lanes PHASE...
#   seq      several phases one after the other, after one install: bash scripts/gpu_session.sh seq PHASE...
#   plain    nvkit's plain path (fast=False) against transformers' generate called directly, in
#            alternating rounds                                                 (carry .whl-core)
#   nb-k     the tutorials that NBK names (a pytest -k expression, e.g. NBK="04 or 06")
#   gpus     GPU discovery and selection, launch's process count
#   loop-export / loop-short  the fine-tune loop's export test / its short-run timing (the two
#            halves of `loop`)
#   nb-a/nb-b  the tutorials 00-04 and the panels' compile progress / the tutorials 05-09 (what
#            `notebooks` runs, in two halves for two lanes)
#   moved    the GPU tests of the layout change not covered by the phases above: compile artifacts on
#            disk, the 64-token prefill, exact token counts, GPU memory by kernel (.whl-server)
#   qlora-tests  the 4-bit tests of `qlora` without its benchmark table
#   profile  where the GPU time goes: the batched path's kernels by kind, plain PEFT's step against
#            nvkit's uncompiled one (scripts/gpu_profile.py), the paged attention's launch shapes
#            (python -m nvkit.benchmarks.attention); PROFILE_PART=prepare: the batch-1 path's
#            preparation, cold and warm, by function; PROFILE_PART=deterministic: deterministic=True's
#            list against the default's, kernels by kind                             (carry .whl-core)
#   engine-a/engine-b  the fast path's GPU tests (batch 1 and session / rows), for two lanes
#   policy   the measured compile policy on SHAPES (default qwen3-4b llama-3.2-1b qwen3-0.6b): the
#            session against the uncompiled and the always-compiled step (scripts/compile_policy_check.py)
#   decode-profile  nvkit bench shape:S --decode --profile for SHAPES (default qwen3-0.6b llama-3.2-1b qwen3-4b)
#   list-profile  the same for the families bench's list (--n-prompts 32 --batch-new-tokens 128: its prefill
#            and its steps apart) on SHAPES (default gemma-3-4b olmoe-1b-7b qwen3-0.6b)  (carry .whl-core)
#   gemv     issue 38's six-kernel layers: a layer's projections in nvkit's fused GEMV kernels against
#            the step's kernels and cuBLAS (python -m nvkit.benchmarks.gemv), their identity test, then
#            the uncompiled step with them (with and without PDL) against without on Qwen3-0.6B;
#            gemv-more: the same on Qwen3-4B, and both steps' kernels per token (--profile)
#                                                                                     (carry .whl-core)
#   fit      the tables issue 38's launch rules are fitted to: every GEMV launch per form (--every) and
#            the batch-1 attention's launches (--batch1, and short lengths in a 16 k cache)  (carry .whl-core)
#   verify38  the fitted launch rules: the batch-1 attention and six-kernel identity tests (with an
#            adapter too), then Qwen3-0.6B's uncompiled step with and without six-kernel layers and
#            an adapter; verify38b: the same on Qwen3-4B, and an 8 k prompt's decode, then the GEMV
#            tables of FIT_MODELS (none unless set)                                   (carry .whl-core)
#   rates38  the six-kernel layers (the uncompiled default) against nine on Llama-3.2-1B, against the
#            compiled step on Qwen3-0.6B, at an 8 k prompt; then the Qwen3-4B GEMV table  (carry .whl-core)
#   default38  the six-kernel default's GPU tests (plain greedy, streaming, sampling, adapters
#            uncompiled, first request, compare) and its rate against nine and compiled (carry .whl-core)
#   afternoon-check  issue 39's afternoon as assertions, in a second process on the machine
#            (tests/gpu/test_afternoon_gpu.py)                                     (carry .whl-core)
#   targets38  issue 38's targets as assertions (tests/gpu/test_decode_targets_gpu.py; they fail
#            until the step reaches them)                                          (carry .whl-core)
#   experts37  a mixture's uncompiled steps on nvkit's grouped experts kernel (+experts) against
#            transformers' batched_mm and the dense rows on olmoe-1b-7b: the identity tests, batch 1,
#            and a 32-prompt list's profile each way, and with its rows' attention gathered (+matmul)
#            instead of the paged kernel                                          (carry .whl-core)
#   adapters39  the adapter merged into a copy against its products apart (identity, rates), the
#            default step's kernels, then issue 39's afternoon on Qwen3-0.6B        (carry .whl-core)
#   first-adapter  the first request after a 10-step fine-tune, profiled (scripts/first_request.py
#            --finetune), then the compare test with the garbage collector's pauses  (carry .whl-core)
#   long     issue 38's long context on the Qwen3-0.6B shape: the batch-1 attention kernel's launch shapes
#            at 1 k, 8 k and 16 k positions (python -m nvkit.benchmarks.attention --batch1), then an
#            8 k-token prompt's decode rate and its profile (PROMPT_LEN to change)     (carry .whl-core)
#   families  nvkit bench --families, one process per shape (FAMILIES picks; each row as JSON in $OUT;
#            SETTLE=1: each family settled too, its compiles brought forward: --settle)
#   afternoon  issue 39's afternoon on SHAPE (default qwen3-0.6b): nvkit bench shape:SHAPE --afternoon,
#            then the GPU tests of its pieces (first request, compare, sliding windows and adapters
#            on the model's own forward, graphs' own cuBLAS workspace)         (carry .whl-core)
#   families-check  every family's graphs against plain generate (batch 1; the fused families' lists
#            too), then compare's two sides on the fast path without a compile     (carry .whl-core)
#   shapes-norms  shapes drawn on the GPU and the norm kernels in bf16 (tests), then the families
#            bench of the layouts with norms after their branches (FAMILIES, default gemma-3-1b
#            olmo-2-1b; TF seconds each, default 150)                             (carry .whl-core)
#   deterministic  deterministic=True: each prompt alone against lists of 2-40 on the Qwen3 shape and
#            the demo model (0 rows may differ), its list throughput against the default's; then the
#            rows path's identity and batch-of-one tests                            (carry .whl-core)
#   experts-compile  the batch-1 step over the models' own forwards compiled (the mixtures' experts
#            switched outside the compiled forward), then OLMoE's settled families row (carry .whl-core)
#   morning  the attention and six-kernel step's GPU tests, the forwards compiled (experts-compile's
#            tests), gemma-3-4b's list profile                                   (carry .whl-core)
#   lists37  the eager rows prefill on nvkit's kernels (its q/k norms, RoPE and pool writes in one
#            launch: prefill_rope): the families' list tests (float32, TL seconds, default 400), then
#            the demo model's bf16 list against each prompt alone; lists37-rows: the list profiles and
#            families rows of SHAPES (default gemma-3-4b phi-4-mini)            (carry .whl-core)
#   first39  a session's first 24-token request in three fresh processes, the machine's first one
#            and two after it, with where the Triton warm-up stood           (carry .whl-core)
#   list-first  the first list of 64 prompts after a fine-tune and a second one, in a fresh Triton
#            cache and again on it: what Triton compiled in each, the first one profiled (carry .whl-core)
#   owed36a/owed36b  issue 36's owed GPU checks in two calls on one warm machine: a) the compile
#            ahead's test (kernels and launchers), then the session A/B's new side; b) its old side
#            (.before/42e0f10: bash scripts/ab.sh --prepare 42e0f10 here, the demo weights copied in),
#            then the fast path's batch-1 and session tests         (carry .whl-core and .before)
#   x2a/x2b  two GPUs: DDP, FSDP2, ZeRO, TP through nvkit.launch (nvidia-h200-x2, carry .whl-core)
#   one-gpu  every strategy and launcher of nvkit.launch on ONE GPU (issue 41), its table as JSON in
#            $OUT/strategies-one-gpu.json, ZeRO-3's speed against DDP
#                                   (carry .whl-core and .whl-ds: scripts/gpu_wheels_ds.sh)
#   zero3-profile  where one ZeRO-3 step's time goes, DeepSpeed's default hooking against nvkit's
#            settings (scripts/zero3_profile.py)                  (carry .whl-core and .whl-ds)
# Install once per call: two pip installs at once corrupted the site folder.
set -uo pipefail
phase=${1:?phase}
# one install per call: a lane's process finds NVKIT_WHEELS_READY set by the call that started it
if [ -z "${NVKIT_WHEELS_READY:-}" ]; then
  for inst in .whl-*/install.sh; do eval "$(bash "$inst")"; break; done
  export NVKIT_WHEELS_READY=1
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NVKIT_CACHE=/tmp/nvkit-cache
out=${OUT:-/tmp/out}; mkdir -p "$out"
log="$out/$phase.log"
exec > >(tee -a "$log") 2>&1
t() { echo "=== pytest $* ($(date +%T))"; timeout "${T:-300}" python3 -m pytest -q -s -p no:cacheprovider -rs "$@"; echo "=== exit $? ($(date +%T))"; }
bench() { echo "=== nvkit bench $* ($(date +%T))"; timeout "${T:-300}" python3 -m nvkit.cli bench "$@"; echo "=== exit $? ($(date +%T))"; }
nb() { T=${TN:-$1} t tests/gpu/test_notebooks_gpu.py -k "$2"; }  # nb SECONDS K: the tutorials K names
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
# the image has its own transformers (5.17) under the wheels': a PYTHONPATH without the wheels' site
# folder runs on it, outside the range nvkit pins, and every figure would be of the wrong stack
python3 - <<'PY' || exit 2
import re, sys, transformers
pin = re.search(r'"transformers>=([\d.]+),<([\d.]+)"', open("pyproject.toml").read())
low, high = (tuple(int(x) for x in v.split(".")) for v in pin.groups())
have = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
if not low <= have < high:
    sys.exit(f"transformers {transformers.__version__} from {transformers.__file__} is outside pyproject's "
             f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}: keep the wheels' site folder on PYTHONPATH "
             "(eval \"$(bash .whl-core/install.sh)\" prepends it) and do not set NVKIT_WHEELS_READY yourself")
PY
case "$phase" in
  lanes)
    shift
    pids=()
    for p in "$@"; do bash "$0" "$p" > /dev/null 2>&1 & pids+=($!); done
    # the lanes by pid: a bare `wait` also waits for this script's own tee, which never ends
    wait "${pids[@]}"
    for p in "$@"; do echo "--- $p"; grep -E "^=== |passed|failed|error" "$out/$p.log" | tail -n 30; done ;;
  seq)
    shift
    for p in "$@"; do bash "$0" "$p" > /dev/null 2>&1; grep -E "^=== |passed|failed|error" "$out/$p.log" | tail -n 30; done ;;
  plain)
    T=240 bench shape:qwen3-0.6b --decode --repeats 9 --new-tokens 64 --paths "generate,model.generate" ;;
  nb-a) nb 320 "00 or 01 or 02 or 03 or 04"; T=200 t tests/gpu/test_panels_gpu.py ;;
  nb-b) nb 540 "05 or 06 or 07 or 08 or 09" ;;
  nb-k) nb 540 "${NBK:?NBK: the notebooks to run, as pytest -k}" ;;
  gpus) T=${TG:-300} t tests/gpu/test_gpus_gpu.py ;;
  loop-export) T=${TL:-300} t tests/gpu/test_finetune_loop_gpu.py -k "export" ;;
  loop-short) T=${TL:-300} t tests/gpu/test_finetune_loop_gpu.py -k "short_run_is_no_slower" ;;
  moved)
    T=300 t tests/gpu/test_fast_session_gpu.py -k "artifacts or prefill"
    T=100 t tests/gpu/test_exact_tokens_gpu.py
    T=100 t tests/gpu/kernels/test_kernel_memory_gpu.py ;;
  qlora-tests)
    T=${TQ:-540} t tests/gpu/test_finetune_gpu.py tests/gpu/test_finetune_loop_gpu.py tests/gpu/test_backends_gpu.py -k "qlora or bnb" ;;
  engine-a) T=420 t tests/gpu/test_fast_gpu.py tests/gpu/test_fast_session_gpu.py -k "not decode_benchmark_table" ;;
  engine-b) T=420 t tests/gpu/test_batched_gpu.py ;;
  policy)
    for sh in ${SHAPES:-qwen3-4b llama-3.2-1b qwen3-0.6b}; do
      echo "=== policy $sh ($(date +%T))"; timeout "${T:-240}" python3 scripts/compile_policy_check.py "$sh"; echo "=== exit $? ($(date +%T))"
    done ;;
  decode)
    T=330 t tests/gpu/test_fast_gpu.py tests/gpu/test_fast_session_gpu.py tests/gpu/test_exact_tokens_gpu.py \
        -k "not decode_benchmark_table"
    T=200 bench shape:qwen3-0.6b --decode --repeats 3 --paths "generate,fast,fast+matmul,fast lora" ;;
  train)
    T=150 t tests/gpu/test_session_gpu.py tests/gpu/test_gpus_gpu.py
    # a real Jupyter server: needs .whl-server, and a pytest run of its own (a missing server stack
    # stops its conftest, and with it everything collected beside it)
    T=100 t tests/gpu/kernels/test_kernel_memory_gpu.py
    T=200 t tests/gpu/test_memory_gpu.py -k "not overhead"
    T=200 t tests/gpu/test_finetune_gpu.py -k "not qlora and not ddp and not bench" ;;
  loop)
    T=540 t tests/gpu/test_finetune_loop_gpu.py -k "not qlora" ;;
  qlora)
    T=300 t tests/gpu/test_finetune_gpu.py tests/gpu/test_finetune_loop_gpu.py tests/gpu/test_backends_gpu.py -k "qlora or bnb"
    T=240 bench shape:qwen3-0.6b --lora --steps 15 --warmup 5 ;;
  session)
    rm -rf /tmp/nvkit-session-bench  # this script's own folder: a cold phase starts with nothing on disk
    T=420 bench shape:qwen3-0.6b --session --phases cold --session-dir /tmp/nvkit-session-bench --csv "$out/session-cold.csv"
    T=160 bench shape:qwen3-0.6b --session --phases warm --session-dir /tmp/nvkit-session-bench --csv "$out/session-warm.csv" ;;
  restart)
    # a restarted kernel on the same machine: the cold phase, then a process with every cache on
    # disk as the cold one left it (static + compile left out: the session phase measures it).
    # Bytecode goes to a folder of its own: where the site folder takes no .pyc, every process
    # would compile the modules it imports from source, which a user's installed packages do not.
    python3 -c 'import sys, networkx, os; print("dont_write_bytecode", sys.flags.dont_write_bytecode, "networkx pyc",
      os.path.isdir(os.path.join(os.path.dirname(networkx.__file__), "__pycache__")))'
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=/tmp/nvkit-pycache
    rm -rf /tmp/nvkit-session-bench
    T=${T:-440} bench shape:qwen3-0.6b --session --phases ${PHASES:-cold,restart} --static none --session-dir /tmp/nvkit-session-bench \
      --csv "$out/session-restart.csv" ;;
  session-warm)
    [ -f /tmp/nvkit-session-bench/cold.json ] || echo "no cold phase on this machine: the warm one compiles from scratch"
    T=300 bench shape:qwen3-0.6b --session --phases warm --session-dir /tmp/nvkit-session-bench --csv "$out/session-warm.csv" ;;
  regional)
    T=150 t tests/gpu/test_fast_gpu.py tests/gpu/test_batched_gpu.py -k "one_compiled_layer"
    T=200 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast,fast+whole,fast lora"
    T=200 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast+whole,fast lora" ;;
  fold)
    T=200 t tests/gpu/test_fast_session_gpu.py -k "adapter"
    T=240 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast,fast lora,fast lora+fold" ;;
  batched-first)
    NVKIT_FIRST_CALL_PAIRS=${FIRST_PAIRS:-3} T=${TF:-400} t tests/gpu/test_batched_gpu.py -k "first_batched_call"
    T=300 t tests/gpu/test_batched_gpu.py -k "each_prompt or batch_of_one or targets" ;;
  batched)
    T=${TB:-420} t tests/gpu/test_batched_gpu.py tests/gpu/test_fast_gpu.py::test_batch_path_keeps_input_order -k "not first_batched_call"
    T=100 t tests/gpu/kernels/test_kernel_memory_gpu.py
    T=100 t tests/gpu/test_exact_tokens_gpu.py ;;
  decode-profile)
    for sh in ${SHAPES:-qwen3-0.6b llama-3.2-1b qwen3-4b}; do
      T=${TP:-300} bench shape:$sh --decode --profile
    done ;;
  list-profile)
    # where a list's time goes (issue 37's lists against padded plain): the families bench's list,
    # its prefill and its steps apart, per kind of kernel
    T=150 t tests/gpu/test_fast_gpu.py -k "profile"
    for sh in ${SHAPES:-gemma-3-4b olmoe-1b-7b qwen3-0.6b}; do
      T=${TP:-240} bench shape:$sh --decode --profile --n-prompts "${N_PROMPTS:-32}" --batch-new-tokens 128
    done ;;
  gemv)
    echo "=== gemv forms ($(date +%T))"
    timeout 240 python3 -m nvkit.benchmarks.gemv --csv "$out/gemv.csv"; echo "=== exit $? ($(date +%T))"
    T=200 t tests/gpu/test_fast_gpu.py -k six_kernel
    T=150 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast+eager+nogemv,fast+eager,fast+eager+nopdl" ;;
  fit)
    # the tables the launch rules are fitted to: every GEMV launch (with PDL) per form, the batch-1
    # attention's launches at each length's size class and at short lengths in a long cache
    for m in qwen3-0.6b llama-3.2-1b qwen3-4b; do  # one process each: a timeout loses one model's table
      echo "=== gemv every launch, $m ($(date +%T))"
      timeout 100 python3 -m nvkit.benchmarks.gemv --every --models "$m" --csv "$out/gemv-every-$m.csv" \
        > "$out/gemv-every-$m.log" 2>&1
      echo "=== exit $? ($(date +%T))"; tail -3 "$out/gemv-every-$m.log"
    done
    echo "=== batch-1 attention launches ($(date +%T))"
    timeout 130 python3 -m nvkit.benchmarks.attention --batch1 --csv "$out/attention-batch1.csv"; echo "=== exit $? ($(date +%T))"
    timeout 70 python3 -m nvkit.benchmarks.attention --batch1 --lengths 128,1024 --cache 16384 \
      --csv "$out/attention-batch1-short.csv"; echo "=== exit $? ($(date +%T))" ;;
  fit-short)
    # one call's worth of issue 38 when calls are scarce: the new kernels' identity (the adapter on
    # the six-kernel layers, the batch-1 attention's launch), then the tables the rules are fitted to
    T=120 t tests/gpu/test_fast_session_gpu.py -k "six-kernel"
    T=80 t tests/gpu/test_decode_attention_gpu.py
    echo "=== batch-1 attention launches ($(date +%T))"
    timeout 120 python3 -m nvkit.benchmarks.attention --batch1 --csv "$out/attention-batch1.csv"; echo "=== exit $? ($(date +%T))"
    for m in ${FIT_MODELS:-qwen3-4b qwen3-0.6b}; do
      echo "=== gemv every launch, $m ($(date +%T))"
      timeout 80 python3 -m nvkit.benchmarks.gemv --every --models "$m" --csv "$out/gemv-every-$m.csv" \
        > "$out/gemv-every-$m.log" 2>&1
      echo "=== exit $? ($(date +%T))"; tail -12 "$out/gemv-every-$m.log"
    done ;;
  verify38)
    # the fitted launch rules: the kernels' identity, then the uncompiled step's rates with and
    # without six-kernel layers, with and without an adapter (issue 38)
    T=120 t tests/gpu/test_decode_attention_gpu.py
    T=150 t tests/gpu/test_fast_gpu.py -k "six_kernel"
    T=120 t tests/gpu/test_fast_session_gpu.py -k "six-kernel"
    T=200 bench shape:qwen3-0.6b --decode --repeats 3 \
      --paths "fast+eager+nogemv,fast+eager,fast+eager+nopdl,fast lora+eager+nogemv,fast lora+eager" ;;
  verify38b)
    T=200 bench shape:qwen3-4b --decode --repeats 3 --paths "fast+eager+nogemv,fast+eager"
    T=150 bench shape:qwen3-0.6b --decode --repeats 3 --prompt-len "${PROMPT_LEN:-8192}" --paths "fast+eager,fast"
    for m in ${FIT_MODELS:-}; do  # the GEMV tables the rule is refitted on, where the call has room
      echo "=== gemv every launch, $m ($(date +%T))"
      timeout 90 python3 -m nvkit.benchmarks.gemv --every --models "$m" --csv "$out/gemv-every-$m.csv" \
        > "$out/gemv-every-$m.log" 2>&1
      echo "=== exit $? ($(date +%T))"; tail -12 "$out/gemv-every-$m.log"
    done ;;
  rates38)
    # the six-kernel layers against the compiled step and on the shapes verify38 leaves: Llama-3.2-1B,
    # Qwen3-0.6B compiled, the 8 k prompt; then the Qwen3-4B GEMV table on this GPU
    T=150 bench shape:llama-3.2-1b --decode --repeats 3 --paths "fast+eager+nogemv,fast+eager,fast"
    T=120 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast,fast+eager"
    T=100 bench shape:qwen3-0.6b --decode --repeats 3 --prompt-len "${PROMPT_LEN:-8192}" --paths "fast+eager"
    echo "=== gemv every launch, qwen3-4b ($(date +%T))"
    timeout 90 python3 -m nvkit.benchmarks.gemv --every --models qwen3-4b --csv "$out/gemv-every-qwen3-4b.csv" \
      > "$out/gemv-every-qwen3-4b.log" 2>&1
    echo "=== exit $? ($(date +%T))"; tail -12 "$out/gemv-every-qwen3-4b.log" ;;
  default38)
    # the six-kernel layers as the uncompiled default: the default session's identity tests (plain
    # greedy, streaming, sampling, the adapter apart and uncompiled, the first request, compare),
    # then the default against the nine-kernel layers and the compiled step
    T=150 t tests/gpu/test_fast_gpu.py -k "token_identical_to_plain or streams or sampling_is_seeded or six_kernel"
    T=120 t tests/gpu/test_fast_session_gpu.py -k "uncompiled or quicker or compare or every_length"
    T=100 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast+eager,fast+eager+nogemv,fast" ;;
  gemv-more)
    T=240 bench shape:qwen3-4b --decode --repeats 3 --paths "fast+eager+nogemv,fast+eager"
    for p in "fast+eager+nogemv" "fast+eager"; do  # the per-kernel profile before and after
      T=150 bench shape:qwen3-0.6b --decode --profile --paths "$p"
    done ;;
  afternoon-check)
    T=${TA:-560} t tests/gpu/test_afternoon_gpu.py ;;
  targets38)
    T=${TT:-560} t tests/gpu/test_decode_targets_gpu.py ;;
  experts37|experts37a)
    # a mixture's uncompiled steps on nvkit's grouped experts kernel (StepVariant.experts, "+experts")
    # against transformers' batched_mm and the dense rows: identity, and the lists over a model's own
    # forward on the paged attention (their default since 358c721)
    T=${TT:-420} t tests/gpu/test_families_gpu.py \
      -k "${K37:-grouped_experts or (rows_graphs and (Olmoe or Qwen3Moe or Mixtral or GptOss or Starcoder2 or Cohere2))}"
    [ "$phase" = experts37a ] && exit 0 ;&
  experts37b)
    # batch 1 and a 32-prompt list's profile on olmoe-1b-7b: gathered, paged, paged + grouped experts
    T=${TE:-200} bench shape:olmoe-1b-7b --decode --repeats 3 --paths "fast+eager,fast+eager+experts"
    for p in fast+eager+matmul fast+eager fast+eager+experts; do
      T=${TE:-120} bench shape:olmoe-1b-7b --decode --profile --n-prompts 32 --batch-new-tokens 128 --paths "$p"
    done ;;
  adapters39)
    # the adapter merged into a copy (the batch-1 default) against its products apart: the identity
    # tests, the default step's own kernels, the rates on Qwen3-0.6B, then the afternoon's table
    T=200 t tests/gpu/test_fast_session_gpu.py -k "token_identical_to_peft and (merged or six-kernel)"
    T=100 t tests/gpu/test_fast_gpu.py -k "token_identical_to_plain"
    T=180 bench shape:qwen3-0.6b --decode --repeats 3 --paths "fast+eager,fast lora+eager,fast lora+eager+apart"
    T=${TA:-300} bench shape:qwen3-0.6b --afternoon ;;
  experts-compile)
    # the batch-1 step over a model's own forward compiled whole (the mixtures' experts switched
    # outside what is compiled), token for token as plain generate; then the settled OLMoE row
    T=300 t tests/gpu/test_families_gpu.py -k "runs_its_graphs_as_plain_generate and (Olmoe or Qwen3Moe or Mixtral or GptOss or Starcoder2 or Cohere2)"
    echo "=== families olmoe-1b-7b, settled ($(date +%T))"
    timeout "${TF:-280}" python3 -m nvkit.cli bench --families --shapes olmoe-1b-7b --settle --json > "$out/family-olmoe-settled.json"
    echo "=== exit $? ($(date +%T))"; cat "$out/family-olmoe-settled.json" ;;
  morning)
    # the batch-1 attention and the six-kernel step's GPU tests, the models' own forwards compiled,
    # then gemma-3-4b's list profile
    T=100 t tests/gpu/test_decode_attention_gpu.py
    T=${TM:-150} t tests/gpu/test_fast_gpu.py -k "identical or six_kernel or profile"
    T=120 t tests/gpu/test_families_gpu.py -k "runs_its_graphs_as_plain_generate and (Olmoe or Qwen3Moe or Mixtral or GptOss or Starcoder2 or Cohere2)"
    T=${TP:-130} bench shape:gemma-3-4b --decode --profile --n-prompts 32 --batch-new-tokens 128 ;;
  lists37)
    # the eager rows prefill on nvkit's kernels: the families' list tests (its identity), then a
    # bf16 list of the demo model against each prompt alone; lists37-rows: profiles and rows
    T=${TL:-400} t tests/gpu/test_families_gpu.py -k "runs_a_list_on_the_rows_graphs"
    T=120 t tests/gpu/test_batched_gpu.py -k "each_prompt_decodes_as_it_does_alone" ;;
  lists37-rows)
    for sh in ${SHAPES:-gemma-3-4b phi-4-mini}; do
      T=${TP:-120} bench shape:$sh --decode --profile --n-prompts 32 --batch-new-tokens 128
      echo "=== families $sh ($(date +%T))"
      timeout "${TF:-200}" python3 -m nvkit.cli bench --families --shapes "$sh" --json > "$out/family-$sh.json"
      echo "=== exit $? ($(date +%T))"; cat "$out/family-$sh.json"
    done ;;
  first39)
    # a session's first 24-token request (fast=None's choice) in three fresh processes one after
    # the other: the machine's first (Triton compiling), then two on a machine that has run nvkit,
    # each with where the Triton warm-up stood after the load and after the request
    for i in 1 2 3; do
      echo "=== first request, process $i ($(date +%T))"
      timeout 200 python3 scripts/first_request.py auto > "$out/first39-$i.log" 2>&1
      echo "=== exit $? ($(date +%T))"; grep -E "^(load|after|auto)" "$out/first39-$i.log"
    done ;;
  list-first)
    # the first list of 64 prompts after a fine-tune (the session bench's cold phase), then a second
    # list: in a fresh Triton cache (the machine's first), then again on that cache, with what Triton
    # compiled inside each list and where the first one's time went
    export TRITON_CACHE_DIR=$(mktemp -d /tmp/triton-list-first-XXXX)
    for i in 1 2; do
      echo "=== first list after a fine-tune, process $i ($(date +%T))"
      timeout "${TF:-200}" python3 scripts/first_request.py fast,fast --finetune 10 --list 64 --tokens 128 \
        --profile "${PROF:-25}" > "$out/list-first-$i.log" 2>&1
      echo "=== exit $? ($(date +%T))"; grep -E "^(load|base request|fine-tune|fast #|what Triton compiled)" "$out/list-first-$i.log"
    done ;;
  first-adapter)
    # where the first request after a fine-tune spends its time (issue 39: at most 0.5 s more than
    # the base's), profiled; then the compare test with the garbage collector's pauses it met
    echo "=== first request after a fine-tune ($(date +%T))"
    timeout "${TF:-300}" python3 scripts/first_request.py fast --finetune 10 --tokens 256 --profile 40 \
      > "$out/first-adapter.log" 2>&1
    echo "=== exit $? ($(date +%T))"; grep -E "^(load|base request|fine-tune|fast #)" "$out/first-adapter.log"
    T=100 t tests/gpu/test_fast_session_gpu.py -k compare ;;
  long)
    echo "=== batch-1 attention launches ($(date +%T))"
    timeout 240 python3 -m nvkit.benchmarks.attention --batch1 --csv "$out/attention-batch1.csv"; echo "=== exit $? ($(date +%T))"
    T=240 bench shape:qwen3-0.6b --decode --repeats 3 --prompt-len "${PROMPT_LEN:-8192}" --paths fast
    T=240 bench shape:qwen3-0.6b --decode --profile --prompt-len "${PROMPT_LEN:-8192}" ;;
  afternoon)
    T=${TA:-400} bench shape:${SHAPE:-qwen3-0.6b} --afternoon
    T=200 t tests/gpu/test_fast_session_gpu.py -k "quicker or compare"
    T=200 t tests/gpu/test_sliding_window_gpu.py tests/gpu/test_cuda_graphs_gpu.py ;;
  families)
    # every family on the default session, one process per shape (a failing one leaves the others):
    # FAMILIES="gemma-3-1b phi-4-mini" picks some (default nvkit.benchmarks.families.FAMILIES)
    for sh in ${FAMILIES:-llama-3.2-1b qwen3-0.6b gemma-3-1b gemma-3-4b phi-4-mini smollm3-3b olmo-2-1b olmoe-1b-7b}; do
      echo "=== families $sh ($(date +%T))"
      timeout "${TF:-300}" python3 -m nvkit.cli bench --families --shapes "$sh" ${SETTLE:+--settle} --json \
        > "$out/family-$sh.json"
      echo "=== exit $? ($(date +%T))"; cat "$out/family-$sh.json"
    done ;;
  families-check)
    T=${TF:-460} t tests/gpu/test_families_gpu.py
    T=100 t tests/gpu/test_fast_session_gpu.py -k compare ;;
  shapes-norms)
    # the shapes drawn on the GPU and the norm kernels in bf16, then the families whose layers
    # norm after their branches (FAMILIES to change), timed as one by one in families
    T=200 t tests/gpu/test_shaped_gpu.py tests/gpu/test_norm_kernels_gpu.py
    for sh in ${FAMILIES:-gemma-3-1b olmo-2-1b}; do
      echo "=== families $sh ($(date +%T))"
      timeout "${TF:-150}" python3 -m nvkit.cli bench --families --shapes "$sh" --json > "$out/family-$sh.json"
      echo "=== exit $? ($(date +%T))"; cat "$out/family-$sh.json"
    done ;;
  owed36a|owed36b)
    [ -d .before/42e0f10/nvkit ] || { echo "$phase needs .before/42e0f10 (scripts/ab.sh --prepare 42e0f10)"; exit 2; }
    cp nvkit/demo/model/model.safetensors .before/42e0f10/nvkit/demo/model/
    if [ "$phase" = owed36a ]; then
      T=200 t tests/gpu/test_fast_session_gpu.py -k compiles_none
      ONLY=new ROUNDS=1 T=260 bash scripts/ab.sh .before/42e0f10 bench shape:qwen3-0.6b --session --phases cold
    else
      ONLY=old ROUNDS=1 T=260 bash scripts/ab.sh .before/42e0f10 bench shape:qwen3-0.6b --session --phases cold
      T=${TE:-300} t tests/gpu/test_fast_gpu.py -k "not decode_benchmark_table"
    fi ;;
  deterministic)
    T=${TD:-420} t tests/gpu/test_batched_gpu.py -k deterministic
    T=120 t tests/gpu/test_batched_gpu.py -k "each_prompt or batch_of_one" ;;
  profile)
    echo "=== attention launch shapes ($(date +%T))"
    timeout 200 python3 -m nvkit.benchmarks.attention --csv "$out/attention.csv"; echo "=== exit $? ($(date +%T))"
    echo "=== profile ($(date +%T))"
    timeout "${TP:-400}" python3 scripts/gpu_profile.py "${PROFILE_PART:-all}"; echo "=== exit $? ($(date +%T))" ;;
  notebooks)
    T=540 t tests/gpu/test_notebooks_gpu.py tests/gpu/test_panels_gpu.py ;;
  x2a|x2b)
    # two GPUs (nvidia-h200-x2, issue 22): every strategy of nvkit.launch. ZeRO needs DeepSpeed in the
    # site folder (pip download deepspeed==0.19.8 into the carried wheels); without it those tests skip.
    # x2a: DDP/FSDP2/ZeRO-2/ZeRO-3/TP on the Qwen3-0.6B shape and their table; x2b: accelerate, QLoRA
    # under FSDP2/ZeRO-3, TP generation against one GPU, the Launch panel, DDP of finetune.
    n=$(nvidia-smi -L | wc -l); [ "$n" -ge 2 ] || { echo "$phase needs 2 GPUs, this machine has $n"; exit 2; }
    python3 -c 'import importlib.metadata as m; print("deepspeed", m.version("deepspeed"))' || echo "deepspeed missing: the ZeRO tests skip"
    if [ "$phase" = x2a ]; then T=540 t tests/gpu/test_parallel_gpu.py -k "strategy_trains or comparison"
    else T=540 t tests/gpu/test_parallel_gpu.py tests/gpu/test_finetune_gpu.py -k "ddp or (parallel and not strategy_trains and not comparison)"; fi ;;
  one-gpu|zero3-profile)
    python3 -c 'import importlib.metadata as m; print("deepspeed", m.version("deepspeed"), "peft", m.version("peft"))' \
      || echo "deepspeed missing: the ZeRO runs skip (carry .whl-ds)"
    if [ "$phase" = one-gpu ]; then NVKIT_GPU_OUT="$out/strategies-one-gpu.json" T=${TS:-480} t tests/gpu/test_strategies_one_gpu.py
    else
      echo "=== zero3 profile ($(date +%T))"
      timeout "${TZP:-400}" python3 scripts/zero3_profile.py --out /tmp/nvkit-zero3-profile; echo "=== exit $? ($(date +%T))"
    fi ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
