#!/usr/bin/env bash
# The whole test suite, as `make test` runs it, in two pytest processes:
#   1. everything but the browser tests, spread over NVKIT_TEST_WORKERS processes (default 2;
#      pytest-xdist, a file per worker at a time so module fixtures are built once). Most tests
#      keep one core busy (one kernel, one small model), so a second worker uses the core that
#      would otherwise idle.
#   2. the browser tests (marker `ui`) alone, in one process: they time what a user feels (a
#      panel within 3 s, a chart that costs nothing) and share the machine with JupyterLab and
#      Chromium, so no other test runs beside them; a process of their own also keeps
#      Playwright's event loop away from the tests that call asyncio.run.
# Arguments go to both runs (e.g. `make test PYTEST_ARGS=tests/faces`). Exit code: the first
# failing run's; a run that collects nothing (pytest's 5) fails the suite unless arguments chose
# what to run, and it fails whenever both runs collect nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
workers=${NVKIT_TEST_WORKERS:-2}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

par=(-n "$workers" --dist loadfile)
threads=(OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}")
# One torch thread per worker unless asked otherwise: two workers on two cores with torch's default
# of a thread per core each would fight over the same cores.
case "$workers" in
  0) par=(); threads=() ;;
  1) threads=() ;;
esac
# --durations: the slowest tests named in every run's log, where keeping CI under half an hour starts
env "${threads[@]}" "$PY" -m pytest -ra --durations=15 "${par[@]}" -m "not ui" "$@"; rest=$?
"$PY" -m pytest -ra -m ui "$@"; ui=$?

echo "[test] everything but the browser: exit $rest; the browser tests: exit $ui"
[ "$rest" = 5 ] && [ "$ui" = 5 ] && exit 5
for code in "$rest" "$ui"; do
  [ "$code" = 0 ] || { [ "$code" = 5 ] && [ $# -gt 0 ]; } || exit "$code"
done
exit 0
