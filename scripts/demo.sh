#!/usr/bin/env bash
# The main job on generated sample data: generate an ImageNet-like folder, pack it, inspect,
# verify, benchmark pack/read against plain copies and the fused decoder against Pillow.
# Usage: bash scripts/demo.sh [IMAGES]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
images=${1:-2000}
py=.venv/bin/python
photos=()
[ -d ../shared/photos ] && photos=(--photos ../shared/photos)
rm -rf data/sample data/sample-packed
$py scripts/make_imagenet_like.py data/sample --images "$images" --classes 20 "${photos[@]}"
.venv/bin/recordtool pack data/sample data/sample-packed --shards 8
.venv/bin/recordtool inspect data/sample-packed
.venv/bin/recordtool verify data/sample-packed --decode
$py benchmarks/bench_format.py data/sample data/sample-packed
$py benchmarks/bench_decode.py data/sample-packed --images 1024 --repeat 2
