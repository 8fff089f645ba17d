#!/usr/bin/env bash
# Fetch, into the git-ignored .whl-server, the Jupyter server stack that the GPU kernel-memory test
# (tests/gpu/kernels: two real kernels under a real Jupyter server, through pytest-jupyter) needs
# and that neither the GPU machine's image nor ../shared/gpu/wheels.sh core brings. Pinned to the
# versions CI's environment resolves, so the GPU run tests what CI tests. Run from the project root
# after `../shared/gpu/wheels.sh core`; carry .whl-server beside .whl-core
# (it is small: it fits one transfer beside .whl-core), starting with
#     eval "$(bash .whl-server/install.sh)"
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.whl-\*/' .git/info/exclude 2>/dev/null || echo '/.whl-*/' >> .git/info/exclude
[ -f ../shared/gpu/install.sh ] || { echo "../shared/gpu/install.sh is missing: run this from the project root" >&2; exit 2; }
mkdir -p .whl-server
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d .whl-server \
  jupyter_server==2.21.1 pytest-jupyter==0.11.0 jupyter_server_terminals==0.5.4 terminado==0.18.1 \
  jupyter-events==0.12.1 python-json-logger==4.2.0 rfc3339-validator==0.1.4 rfc3986-validator==0.1.1 \
  argon2-cffi==25.1.0 argon2-cffi-bindings==26.2.0 cffi==2.1.1 pycparser==3.12 \
  nbconvert==7.17.2 bleach==6.4.0 defusedxml==0.7.1 jupyterlab_pygments==0.3.0 mistune==3.4.0 \
  pandocfilters==1.5.1 tinycss2==1.5.1 webencodings==0.6.1 beautifulsoup4==4.15.0 soupsieve==4.1.3 \
  Send2Trash==2.2.0 websocket-client==1.9.2
cp ../shared/gpu/install.sh .whl-server/install.sh
du -sh .whl-server
