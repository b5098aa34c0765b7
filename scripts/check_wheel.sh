#!/usr/bin/env bash
# Does a platform wheel work where the system has no libjpeg-turbo? Installs WHEEL into a new
# venv, then — in a private mount namespace (unshare -m: other processes of the machine keep
# their libraries) with Debian's libjpeg.so.62 and libturbojpeg.so.0 covered by /dev/null and
# LD_LIBRARY_PATH unset — shows ldd of the native decoder, packs a generated folder (plain and
# transcoding, the latter through the native decoder and PyTurboJPEG's encoder), and runs a CPU
# Loader epoch, checking that the native decoder and the wheel's libraries are the ones loaded.
# Usage: bash scripts/check_wheel.sh WHEEL [PYTHON]   (root, for unshare and mount)
set -euo pipefail
whl=$(realpath "$1"); py=${2:-python3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$whl" > "$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
export WORK=$work
unshare -m bash -euo pipefail -c '
hidden=()
for lib in libjpeg.so.62 libturbojpeg.so.0; do
  for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
    [ -e "$d/$lib" ] || continue
    f=$(realpath "$d/$lib")
    case " ${hidden[*]:-} " in *" $f "*) continue ;; esac
    mount --bind /dev/null "$f" && hidden+=("$f")
  done
done
echo "hidden (bound to /dev/null in this namespace): ${hidden[*]:-none found}"
unset LD_LIBRARY_PATH
cd "$WORK"
py=$WORK/venv/bin/python
for lib in libjpeg.so.62 libturbojpeg.so.0; do
  echo "system $lib: $($py -c "import ctypes; ctypes.CDLL(\"$lib\"); print(\"LOADS\")" 2>&1 | tail -1)"
done
so=$(ls venv/lib/python3*/site-packages/recordtool/_native*.so)
echo "ldd $so:"; ldd "$so" | grep -E "jpeg|not found"
$py - <<EOF
import io, os
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for c in range(3):
    os.makedirs(f"src/c{c}")
    for i in range(20):
        a = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        Image.fromarray(a).resize((320, 240), Image.BICUBIC).save(f"src/c{c}/{i}.jpg", quality=90)
EOF
venv/bin/recordtool pack src packed --shards 2 -q
venv/bin/recordtool pack src packed-small --max-side 128 --quality 85 --shards 2 -q
venv/bin/recordtool verify packed-small --decode | tail -1
$py - <<EOF
import os
import recordtool
from recordtool import _bundled, codec
from recordtool.decode import cpu

assert cpu.native_available() and not cpu._python_decoder
n = 0
for packed in ("packed", "packed-small"):
    loader = recordtool.Loader(packed, batch_size=16, device="cpu", train=True, seed=0)
    loader.set_epoch(0)
    for images, labels in loader:
        n += len(labels)
codec.turbojpeg()
libs = os.path.realpath(_bundled.LIBS)
maps = {l.split()[-1] for l in open("/proc/self/maps") if "jpeg" in l.split()[-1]}
print("recordtool:", recordtool.__file__)
print("jpeg libraries mapped:", sorted(maps))
ours = {os.path.basename(p).split("-")[0] for p in maps if os.path.realpath(p).startswith(libs + os.sep)}
assert ours == {"libjpeg", "libturbojpeg"}, maps  # (pillow.libs/ holds the libjpeg of Pillow: not ours)
assert not any(p.startswith(("/usr/", "/lib")) for p in maps), maps
print(f"Loader on the CPU, native decoder: an epoch of each dataset, {n} images; last batch {tuple(images.shape)} {images.dtype}")
EOF
'
echo "OK: $(basename "$whl") ($(stat -c %s "$whl" | awk '{printf "%.2f MB", $1 / 1e6}'))"
