#!/usr/bin/env bash
# Set up a fresh Debian 12 machine: system libraries, then a venv with recordtool and its test deps.
# Idempotent; called by scripts/demo.sh and scripts/test.sh (and so by .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for pkg in libturbojpeg0 libjpeg62-turbo-dev; do
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
# build/install log kept out of the way; shown only when it fails. The tests run pack's Ray
# engine on a local Ray cluster, so [ray] comes too (the core install stays without it).
.venv/bin/python -m pip install -q -e ".[test,ray,torch]" > .venv/install.log 2>&1 || { cat .venv/install.log; exit 1; }
