#!/usr/bin/env bash
# One call on the GPU machine (no network): install the carried wheels — recordtool's own cp312
# platform wheel among them (native decoder and libjpeg-turbo inside: nothing is compiled) —
# then the steps asked for. Logs and JSON go to $OUT (one archive); a short table is printed last.
#   carry: .whl (recordtool's wheel and the ones the machine lacks) and .carry (scripts/prepare_device_carry.sh), and for DALI one part per call:
#          .dali/dali-part-N, and .dali/dali-extra once (../shared/tools/dali_carry.sh .dali). Parts
#          and extras are kept in /tmp while the machine stays warm; with all three parts there,
#          DALI is assembled and imported by every benchmark. A chained call on a warm machine may
#          leave .whl and .carry behind (set RECORDTOOL_COMMIT): e.g. call 1 [.whl, .carry,
#          .dali/dali-part-0], call 2 [.dali/dali-part-1, .dali/dali-extra], call 3 [.dali/dali-part-2].
#   steps: STEPS="tests datafast trainbench traincpu trainddp data384 transcode fidelity gpu gpu384 loader loader384 dist memory train decode format tune presets raypack ops"
#   numba: .numba (NUMBA=1 scripts/prepare_device_carry.sh, ~45 MB) is installed into /tmp/site and
#          kept while the machine stays warm: carry [".whl", ".carry", ".numba"] once (or ".numba"
#          alone on a warm machine), before or without the DALI parts
#   ops:   recordtool bench --op OP (OPS, default "jitter cutout grayscale") on each of OPS_DEVICES
#          (default "cuda cpu"): the Loader without the op, with it compiled (recordtool.ops) and as a
#          batch op, rounds interleaved, and DALI with its own op where DALI is assembled; on
#          OPS_IMAGES (4096) records, OPS_EPOCHS (4: a warm-up and 3 rounds); needs Numba (.numba)
#   raypack: pack --engine ray against --engine local on CORES_PER_GPU cores; needs .rayc too
#          (RAY=1 scripts/prepare_device_carry.sh), e.g. carry [".whl", ".carry", ".rayc"]
#   TREE=old: the steps run the library of a carried .old folder (an older commit's recordtool/,
#          `git archive COMMIT recordtool | tar -x -C .old`), kept in /tmp/old while warm: an A/B
#          (carry [".whl", ".carry", ".old"]; alternate the two in one command, each run named by
#          TRAIN_TAG, e.g. `for r in 1 2; do STEPS=trainbench TRAIN_TAG=_new$r bash scripts/device_run.sh;
#          TREE=old STEPS=trainbench TRAIN_TAG=_old$r bash scripts/device_run.sh; done`; each
#          invocation archives $OUT as all.tgz, all.1.tgz, …)
#   a step is skipped when fewer than its estimated seconds are left of DEADLINE (default 570 s)
#   GPUS: for "dist" — ranks of the several-GPU run (default: all GPUs; one rank per GPU, pinned
#   to its share of the cores), after the one-GPU reference (one rank pinned to CORES_PER_GPU cores)
set -uo pipefail
DEADLINE=${DEADLINE:-570}
fits() {  # fits NAME SECONDS: is there time left for this step?
  if (( SECONDS + $2 > DEADLINE )); then echo "SKIPPED $1 (needs ~$2 s, $((DEADLINE - SECONDS)) s left)" | tee -a "$OUT/skipped.log"; return 1; fi
}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"  # exported: TUNE_CMD may name $OUT
IMAGES=${IMAGES:-8192}
STEPS=${STEPS:-tests gpu}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# no .git travels: the caller writes the commit to .carry/commit (git rev-parse --short HEAD)
[ -f .carry/commit ] && export RECORDTOOL_COMMIT=$(cat .carry/commit)
[ -n "${RECORDTOOL_COMMIT:-}" ] && echo "$RECORDTOOL_COMMIT" > /tmp/commit
[ -z "${RECORDTOOL_COMMIT:-}" ] && [ -f /tmp/commit ] && export RECORDTOOL_COMMIT=$(cat /tmp/commit)
# a warm machine keeps /tmp: a later call of a chain may leave .whl / .carry behind (64 MiB a call)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
elif [ ! -d /tmp/site ]; then echo "no .whl carried and no /tmp/site from an earlier call"; exit 1; fi
# the installed wheel, never the tree: PYTHONSAFEPATH keeps `python3 -m`/`-c` (and scripts) from
# putting the working directory (this tree's recordtool/, with no compiled part) first on sys.path
export PYTHONPATH=/tmp/site PYTHONSAFEPATH=1
# Numba (the compiled user ops): llvmlite unpacked from its archive, numba from its wheel
if [ -f .numba/llvmlite-cp312.tar.xz ] && [ ! -f /tmp/site/.numba-done ]; then
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall('/tmp/site', filter='data')" \
    .numba/llvmlite-cp312.tar.xz || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .numba/numba-*.whl \
    || exit 1
  touch /tmp/site/.numba-done
fi
# DALI: stash this call's part (and the extras folder) in /tmp; assemble once all three parts are there
mkdir -p /tmp/dali-parts; cp .dali/dali-part-* /tmp/dali-parts/ 2>/dev/null
[ -d .dali/dali-extra ] && [ ! -d /tmp/dali-extra ] && cp -r .dali/dali-extra /tmp/dali-extra
if [ -d /tmp/dali-extra ]; then export LD_LIBRARY_PATH=/tmp/dali-extra:${LD_LIBRARY_PATH:-}; fi
if [ ! -d /tmp/dali/nvidia/dali ] && [ "$(ls /tmp/dali-parts 2>/dev/null | wc -l)" = 3 ] && [ -d /tmp/dali-extra ]; then
  mkdir -p /tmp/dali && cat /tmp/dali-parts/dali-part-* | /tmp/dali-extra/zstd -d -q | tar x -C /tmp/dali
  /tmp/dali-extra/zstd -d -q -c /tmp/dali-extra/nvimgcodec.tar.zst | tar x -C /tmp/dali
  python3 -m pip install -q --no-index --no-deps --target /tmp/dali-deps /tmp/dali-extra/*.whl
fi
[ -d /tmp/dali/nvidia/dali ] && export PYTHONPATH=$PYTHONPATH:/tmp/dali:/tmp/dali-deps
echo "parts: $(ls /tmp/dali-parts | tr '\n' ' ')"
nproc; nvidia-smi -L; python3 -c "import numpy, PIL, cv2, torch; print('numpy', numpy.__version__, 'PIL', PIL.__version__, 'cv2', cv2.__version__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())"
python3 -c "import nvidia.dali as d; print('DALI', d.__version__)" 2>/dev/null || echo "DALI not assembled"
python3 -c "import numba; print('numba', numba.__version__)" 2>/dev/null || echo "numba not installed (carry .numba)"
python3 -c "import recordtool; from recordtool import _native, _nvsubmit, _bundled; \
assert recordtool.__file__.startswith('/tmp/site/'), recordtool.__file__; \
print('recordtool', recordtool.__file__, 'native ok, libjpeg API', _native.LIBJPEG_VERSION, 'turbojpeg', _bundled.turbojpeg_path())" \
  || { echo "recordtool's wheel is not installed in /tmp/site (carry .whl: scripts/prepare_device_carry.sh)"; exit 1; }
# A/B on one machine: a carried .old (git archive OLDER recordtool | tar -x -C .old) is kept in
# /tmp/old; with TREE=old the steps run that library (with the installed wheel's native part) instead
PY=python3
if [ -d .old/recordtool ]; then rm -rf /tmp/old && cp -r .old /tmp/old; fi
if [ "${TREE:-}" = old ]; then
  [ -d /tmp/old/recordtool ] || { echo "TREE=old: no .old carried on this machine"; exit 1; }
  cp /tmp/site/recordtool/_native*.so /tmp/site/recordtool/_nvsubmit*.so /tmp/old/recordtool/ \
    && rm -rf /tmp/old/recordtool.libs && cp -r /tmp/site/recordtool.libs /tmp/old/ && cp -r native /tmp/old/ \
    && export PYTHONPATH=/tmp/old:$PYTHONPATH
  PY="python3 -P"  # -P: `-m` does not put the working directory (this tree) ahead of PYTHONPATH
  $PY -c "import recordtool, sys; assert recordtool.__file__.startswith('/tmp/old'), recordtool.__file__" || exit 1
  echo "library: the older tree (/tmp/old)"
fi
if has tests && fits tests 520; then
  # the whole suite, never -x: a failure must not hide what comes after it (the GPU rule, README)
  # the GPU suite: every test file that runs the decoders, the Loader or the native part
  GPU_SUITE="tests/test_install.py tests/gpu tests/test_gpu_plan.py tests/test_gpu_reference.py tests/test_gpu_roi.py tests/test_gpu_scaling.py tests/test_lightning.py tests/test_epochs.py tests/test_readme.py tests/test_loader.py tests/test_loader_stream.py tests/test_loader_api.py tests/test_torch.py tests/test_distributed.py tests/test_cli_user.py tests/test_nvsubmit.py tests/test_decode_cpu.py tests/test_ops.py"
  # -v: each test's name and outcome as it ends, so a run cut short by the timeout still says
  # which failed and where it stopped; -rfEs: the failures' and skips' reasons in the summary.
  # One process takes ~500 s on the H200; with pytest-xdist carried (.whl) the tests are spread
  # over TEST_WORKERS processes (default 4) sharing the GPU: each test still runs whole in one
  # process, so a test that depends on another's leftovers or collides with it fails here.
  # --durations: the slowest tests, to keep the suite inside one call
  par=""; python3 -c "import xdist" 2>/dev/null && par="-n ${TEST_WORKERS:-4} --dist load"
  echo "pytest workers: ${par:-one process}"
  RECORDTOOL_REQUIRE_NATIVE=1 RECORDTOOL_TEST_INSTALLED=1 timeout ${TESTS_TIMEOUT:-560} python3 -m pytest -v -p no:cacheprovider -rfEs --durations=15 $par ${PYTEST_ARGS:-$GPU_SUITE} \
    > "$OUT/pytest.log" 2>&1
  rc=$?; (( rc == 124 )) && echo "pytest: TIMED OUT after ${TESTS_TIMEOUT:-560} s (raise TESTS_TIMEOUT)" | tee -a "$OUT/pytest.log"
  echo "pytest: $(tail -1 "$OUT/pytest.log") ($SECONDS s)"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest.log" | head -40
fi
if [ ! -f /tmp/bench-packed/manifest.json ]; then  # a warm machine keeps the data of the last call
  rm -rf /tmp/bench /tmp/bench-packed
  python3 scripts/make_imagenet_like.py /tmp/bench --images "$IMAGES" --classes 100 --photos .carry/photos 2>&1 | tail -1
  python3 -m recordtool.cli pack /tmp/bench /tmp/bench-packed --shards 16 -q
fi
if { has gpu384 || has loader384 || has data384; } && [ ! -f /tmp/bench-384/manifest.json ]; then
  python3 -m recordtool.cli pack /tmp/bench /tmp/bench-384 --shards 16 --max-side 384 --quality 90 -q
fi
if has datafast && [ ! -f /tmp/bench-fast/manifest.json ]; then  # the fast preset's pack, for the training benchmark
  python3 -m recordtool.cli pack /tmp/bench /tmp/bench-fast --shards 16 --preset fast -q | tail -1
fi
echo "data ready ($SECONDS s)"
CORES=$(nproc); NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())")
CPG=${CORES_PER_GPU:-$((CORES / (NGPU > 0 ? NGPU : 1)))}
one_gpu() {  # run a command as on the one-GPU machine: GPU 0 and CPG cores
  if (( NGPU > 1 )); then CUDA_VISIBLE_DEVICES=0 taskset -c 0-$((CPG - 1)) "$@"; else "$@"; fi
}
if has fidelity && fits fidelity $(( ${FID_BUDGET:-230} + 10 )); then  # each GPU chroma mode's pixels and speed
  one_gpu timeout 250 bash scripts/fidelity_device.sh > "$OUT/fidelity.log" 2>&1
fi
if has gpu && fits gpu 150; then
  one_gpu timeout 300 python3 benchmarks/bench_gpu.py /tmp/bench-packed --epochs "${EPOCHS:-3}" ${GPU_ARGS:-} \
    --json "$OUT/bench_gpu.json" > "$OUT/bench_gpu.log" 2>&1
fi
if has gpu384 && fits gpu384 120; then
  one_gpu timeout 240 python3 benchmarks/bench_gpu.py /tmp/bench-384 --epochs "${EPOCHS:-3}" ${GPU384_ARGS:---producers 4 --splits auto --hybrid on} \
    --json "$OUT/bench_gpu_384.json" > "$OUT/bench_gpu_384.log" 2>&1
fi
if has loader && fits loader 120; then
  for d in ${LOADER_DEVICES:-cpu cuda}; do
    one_gpu timeout 200 python3 -m recordtool.cli bench /tmp/bench-packed --device $d --epochs 3 --dali-files /tmp/bench \
      ${LOADER_ARGS:-} --json "$OUT/bench_cli_$d.json" -q > "$OUT/bench_cli_$d.log" 2>&1
  done
fi
if has loader384 && fits loader384 100; then
  for d in ${LOADER_DEVICES:-cpu cuda}; do
    one_gpu timeout 200 python3 -m recordtool.cli bench /tmp/bench-384 --device $d --epochs 3 --dali-files /tmp/bench \
      --json "$OUT/bench_cli_384_$d.json" -q > "$OUT/bench_cli_384_$d.log" 2>&1
  done
fi
if has tune && fits tune 150; then
  one_gpu timeout 240 bash -c "${TUNE_CMD:-echo no TUNE_CMD}" > "$OUT/tune.log" 2>&1
fi
if has presets && fits presets 200; then
  # transcoding pack against workers (1, then every core), then each speed preset through
  # recordtool bench with DALI on the original files
  for w in 1 "$CPG"; do
    rm -rf /tmp/bench-t
    echo "pack --max-side 384 --quality 90 --workers $w: $(one_gpu python3 -m recordtool.cli pack /tmp/bench /tmp/bench-t \
      --max-side 384 --quality 90 --workers "$w" -q | tail -1)" >> "$OUT/presets.log"
  done
  for p in ${PRESETS:-fast balanced}; do
    [ -f "/tmp/bench-$p/manifest.json" ] || echo "$p: $(one_gpu python3 -m recordtool.cli pack /tmp/bench "/tmp/bench-$p" \
      --preset "$p" --shards 16 -q | tail -1)" >> "$OUT/presets.log"
    one_gpu timeout 200 python3 -m recordtool.cli bench "/tmp/bench-$p" --device cuda --epochs 3 --dali-files /tmp/bench \
      --json "$OUT/bench_cli_preset_$p.json" -q > "$OUT/bench_cli_preset_$p.log" 2>&1
  done
fi
if has transcode && fits transcode 60; then
  # transcoding pack on one worker and on every core of a GPU (default engine: process), same 4096 files
  rm -rf /tmp/bench-sub /tmp/bench-t; python3 - <<'PY'
import os
src, dst, n = "/tmp/bench", "/tmp/bench-sub", 0
for cls in sorted(os.listdir(src)):
    os.makedirs(f"{dst}/{cls}")
    for name in sorted(os.listdir(f"{src}/{cls}"))[:41]:
        os.link(f"{src}/{cls}/{name}", f"{dst}/{cls}/{name}")
PY
  for w in 1 "$CPG"; do
    echo "pack --max-side 384 --quality 90 --workers $w: $(one_gpu python3 -m recordtool.cli pack /tmp/bench-sub /tmp/bench-t \
      --max-side 384 --quality 90 --workers "$w" -q | tail -1)" >> "$OUT/transcode.log"; rm -rf /tmp/bench-t
  done
fi
if has dist && fits dist 90; then
  G=${GPUS:-$NGPU}
  # the one-GPU reference: one rank, GPU 0, CPG cores; then G ranks, one GPU and CPG cores each
  CUDA_VISIBLE_DEVICES=0 taskset -c 0-$((CPG - 1)) timeout 150 python3 -m torch.distributed.run --standalone \
    --nproc_per_node=1 examples/distributed_loader.py /tmp/bench-packed --device cuda --epochs ${DIST_EPOCHS:-8} \
    --json "$OUT/dist_1.json" > "$OUT/dist_1.log" 2>&1
  taskset -c 0-$((CPG * G - 1)) timeout 200 python3 -m torch.distributed.run --standalone --nproc_per_node=$G \
    examples/distributed_loader.py /tmp/bench-packed --device cuda --epochs ${DIST_EPOCHS:-8} --resume-check \
    --json "$OUT/dist_$G.json" > "$OUT/dist_$G.log" 2>&1
fi
if has memory && fits memory 60; then
  for d in ${MEM_DEVICES:-cuda}; do
    one_gpu timeout 150 python3 benchmarks/bench_loader_memory.py /tmp/bench-packed --device $d --epochs ${MEM_EPOCHS:-10} \
      > "$OUT/loader_memory_$d.log" 2>&1
  done
fi
if has train && fits train 150; then
  for cfg in "torchvision --data /tmp/bench" "recordtool --data /tmp/bench-packed --device cuda" \
             "recordtool --data /tmp/bench-packed --device cpu"; do
    one_gpu timeout 120 python3 examples/train_imagenet.py --loader $cfg --steps 40 --warmup 10 >> "$OUT/train.log" 2>&1
  done
fi
if has trainbench && fits trainbench 150; then
  # end-to-end training throughput (recordtool.tools.train_bench): each TRAIN_CONFIGS entry arch:batch at
  # each TRAIN_CORES count (e.g. "16 8 4": --cores N pins the process to the first N of one_gpu's cores,
  # its threads following; unset: one run on all of them, without --cores, which a TREE=old tree may not
  # know). DALI runs at each TRAIN_DALI_LOAD (--dali-load; default on cuda 0.65,0.75,0.9,0.99), the
  # best is the reference. TRAIN_EST: the seconds one arch at one core count is expected to take
  for n in ${TRAIN_CORES:-all}; do
    c=""; tag=""; [ "$n" != all ] && { c="--cores $n"; tag="_c$n"; }
    for cfg in ${TRAIN_CONFIGS:-resnet18:512 resnet50:256}; do
      a=${cfg%%:*}; b=${cfg##*:}
      fits "trainbench $a $n" ${TRAIN_EST:-60} || break 2
      one_gpu timeout ${TRAIN_TIMEOUT:-300} $PY -m recordtool.tools.train_bench ${TRAIN_DATA:-/tmp/bench-packed} --files /tmp/bench \
        --arch "$a" --batch "$b" --repeats ${TRAIN_REPEATS:-3} --steps ${TRAIN_STEPS:-50} --warmup ${TRAIN_WARMUP:-15} $c \
        ${TRAIN_DALI_LOAD:+--dali-load "$TRAIN_DALI_LOAD"} \
        --pipelines "${TRAIN_PIPELINES:-synthetic;recordtool;synthetic+recordtool;dali;torchvision}" ${TRAIN_ARGS:-} \
        --json "$OUT/train_bench_${a}_${b}${tag}${TRAIN_TAG:-}.json" > "$OUT/train_bench_${a}_${b}${tag}${TRAIN_TAG:-}.log" 2>&1
    done
  done
fi
if has traincpu && fits traincpu 60; then
  # the CPU form on 2 of the cores (the dev machine's shape): a consumer spending CPU_MS of CPU per batch of 128
  taskset -c 0-1 timeout 240 python3 -m recordtool.tools.train_bench /tmp/bench-packed --files /tmp/bench --device cpu \
    --batch 128 --size 224 --threads 2 --consumer-ms ${CPU_MS:-60} --repeats ${TRAIN_REPEATS:-3} --steps ${CPU_STEPS:-20} \
    --warmup 4 --pipelines "${CPU_PIPELINES:-synthetic;recordtool;dali}" --json "$OUT/train_bench_cpu2.json" \
    > "$OUT/train_bench_cpu2.log" 2>&1
fi
if has trainddp && fits trainddp 120; then
  # the training benchmark's DDP form: G ranks (one GPU and CPG cores each), then the one-GPU reference
  G=${GPUS:-$NGPU}
  for g in 1 "$G"; do
    taskset -c 0-$((CPG * g - 1)) timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=$g \
      -m recordtool.tools.train_bench ${TRAIN_DATA:-/tmp/bench-packed} --files /tmp/bench --ddp --arch ${DDP_ARCH:-resnet18} \
      --batch ${DDP_BATCH:-512} --repeats ${TRAIN_REPEATS:-2} --steps ${TRAIN_STEPS:-50} --warmup ${TRAIN_WARMUP:-15} \
      --pipelines "${DDP_PIPELINES:-synthetic;recordtool;dali}" --json "$OUT/train_ddp_$g.json" > "$OUT/train_ddp_$g.log" 2>&1
    [ "$g" = "$G" ] && break
  done
fi
if has decode && fits decode 60; then
  one_gpu python3 benchmarks/bench_decode.py /tmp/bench-packed --images "$IMAGES" --json "$OUT/bench_decode.json" \
    > "$OUT/bench_decode.log" 2>&1
fi
if has format && fits format 40; then
  one_gpu python3 benchmarks/bench_format.py /tmp/bench /tmp/bench-packed --json "$OUT/bench_format.json" \
    > "$OUT/bench_format.log" 2>&1
fi
if has raypack && fits raypack 240; then
  # Ray in its own folder, on the path of this step only (its dependencies must not shadow the others')
  if [ ! -d /tmp/site-ray/ray ]; then
    python3 -c "import tarfile; tarfile.open('.rayc/ray-cp312.tar.xz').extractall('/tmp/site-ray', filter='data')"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-ray .rayc/*.whl
  fi
  PYTHONPATH=/tmp/site-ray:$PYTHONPATH timeout 400 python3 benchmarks/bench_ray_pack.py /tmp/bench --cores "$CPG" \
    --replicate "${REPLICATE:-8}" --repeat "${RAY_REPEAT:-2}" --max-side 256 --json "$OUT/bench_ray_pack.json" > "$OUT/bench_ray_pack.log" 2>&1
fi
if has ops && ! python3 -c "import numba" 2>/dev/null; then
  echo "SKIPPED ops (numba does not import: carry .numba, NUMBA=1 scripts/prepare_device_carry.sh)" | tee -a "$OUT/skipped.log"
elif has ops && fits ops 80; then
  # compiled per-image ops: each op on each device beside the Loader without it
  for op in ${OPS:-jitter cutout grayscale}; do
    for d in ${OPS_DEVICES:-cuda cpu}; do
      fits "ops $op $d" 75 || break 2
      one_gpu timeout 200 $PY -m recordtool.cli bench /tmp/bench-packed --device $d --epochs ${OPS_EPOCHS:-4} \
        --images ${OPS_IMAGES:-4096} --no-baseline --op $op --json "$OUT/bench_op_${op}_$d.json" -q \
        > "$OUT/bench_op_${op}_$d.log" 2>&1 || echo "ops $op $d: exit $? (see bench_op_${op}_$d.log)"
    done
  done
fi
[ -f .carry/extra.sh ] && bash .carry/extra.sh > "$OUT/extra.log" 2>&1
echo "=================== results"
grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$OUT/pytest.log" 2>/dev/null | tail -15
sed -n '/^=================== fidelity/,$p' "$OUT/fidelity.log" 2>/dev/null | head -90
for f in "$OUT"/bench_gpu*.log; do [ -f "$f" ] && { echo "--- $f"; grep -A25 "summary" "$f" || tail -30 "$f"; }; done
cat "$OUT"/bench_cli_*.log 2>/dev/null
for f in "$OUT"/bench_op_*.log; do [ -f "$f" ] && grep -E "^recordtool bench|  \+ |Error|Traceback" "$f" | tail -8 | sed "s|^|$(basename "$f"): |"; done
for f in "$OUT"/dist_*.log; do [ -f "$f" ] && { echo "--- $f"; grep -E "epoch|rank|total|coverage|resume|Error" "$f" | tail -24; }; done
for f in "$OUT"/loader_memory_*.log; do [ -f "$f" ] && { echo "--- $f"; tail -16 "$f"; }; done; grep "train_imagenet\|Error" "$OUT/train.log" 2>/dev/null
for f in "$OUT"/train_ddp_*.log; do [ -f "$f" ] && { echo "--- $f"; sed -n '/^DDP training/,$p' "$f"; grep -E "Error" "$f" | tail -3; }; done
for f in "$OUT"/train_bench_*.log; do [ -f "$f" ] && { echo "--- $f"; sed -n '/^training throughput/,$p' "$f"; grep -E "Error|Traceback" "$f" | tail -3; }; done
cat "$OUT"/bench_decode.log "$OUT"/bench_format.log "$OUT/tune.log" 2>/dev/null | tail -40
cat "$OUT/presets.log" "$OUT/transcode.log" 2>/dev/null
tail -8 "$OUT/bench_ray_pack.log" 2>/dev/null
cat "$OUT/skipped.log" 2>/dev/null; echo "total $SECONDS s"
[ -f "$OUT/extra.log" ] && tail -20 "$OUT/extra.log"
# only a few files come back from the machine: one archive of every log and JSON per run of this
# script (all.tgz, then all.1.tgz, … when one command runs it more than once, e.g. with TREE=old)
rc=0; grep -q " failed" "$OUT/pytest.log" 2>/dev/null && rc=1
(cd "$OUT" && k=0 && name=all.tgz && while [ -e "$name" ]; do k=$((k + 1)); name=all.$k.tgz; done \
  && tar czf "$name" --exclude='all.tgz' --exclude='all.*.tgz' . ; find . -type f ! -name 'all.tgz' ! -name 'all.*.tgz' -delete)
exit $rc
