#!/usr/bin/env bash
# Fill the git-ignored .whl-ds with what the strategy runs on the GPU machine need beyond .whl-core
# (tests/gpu/test_strategies_one_gpu.py, tests/gpu/test_parallel_gpu.py, scripts/zero3_profile.py):
#   - DeepSpeed: PyPI has it only as a source package and the GPU machine reaches no index, so the
#     wheel is built here, with no op compiled (nvkit's settings need none of them: see the
#     deepspeed extra in pyproject.toml), and carried with its dependencies;
#   - PEFT: the GPU image's 0.21.0 lacks the tensor-parallel LoRA hooks that nvkit's strategy='tp'
#     needs (nvkit.train.strategies.TP_LORA_PEFT; tests/train/test_strategy_needs.py checks the version
#     below admits it).
# Versions are the ones the CPU suite runs with (.venv). Building needs torch, so it runs with the
# project's .venv (PYTHON to choose another). Run from the project root, then carry .whl-ds beside
# .whl-core; on the GPU machine `eval "$(bash .whl-core/install.sh)"` installs every carried folder.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.whl-\*/' .git/info/exclude 2>/dev/null || echo '/.whl-*/' >> .git/info/exclude
[ -f ../shared/gpu/install.sh ] || { echo "../shared/gpu/install.sh is missing: run this from the project root" >&2; exit 2; }
py=${PYTHON:-.venv/bin/python}
"$py" -c 'import torch' 2>/dev/null || { echo "$py has no torch: DeepSpeed's build imports it (set PYTHON)" >&2; exit 2; }
quiet() { { grep -v 'is ignored: it is neither' || true; } >&2; }
mkdir -p .whl-ds
# pure Python: no op is pre-built, and the wheel is tagged py3-none-any
DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl-ds 2>&1 | quiet
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d .whl-ds \
  peft==0.21.2 \
  einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 py-cpuinfo==9.0.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 2>&1 | quiet
cp ../shared/gpu/install.sh .whl-ds/install.sh
ls .whl-ds
du -sh .whl-ds
