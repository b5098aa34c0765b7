#!/usr/bin/env bash
# Prepare what scripts/device_run.sh needs on the GPU machine (it has no network):
#   .whl/   recordtool's cp312 platform wheel of this tree (scripts/build_wheels.sh: the native
#           decoder and libjpeg-turbo inside, ~1 MB; device_run.sh installs it, compiling nothing)
#           and the wheels for Python 3.12 the machine lacks: crc32c, protobuf, pyturbojpeg
#   (DALI and nvImageCodec, the peers, travel separately: ../shared/tools/dali_carry.sh .dali)
#   .carry/ ../shared/photos, the commit id
#   .rayc/  (RAY=1 only, for STEPS=raypack) Ray for Python 3.12: its wheel unpacked without the
#           Java jars and packed as ray-cp312.tar.xz (~33 MB; the wheel itself is 79 MB, over the
#           64 MiB a call carries), plus the wheels Ray depends on (~4 MB)
#   .numba/ (NUMBA=1 only, for STEPS=ops and the compiled user ops) Numba for Python 3.12: its
#           wheel (~4 MB) and llvmlite's wheel unpacked and packed as llvmlite-cp312.tar.xz
#           (~41 MB; the wheel is 60 MB: with the tree it leaves no room in a call); device_run.sh
#           installs both into /tmp/site, kept while the machine stays warm
# The folders are git-ignored (.git/info/exclude) and travel with `carry: [".whl", ".carry"]`
# (add ".rayc" for STEPS=raypack; carry only ".rayc" and ".carry" if all three exceed 64 MiB;
# ".numba" (~45 MB) fits beside ".whl" and ".carry", not beside ".rayc" or a DALI part).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)  # (a worktree's .git is a file: its exclude is the main one's)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" || echo '/.whl/' >> "$exclude"
grep -qx '/.carry/' "$exclude" || echo '/.carry/' >> "$exclude"
mkdir -p .whl .carry/photos
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d .whl crc32c==2.9.post0 protobuf==7.36.2
# the tests step spreads the GPU suite over a few processes (device_run.sh)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl pytest-xdist==3.8.0 execnet==2.1.2
[ -n "$(ls .whl/pyturbojpeg-*.whl 2>/dev/null)" ] || python3 -m pip wheel -q --no-deps -w .whl 'pyturbojpeg==1.8.3'
rm -f .whl/recordtool-*.whl .carry/libturbojpeg.so.0  # (the wheel carries libturbojpeg now)
tmp=$(mktemp -d)
bash scripts/build_wheels.sh "$tmp" 3.12 | tail -2
mv "$tmp"/recordtool-*-cp312-cp312-*.whl .whl/ && rm -rf "$tmp"
if [ -d ../shared/photos ]; then cp ../shared/photos/*.jpg .carry/photos/; fi
git rev-parse --short HEAD > .carry/commit
if [ "${RAY:-0}" = 1 ]; then
  grep -qx '/.rayc/' "$exclude" || echo '/.rayc/' >> "$exclude"
  mkdir -p .rayc
  if [ ! -f .rayc/ray-cp312.tar.xz ]; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d "$tmp" ray==2.60.0
    python3 - "$tmp"/ray-2.60.0-*.whl "$tmp/tree" <<'EOF'
import os, sys, zipfile  # unzip keeping the executable bits (raylet, gcs_server)
wheel = zipfile.ZipFile(sys.argv[1])
for info in wheel.infolist():
    path = wheel.extract(info, sys.argv[2])
    if (info.external_attr >> 16) & 0o777:
        os.chmod(path, (info.external_attr >> 16) & 0o777)
EOF
    tar -C "$tmp/tree" --exclude=ray/jars -cf - . | xz -T0 -6 > .rayc/ray-cp312.tar.xz
    rm "$tmp"/ray-2.60.0-*.whl && mv "$tmp"/*.whl .rayc/ && rm -rf "$tmp"
  fi
fi
if [ "${NUMBA:-0}" = 1 ]; then  # the versions of this machine's .venv (tests/test_ops.py ran with them)
  NUMBA_VERSION=${NUMBA_VERSION:-0.68.1}; LLVMLITE_VERSION=${LLVMLITE_VERSION:-0.50.0}
  mkdir -p .numba
  if [ ! -f .numba/llvmlite-cp312.tar.xz ] || [ -z "$(ls .numba/numba-"$NUMBA_VERSION"-*.whl 2>/dev/null)" ]; then
    rm -f .numba/*
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d "$tmp" "numba==$NUMBA_VERSION" "llvmlite==$LLVMLITE_VERSION"
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
      "$tmp"/llvmlite-"$LLVMLITE_VERSION"-*.whl "$tmp/tree"
    tar -C "$tmp/tree" -cf - . | xz -T0 -6 > .numba/llvmlite-cp312.tar.xz.part
    mv .numba/llvmlite-cp312.tar.xz.part .numba/llvmlite-cp312.tar.xz
    mv "$tmp"/numba-"$NUMBA_VERSION"-*.whl .numba/ && rm -rf "$tmp"
  fi
fi
du -sh .whl .carry .rayc .numba 2>/dev/null || true  # the folders made (du fails on the absent ones)
