#!/usr/bin/env bash
# Fetch bitsandbytes for the GPU machine into the git-ignored .whl-bnb13, cut to the one CUDA
# library its torch (cu130) loads. The whole wheel (~43 MB, a library per CUDA version) does not fit
# one device transfer beside .whl-core and the tree (64 MiB), so a QLoRA call needed a second call on
# the same warm machine; the cut wheel (~4 MB) travels with .whl-core and .whl-server in one call.
# Run from the project root; carry .whl-bnb13 beside the others.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.whl-\*/' .git/info/exclude 2>/dev/null || echo '/.whl-*/' >> .git/info/exclude
[ -f ../shared/gpu/install.sh ] || { echo "../shared/gpu/install.sh is missing: run this from the project root" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the version ../shared/gpu/wheels.sh bnb fetches
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_24_x86_64 -d "$tmp" bitsandbytes==0.50.2
mkdir -p .whl-bnb13
python3 - "$tmp" .whl-bnb13 "${BNB_CUDA:-cuda130}" <<'PY'
import glob, os, sys, zipfile
src_dir, dst_dir, keep = sys.argv[1:]
src = glob.glob(os.path.join(src_dir, "bitsandbytes-*.whl"))[0]
dst = os.path.join(dst_dir, os.path.basename(src))
def drop(name):  # every native library but the CPU one and the CUDA one torch loads
    return name.startswith("bitsandbytes/libbitsandbytes_") and keep not in name and "_cpu" not in name
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if drop(info.filename):
            continue
        data = zi.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(l for l in data.splitlines(True) if not drop(l.decode().split(",")[0]))
        zo.writestr(info, data)
print(dst, os.path.getsize(dst), "bytes")
PY
cp ../shared/gpu/install.sh .whl-bnb13/install.sh
