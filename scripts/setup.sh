#!/usr/bin/env bash
# Creates (or reuses) .venv inside the checkout and installs everything nvkit needs: torch (CPU
# build on a machine without an NVIDIA driver, CUDA build with one), nvkit with its test extra,
# the JupyterLab extension built from labextension/, and Debian's chromium for the browser tests.
# Re-running is cheap: each step is skipped when what it produces is already there and current.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NVKIT_VENV:-.venv}
PY=${PYTHON:-python3}
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip >/dev/null

# torch first, so nvkit's "torch>=2.6" is already satisfied and pip does not pick a build itself.
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    log "NVIDIA driver found: installing the CUDA build of torch"
    "$VPY" -m pip install -q torch
  else
    # No driver: the CPU build. On these machines torch 2.13.0's CPU wheel lies on local disk;
    # elsewhere, PyTorch's CPU index serves the same version.
    log "no NVIDIA driver: installing the CPU build of torch"
    "$VPY" -m pip install -q torch==2.13.0 2>/dev/null \
      || "$VPY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi

# Debian's chromium drives the browser tests (never a browser download).
if [ "${NVKIT_SKIP_CHROMIUM:-0}" != 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing Debian's chromium for the browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null
  else
    log "chromium missing and not root: browser tests will be skipped (apt-get install chromium)"
  fi
fi

# The lab extension is built with Node (jupyter-builder runs Rspack, which wants Node >= 20.19).
if ! command -v node >/dev/null 2>&1; then
  echo "[setup] Node.js (>= 20.19) is needed to build the JupyterLab extension: install nodejs and npm" >&2
  exit 1
fi
# jlpm and jupyter-builder (used by labextension/package.json's scripts) live in the venv.
VENV_BIN=$(cd "$VENV/bin" && pwd)
export PATH="$VENV_BIN:$PATH"

stamp="$VENV/.nvkit-installed"
want=$(cat pyproject.toml labextension/package.json 2>/dev/null | sha1sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$VPY" -c 'import nvkit' 2>/dev/null; then
  log "installing nvkit (editable) with its test extra"
  # The browser is Debian's; Playwright must not download its own. The editable install's build
  # hook (hatch-jupyter-builder) runs `jlpm install` + `jlpm install:extension` in labextension/.
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$VPY" -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi

# Rebuild the lab extension when any of its inputs is newer than the last build (the build hook
# above only watches labextension/src, and only runs when pip does).
built=nvkit/labextension/package.json
if [ ! -f nvkit/labextension/static/style.js ] || [ ! -f "$built" ] || [ -n "$(find labextension/src \
     labextension/style labextension/schema labextension/package.json labextension/yarn.lock \
     labextension/tsconfig.json -newer "$built" -print -quit 2>/dev/null)" ]; then
  log "building the JupyterLab extension (labextension/ -> nvkit/labextension/)"
  (cd labextension && jlpm install && jlpm build)
fi
# Editable install: the venv's share/jupyter/labextensions/nvkit must be a link to the build, and
# the server extension enabled (the wheel ships jupyter-config/ for that; enable it explicitly too).
link="$VENV/share/jupyter/labextensions/nvkit"
if [ "$(readlink -f "$link" 2>/dev/null)" != "$(readlink -f nvkit/labextension)" ]; then
  log "linking the lab extension into $VENV (jupyter-builder develop)"
  "$VENV_BIN/jupyter-builder" develop --overwrite . >/dev/null
fi
if ! grep -qs '"nvkit": *true' "$VENV"/etc/jupyter/jupyter_server_config.d/*.json; then
  log "enabling the nvkit server extension"
  "$VENV_BIN/jupyter" server extension enable --sys-prefix nvkit >/dev/null
fi
log "ready: $("$VPY" -c 'import torch, transformers; print("torch", torch.__version__, "· transformers", transformers.__version__)')"
