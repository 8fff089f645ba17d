#!/usr/bin/env bash
# Before/after on the GPU machine: the same nvkit command in an older tree and in this checkout,
# each in its own process, alternating (old, new, new, old, ...), ROUNDS rounds (default 2).
#   here:        bash scripts/ab.sh --prepare COMMIT      # writes the older tree into .before/COMMIT
#   GPU machine: bash scripts/ab.sh .before/COMMIT ARGS...  (carry .whl-core and .before)
# ARGS go to `python -m nvkit.cli`, e.g.: bench shape:qwen3-0.6b --session --phases cold
# Each run's output is teed into $OUT/ab-<tree>-<round>.log. ONLY=old or ONLY=new runs one tree (a
# command too long for two in one 10-minute call: one call per tree, on the same warm machine).
set -uo pipefail
if [ "${1:-}" = "--prepare" ]; then
  commit=${2:?commit}
  dest=".before/$commit"
  rm -rf "$dest" && mkdir -p "$dest"
  git archive "$commit" | tar -x -C "$dest"
  echo "$dest ($(du -sh "$dest" | cut -f1)); carry .before with the call"
  exit 0
fi
old=${1:?the older tree, .before/COMMIT}; shift
[ -d "$old/nvkit" ] || { echo "$old holds no nvkit tree: bash scripts/ab.sh --prepare COMMIT first"; exit 2; }
if [ -z "${NVKIT_WHEELS_READY:-}" ]; then
  for inst in .whl-*/install.sh; do eval "$(bash "$inst")"; break; done
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NVKIT_CACHE=${NVKIT_CACHE:-/tmp/nvkit-cache}
out=${OUT:-/tmp/out}; mkdir -p "$out"
new=$PWD
for r in $(seq 1 "${ROUNDS:-2}"); do
  order=("$old" "$new"); [ $((r % 2)) -eq 0 ] && order=("$new" "$old")
  for tree in "${order[@]}"; do
    name=$([ "$tree" = "$new" ] && echo new || echo old)
    [ -n "${ONLY:-}" ] && [ "$ONLY" != "$name" ] && continue
    echo "=== $name round $r ($(date +%T)): python -m nvkit.cli $*"
    # the tree first, the wheels' site folder (install.sh put it on PYTHONPATH) kept behind it
    (cd "$tree" && PYTHONPATH="$tree:${PYTHONPATH:-}" timeout "${T:-560}" python3 -m nvkit.cli "$@") 2>&1 | tee "$out/ab-$name-$r.log" | tail -n 25
    echo "=== exit ${PIPESTATUS[0]} ($(date +%T))"
  done
done
