#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the checkout root: installs the wheels that
# travelled with this call (../shared/gpu/wheels.sh fetches them into .whl-*), then runs one phase
# of the GPU tests and benchmarks with all output teed into $OUT. Usage:
#     bash scripts/gpu_session.sh PHASE      (PHASE: core | bnb | fa4-first-half | fa4 | open | notebooks |
#                                             lanes-a | lanes-b | quiet | memory | triton |
#                                             decide | fused-checks | auto-checks | table)
# Carry .whl-core for core/open/quiet/memory/lanes-a, .whl-bnb for bnb/lanes-b (after a core call,
# while the machine is warm: installs accumulate in /tmp/nvkit-site), .whl-fa4a then .whl-fa4b in two
# consecutive calls. Install once per call: two pip installs at once corrupted the site folder.
# "lanes-a" then "lanes-b" run the checks side by side on a 4-GPU machine, one lane per GPU (session
# 3 ran them; its timings are in the README). Left by session 3, each in its own call on a
# single-GPU machine: "quiet" (the decode table with nothing else on the host, including the
# fast+triton path, then the fast-path tests) and "memory" (the whole memory suite on current code);
# session 4 ran those, then "triton". Left by session 4 and run in session 6: "decide", then
# "fused-checks", then "auto-checks", each its own call, back to back on one machine; then "table"
# (the README's decode and batch figures with the defaults of session 6).
set -uo pipefail
phase=${1:?phase}
for inst in .whl-*/install.sh; do eval "$(bash "$inst")"; break; done
export PYTHONPATH=$PWD:${PYTHONPATH:-} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NVKIT_CACHE=/tmp/nvkit-cache
out=${OUT:-/tmp/out}; mkdir -p "$out"
py() { python3 "$@"; }
t() { echo "=== $* ($(date +%T))"; timeout "${T:-300}" python3 -m pytest -q -s -p no:cacheprovider -rs "$@"; }
case "$phase" in
  core)
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv
    py -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    T=420 t tests/gpu/test_session_gpu.py tests/gpu/test_gpus_gpu.py tests/gpu/test_memory_gpu.py \
        tests/gpu/test_fast_gpu.py tests/gpu/test_finetune_gpu.py -k "not bench and not qlora and not ddp" ;;
  bnb)
    T=200 t tests/gpu/test_backends_gpu.py -k "bnb or table or fa2_fa3 or local_kernel" tests/gpu/test_finetune_gpu.py -k "qlora or bnb or table or fa2_fa3 or local_kernel"
    T=300 t tests/gpu/test_fast_gpu.py tests/gpu/test_finetune_gpu.py -k "bench" ;;
  open)
    T=200 t tests/gpu/test_memory_gpu.py -k "finetune_predicts or overhead"
    echo "=== decode: the fused step's variants in one process ($(date +%T))"
    timeout 300 python3 -m nvkit.bench_decode --paths "fast,fast cublas head,fast reduce attention" --csv "$out/decode_variants.csv"
    T=240 t tests/gpu/test_fast_gpu.py -k bench ;;
  notebooks)  # its own call: ten kernels, each paying its model load and fast-path capture
    T=560 t tests/gpu/test_notebooks_gpu.py ;;
  lanes-a|lanes-b)  # 4 GPUs, one lane each (logs: $OUT/lane-*.log); carry .whl-core for a, then .whl-bnb for b
    n=$(nvidia-smi -L | wc -l); [ "$n" -ge 4 ] || { echo "lanes need 4 GPUs, this machine has $n"; exit 2; }
    # Fewer threads per lane: four processes with a thread per core each slowed the host-bound
    # plain-generate rows 2x in the first try.
    export OMP_NUM_THREADS=8 TORCHINDUCTOR_COMPILE_THREADS=12
    lane() { local gpu=$1 name=$2; shift 2; ( export CUDA_VISIBLE_DEVICES=$gpu; "$@" ) >"$out/lane-$name.log" 2>&1; echo "lane $name exit $?"; }
    nb() { T=540 t tests/gpu/test_notebooks_gpu.py -k "$1 or summary"; }
    if [ "$phase" = lanes-a ]; then
      decode() { timeout 540 python3 -m nvkit.bench_decode --csv "$out/decode_bench.csv" \
        --paths "generate,static+compile,fast,fast+nopdl,fast+combo,padded generate,generate_batch,nvkit batch"; }
      checks() { T=240 t tests/gpu/test_fast_gpu.py -k "not bench"; T=240 t tests/gpu/test_memory_gpu.py -k "finetune_predicts or overhead"; }
      train() { T=200 t tests/gpu/test_backends_gpu.py -k "generates_trains and (sdpa or eager)"; T=300 t tests/gpu/test_finetune_gpu.py -k "liger or lora_bf16"; }
      lane 0 decode decode & lane 1 checks checks & lane 2 nb-a nb "00 or 01 or 02 or 03 or 04" & lane 3 train train &
    else
      bnbl() { T=240 t tests/gpu/test_backends_gpu.py -k "bnb or fa2_fa3 or local_kernel"; T=240 t tests/gpu/test_finetune_gpu.py -k qlora; }
      lane 2 nb-b nb "05 or 06 or 07 or 08 or 09" & lane 3 bnb bnbl &
    fi
    wait
    tail -n 4 "$out"/lane-*.log ;;
  quiet)  # one GPU, nothing else running: the decode table alone first (its host-bound rows are
          # what other jobs on the host disturbed in session 3), then the checks left from session 3
    timeout 350 python3 -m nvkit.bench_decode --csv "$out/decode_bench.csv" \
      --paths "generate,static+compile,fast,fast+triton,fast+nopdl,padded generate,generate_batch,nvkit batch"
    T=220 t tests/gpu/test_fast_gpu.py -k "not bench" ;;
  triton)  # session 4: the split-cache attention kernels as a custom op, against the matmul step
    timeout 300 python3 -m nvkit.bench_decode --csv "$out/decode_triton.csv" \
      --paths "fast,fast+triton,fast+triton+nopdl" 2>"$out/bench_stderr.log"
    grep -v DEBUG "$out/bench_stderr.log" | tail -20
    T=200 t -p no:logging tests/gpu/test_fast_gpu.py -k "triton or batch_path" ;;
  decide)  # left by session 4: which attention the fused step should use by default, timed in
           # alternation (5 rounds, median) so that the order of the paths does not decide it
    timeout 540 python3 -m nvkit.bench_decode --csv "$out/decode_decide.csv" --repeats 5 \
      --paths "fast,fast+triton,fast+tfused" 2>"$out/bench_stderr.log"
    grep -v DEBUG "$out/bench_stderr.log" | tail -20 ;;
  fused-checks)  # the triton kernels compiled and captured: demo tokens, Qwen3-shape logits and profile
    T=200 t -p no:logging tests/gpu/test_fast_gpu.py -k "triton"
    NVKIT_FAST_ATTENTION=triton-fused T=240 t -p no:logging tests/gpu/test_fast_gpu.py -k "logits_close" ;;
  auto-checks)  # the user-facing fast-path tests as they would run with DEFAULT_ATTENTION = "auto"
    export NVKIT_FAST_ATTENTION=auto
    T=300 t -p no:logging tests/gpu/test_fast_gpu.py -k "not bench and not triton and not logits"
    T=240 t -p no:logging tests/gpu/test_memory_gpu.py -k "overhead" ;;
  table)  # session 6: the decode and batch tables with the defaults users get (fast = attention "auto"),
          # matmul beside it, 3 alternating rounds of the batch-1 paths, one process
    timeout 430 python3 -m nvkit.bench_decode --csv "$out/decode_table.csv" --repeats 3 \
      --paths "generate,static+compile,fast,fast+matmul,padded generate,generate_batch,nvkit batch" 2>"$out/bench_stderr.log"
    grep -v DEBUG "$out/bench_stderr.log" | tail -20 ;;
  memory)  # every memory check on the current code (the estimates, OOM, the fine-tune's own prediction)
    T=500 t tests/gpu/test_memory_gpu.py ;;
  fa4-first-half)
    echo "first half of FlashAttention-4 installed" ;;
  fa4)  # after fa4-first-half; then the tests that want every GPU of the machine
    T=300 t tests/gpu/test_backends_gpu.py -k "generates_trains or bench_qwen3 or table"
    T=200 t tests/gpu/test_session_gpu.py tests/gpu/test_gpus_gpu.py ;;
esac
