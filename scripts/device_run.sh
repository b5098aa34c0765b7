#!/usr/bin/env bash
# One call on the GPU machine (16 vCPU, Python 3.12, no network): set up from carried wheels,
# build the native part, run the tests, generate + pack the ImageNet-like set, benchmark.
# Logs and JSON go to $OUT; a short table is printed last.
#   carry: .whl and .carry, made by scripts/prepare_device_carry.sh (run it here first)
#   steps: STEPS="decode decode16 format gpu loader train memory dist" (default "decode format gpu")
#   a step is skipped when fewer than its estimated seconds are left of DEADLINE (default 570 s)
set -uo pipefail
DEADLINE=${DEADLINE:-570}
fits() {  # fits NAME SECONDS: is there time left for this step?
  if (( SECONDS + $2 > DEADLINE )); then echo "SKIPPED $1 (needs ~$2 s, $((DEADLINE - SECONDS)) s left)" | tee -a "$OUT/skipped.log"; return 1; fi
}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
IMAGES=${IMAGES:-8192}
export PYTHONUNBUFFERED=1
# no .git travels: the caller writes the commit to .carry/commit (git rev-parse --short HEAD)
[ -f .carry/commit ] && export RECORDTOOL_COMMIT=$(cat .carry/commit)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD
cp .carry/libturbojpeg.so.0 /usr/lib/x86_64-linux-gnu/ && ldconfig
nproc; python3 -c "import numpy, PIL, cv2; print('numpy', numpy.__version__, 'PIL', PIL.__version__, 'cv2', cv2.__version__)"
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -c "from recordtool import _native; print('native ok, libjpeg API', _native.LIBJPEG_VERSION)"
if [ "${PYTEST_ARGS:-tests}" != none ]; then
  RECORDTOOL_REQUIRE_NATIVE=1 timeout 300 python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests} > "$OUT/pytest.log" 2>&1
  echo "pytest: $(tail -1 "$OUT/pytest.log") ($SECONDS s)"
fi
if [ ! -f /tmp/bench-packed/manifest.json ]; then  # a warm machine keeps the data of the last call
  rm -rf /tmp/bench /tmp/bench-packed
  python3 scripts/make_imagenet_like.py /tmp/bench --images "$IMAGES" --classes 100 --photos .carry/photos 2>&1 | tail -1
  python3 -m recordtool.cli pack /tmp/bench /tmp/bench-packed --shards 16 -q
fi
echo "data ready ($SECONDS s)"
STEPS=${STEPS:-decode format gpu}
case " $STEPS " in *" decode "*) fits decode 60 && {
  python3 scripts/bench_decode.py /tmp/bench-packed --images "$IMAGES" --threads "$(nproc)" \
    --json "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
  python3 scripts/bench_decode.py /tmp/bench-packed --images 2048 --threads 1 --repeat 2 \
    --json "$OUT/bench_decode_1t.json" > "$OUT/bench_decode_1t.log" 2>&1; } ;; esac
case " $STEPS " in *" decode16 "*) fits decode16 60 && {
  python3 scripts/bench_decode.py /tmp/bench-packed --images "$IMAGES" --threads "$(nproc)" \
    --json "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
  python3 scripts/bench_decode.py /tmp/bench-packed --images "$IMAGES" --threads "$(nproc)" --batch 1024 \
    --json "$OUT/bench_decode_b1024.json" > "$OUT/bench_decode_b1024.log" 2>&1; } ;; esac
case " $STEPS " in *" format "*) fits format 40 &&
  python3 scripts/bench_format.py /tmp/bench /tmp/bench-packed --json "$OUT/bench_format.json" \
    > "$OUT/bench_format.log" 2>&1 ;; esac
case " $STEPS " in *" gpu "*) fits gpu 150 &&
  timeout 300 python3 scripts/bench_gpu.py /tmp/bench-packed --epochs "${EPOCHS:-2}" ${GPU_ARGS:-} \
    --json "$OUT/bench_gpu.json" > "$OUT/bench_gpu.log" 2>&1 ;; esac
case " $STEPS " in *" memory "*) fits memory 60 &&
  timeout 150 python3 scripts/bench_loader_memory.py /tmp/bench-packed --device cuda --epochs 10 \
    > "$OUT/loader_memory.log" 2>&1 ;; esac
case " $STEPS " in *" dist "*) fits dist 60 && {
  # ranks sharing the one GPU (gloo), then one rank alone for the per-rank reference
  for n in 2 1; do
    timeout 100 python3 -m torch.distributed.run --standalone --nproc_per_node=$n scripts/distributed_loader.py \
      /tmp/bench-packed --device cuda --epochs 2 >> "$OUT/dist.log" 2>&1
  done; } ;; esac
case " $STEPS " in *" loader "*) fits loader 100 &&
  for d in cpu cuda; do
    python3 -m recordtool.cli bench /tmp/bench-packed --device $d --epochs 2 --json "$OUT/bench_cli_$d.json" -q \
      > "$OUT/bench_cli_$d.log" 2>&1
  done ;; esac
case " $STEPS " in *" train "*) fits train 150 &&
  for cfg in "torchvision --data /tmp/bench" "recordtool --data /tmp/bench-packed --device cuda" \
             "recordtool --data /tmp/bench-packed --device cpu"; do
    timeout 120 python3 scripts/train_imagenet.py --loader $cfg --steps 40 --warmup 10 >> "$OUT/train.log" 2>&1
  done ;; esac
[ -f .carry/extra.sh ] && bash .carry/extra.sh > "$OUT/extra.log" 2>&1
echo "=================== results"
cat "$OUT"/bench_decode*.log "$OUT"/bench_format.log 2>/dev/null
grep -A20 "summary" "$OUT/bench_gpu.log" 2>/dev/null || tail -30 "$OUT/bench_gpu.log" 2>/dev/null
cat "$OUT"/bench_cli_*.log 2>/dev/null; grep "train_imagenet\|Error" "$OUT/train.log" 2>/dev/null
cat "$OUT/loader_memory.log" 2>/dev/null | tail -16
grep -E "epoch|rank|total|coverage|Error" "$OUT/dist.log" 2>/dev/null | tail -20
cat "$OUT/skipped.log" 2>/dev/null; echo "total $SECONDS s"
grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT/pytest.log" | tail -12
[ -f "$OUT/extra.log" ] && tail -20 "$OUT/extra.log"
# only a few files come back from the machine: one archive of every log and JSON
rc=0; grep -q " failed" "$OUT/pytest.log" 2>/dev/null && rc=1
(cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=run.log . ; find . -type f ! -name all.tgz ! -name run.log -delete)
exit $rc
