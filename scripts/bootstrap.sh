#!/usr/bin/env bash
# Set up a fresh Debian 12 machine: the packages the wheel's build needs, then a venv with the
# test deps and recordtool installed from its platform wheel, as a user installs it.
# Idempotent; called by scripts/demo.sh and scripts/test.sh (and so by .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# the build's needs only (scripts/build_wheels.sh): the installed wheel carries libjpeg-turbo
need=()
for pkg in g++ unzip libturbojpeg0 libjpeg62-turbo-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch for the torch-facing tests (as_torch, DataLoader, DDP over gloo, a Lightning fit), on the
# CPU. Pinned so pip takes the CPU build where one is on hand (this project's machines keep a
# torch 2.13.0 CPU wheel: ~1.5 min); elsewhere pip takes PyPI's build of it, which runs on the
# CPU too. Installed first, so [torch] and lightning (in [test]) find it and add no other build.
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch==2.13.0" > .venv/torch-install.log 2>&1 \
    || { cat .venv/torch-install.log; exit 1; }
fi
# recordtool: the platform wheel of this tree for the venv's Python, built again only when the
# sources changed (the stamp), and installed like any wheel — not editable, so the tests and
# the demo run what `pip install recordtool-*.whl` gives. The tests run pack's Ray engine on a
# local Ray cluster, so [ray] comes too (the core install stays without it). Logs are kept out
# of the way and shown only when a step fails.
stamp=$(cat setup.py pyproject.toml MANIFEST.in $(find recordtool native proto -type f \( -name '*.py' -o -name '*.cpp' \
  -o -name '*.h' -o -name '*.cu' -o -name '*.proto' \) -not -path '*/__pycache__/*' | sort) | sha256sum | cut -c1-16)
if [ "$(cat .venv/recordtool-wheel.stamp 2>/dev/null)" != "$stamp" ]; then
  tag=$(.venv/bin/python -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
  bash scripts/build_wheels.sh build/wheels .venv/bin/python > .venv/wheel-build.log 2>&1 \
    || { cat .venv/wheel-build.log; exit 1; }
  whl=$(ls build/wheels/recordtool-*-"$tag"-"$tag"-*.whl)
  { .venv/bin/python -m pip install -q "$whl[test,ray,torch]" \
    && .venv/bin/python -m pip install -q --force-reinstall --no-deps "$whl"; } > .venv/install.log 2>&1 \
    || { cat .venv/install.log; exit 1; }
  echo "$stamp" > .venv/recordtool-wheel.stamp
fi
