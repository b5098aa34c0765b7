#!/usr/bin/env bash
# The GPU path's pixels on the GPU machine, in one call (< 4 min): GPU vs CPU pixels and Loader speed for each
# chroma mode of the GPU decoders (replicate = nvJPEG's RGBI as before, interpolate = planar
# YCbCr of each window's region + libjpeg's fancy upsampling in our kernel, nvjpeg =
# NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION).
# Called by scripts/device_run.sh's `fidelity` step (its setup: wheels with recordtool's own, PYTHONPATH,
# /tmp/bench-packed); logs under $OUT/fidelity, a short table last.
#   FID_IMAGES (3000): size of the generated fidelity set; FID_WINDOWS (6): windows per photo variant;
#   FID_DALI=1: DALI in the speed run too (needs it assembled); FID_BUDGET (230 s): stop starting steps after it
#   FID_MODES: chroma modes (default all three); FID_SAME (on): the set's Loader same_pixels, on / off / on,off
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; D="$OUT/fidelity"; mkdir -p "$D"
BUDGET=${FID_BUDGET:-230}; T0=$SECONDS
left() { echo $((BUDGET - (SECONDS - T0))); }
cap() { local l; l=$(left); (( l > $1 )) && l=$1; (( l < 1 )) && l=1; echo "$l"; }  # a timeout ≤ $1 and ≥ 1 s
MODES=${FID_MODES:-replicate,interpolate,nvjpeg}
if [ "${FID_TESTS:-1}" = 1 ]; then  # FID_TESTS=0: the same call's GPU suite (device_run.sh tests) ran them
echo "== GPU tests of the chroma paths ($(left) s left)"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/test_gpu_plan.py tests/test_gpu_reference.py \
  -k "planar or planes or interpolate or chroma or host_matches or sample_dtype or kernel_matches or gpu_matches_cpu or disagree" \
  > "$D/pytest_chroma.log" 2>&1
rc=$?; (( rc == 124 )) && echo "pytest (chroma): TIMED OUT after 120 s" | tee -a "$D/pytest_chroma.log"
echo "pytest (chroma): rc $rc, $(tail -1 "$D/pytest_chroma.log")"
fi
echo "== fidelity set + Loader cuda vs cpu ($(left) s left)"
if [ ! -d /tmp/fidset ]; then
  python3 benchmarks/make_fidelity_set.py /tmp/fidset --photos .carry/photos --images "${FID_IMAGES:-3000}" \
    > "$D/fidset.log" 2>&1
fi
tail -1 "$D/fidset.log"
timeout "$(cap ${FID_SET_S:-100})" python3 benchmarks/gpu_fidelity.py --set /tmp/fidset --chroma $MODES \
  --splits gpu,auto --same-pixels "${FID_SAME:-on}" --json "$D/set.json" > "$D/set.log" 2>&1 || echo "set report: rc $? (see $D/set.log)"
echo "== Loader speed per chroma mode, alternating ($(left) s left)"
dali=--no-dali; [ "${FID_DALI:-0}" = 1 ] && dali="--dali"
if (( $(left) > 45 )); then
  timeout "$(cap 90)" python3 benchmarks/bench_gpu.py /tmp/bench-packed --epochs 3 --producers 4 \
    --splits auto --hybrid on --chroma $MODES,$MODES --no-ceilings --peers none $dali --json "$D/speed.json" \
    > "$D/speed.log" 2>&1 || echo "speed: rc $? (see $D/speed.log)"
fi
echo "== photo variants per chroma mode ($(left) s left)"
if (( $(left) > 30 )); then
  timeout "$(cap 200)" python3 benchmarks/gpu_fidelity.py .carry/photos --windows "${FID_WINDOWS:-6}" --chroma $MODES \
    --json "$D/photos.json" > "$D/photos.log" 2>&1 || echo "photos: rc $? (see $D/photos.log)"
fi
echo "=================== fidelity results, $((SECONDS - T0)) s"
grep -E "passed|failed|error" "$D/pytest_chroma.log" | tail -3
grep -E "^(FAILED|ERROR)" "$D/pytest_chroma.log" | head -12
grep -E "^=== Loader|chroma .* split .* all|4:2:0|4:2:2|4:4:4|gray|progr|worst" "$D/set.log" | head -60
grep -E "Error|Traceback" "$D/set.log" | head -3
grep -E "sweep:|recordtool Loader|dali" "$D/speed.log" | head -12
grep -E "Error|Traceback" "$D/speed.log" | head -3
grep -E "^all, chroma" "$D/photos.log"
grep -E "Error|Traceback" "$D/photos.log" | head -3
