#!/usr/bin/env bash
# The test command (README, .ci/run): set up, then the whole suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q tests "$@"
