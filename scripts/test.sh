#!/usr/bin/env bash
# The test command (README, .ci/run): set up (recordtool installed from its wheel into .venv),
# then the whole suite against that install. Extra args go to pytest (paths as from the repo root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
root=$PWD
# the native decoder must be in the wheel: its tests fail instead of skipping; and the tests
# must import the installed package (tests/conftest.py stops the run otherwise)
export RECORDTOOL_REQUIRE_NATIVE=1 RECORDTOOL_TEST_INSTALLED=1
args=()
for a in "$@"; do if [ -e "$root/${a%%::*}" ]; then args+=("$root/$a"); else args+=("$a"); fi; done
# run from outside the tree: `python -m`/`-c` (pytest's and the tests' subprocesses) put the
# working directory first on sys.path, where the tree's recordtool/ would shadow the installed one
cd "$(mktemp -d)"
exec "$root/.venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root" -c "$root/pyproject.toml" \
  "$root/tests" ${args[@]+"${args[@]}"}
