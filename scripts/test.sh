#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then the whole suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# the native decoder must have built: its tests fail instead of skipping
export RECORDTOOL_REQUIRE_NATIVE=1
exec .venv/bin/python -m pytest -q tests "$@"
