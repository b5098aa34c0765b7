#!/usr/bin/env bash
# Prepare what scripts/device_run.sh needs on the GPU machine (it has no network):
#   .whl/   wheels for Python 3.12 it lacks: crc32c, protobuf, pyturbojpeg (built here)
#   (DALI and nvImageCodec, the peers, travel separately: ../shared/tools/dali_carry.sh .dali)
#   .carry/ Debian's libturbojpeg.so.0 (PyTurboJPEG's library), ../shared/photos, the commit id
# Both folders are git-ignored (.git/info/exclude) and travel with `carry: [".whl", ".carry"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qx '/.carry/' .git/info/exclude || echo '/.carry/' >> .git/info/exclude
mkdir -p .whl .carry/photos
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d .whl crc32c==2.9.post0 protobuf==7.36.2
[ -n "$(ls .whl/pyturbojpeg-*.whl 2>/dev/null)" ] || python3 -m pip wheel -q --no-deps -w .whl 'pyturbojpeg==1.8.3'
cp -L /usr/lib/x86_64-linux-gnu/libturbojpeg.so.0 .carry/
if [ -d ../shared/photos ]; then cp ../shared/photos/*.jpg .carry/photos/; fi
git rev-parse --short HEAD > .carry/commit
du -sh .whl .carry
