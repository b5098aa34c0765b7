#!/usr/bin/env python3
"""CPU decode benchmark: the fused native op against Pillow baselines, same data, same cores.

  bench_decode.py PACKED [--images N] [--batch 256] [--threads T] [--json FILE]

All three read JPEG bytes from the same packed dataset (page cache warm) and produce 224×224:
- fused:   recordtool.decode.decode_crop_resize (native, T threads) with RandomResizedCrop windows
- (a)      Pillow decode + torchvision-rule RandomResizedCrop + resize(BILINEAR), T processes
- (b)      bare full decode, no crop/resize: Pillow in T threads (and OpenCV when importable)
BENCHMARKS.md gives the results and the goals they are read against.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
import recordtool  # noqa: E402
from recordtool.tools.bench import best_of, pil_rrc_rate  # noqa: E402
from recordtool.decode import decode_crop_resize, native_available, random_windows  # noqa: E402

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ds = recordtool.open(a.packed)
    n = min(a.images, len(ds))
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(ds))[:n]
    bufs = [ds[int(i)][0] for i in idx]
    for b in bufs:  # page cache warm
        bytes(b)
    win = random_windows(ds.index.width[idx], ds.index.height[idx], idx, seed=0, epoch=0)
    T = a.threads or recordtool.decode.cpu.cores()
    out = np.empty((a.batch, 224, 224, 3), np.uint8)

    def fused():
        for s in range(0, n, a.batch):
            e = min(n, s + a.batch)
            decode_crop_resize(bufs[s:e], win[s:e], threads=T, out=out[: e - s], on_error="skip")

    fused()  # warm the pool
    t_fused = best_of(fused, a.repeat)

    from PIL import Image

    def pil_full(b):
        Image.open(io.BytesIO(b)).convert("RGB")

    with ThreadPoolExecutor(T) as ex:
        t_full_pil = best_of(lambda: list(ex.map(pil_full, bufs, chunksize=16)), a.repeat)
    t_full_cv = None
    try:
        import cv2

        cv2.setNumThreads(1)

        def cv_full(b):
            cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)

        with ThreadPoolExecutor(T) as ex:
            t_full_cv = best_of(lambda: list(ex.map(cv_full, bufs, chunksize=16)), a.repeat)
    except ImportError:
        pass

    t_pil = n / pil_rrc_rate(a.packed, idx, win, T, a.repeat)

    rate = lambda t: n / t  # noqa: E731
    full_best = min(t for t in (t_full_pil, t_full_cv) if t)
    commit = os.environ.get("RECORDTOOL_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    r = {
        "machine": f"{platform.node()} {os.cpu_count()} cpu", "commit": commit, "threads": T, "images": n,
        "mean_jpeg_kb": float(np.mean([len(b) for b in bufs]) / 1e3), "native": native_available(),
        "fused_img_s": rate(t_fused), "pil_rrc_procs_img_s": rate(t_pil),
        "pil_full_decode_threads_img_s": rate(t_full_pil),
        "cv2_full_decode_threads_img_s": rate(t_full_cv) if t_full_cv else None,
        "fused_over_pil_rrc": t_pil / t_fused, "fused_over_best_full_decode": full_best / t_fused,
    }
    print(f"\nbench_decode: {n} images ({r['mean_jpeg_kb']:.0f} KB mean), {T} threads/procs, "
          f"{r['machine']}, commit {commit}, native={r['native']}")
    rows = [("fused decode+crop+resize (recordtool)", rate(t_fused)),
            ("(a) Pillow decode+RRC, process pool", rate(t_pil)),
            ("(b) Pillow full decode, threads", rate(t_full_pil))]
    if t_full_cv:
        rows.append(("(b) OpenCV full decode, threads", rate(t_full_cv)))
    for name, v in rows:
        print(f"  {name:<40} {v:>9,.0f} img/s")
    print(f"  fused / (a) = {r['fused_over_pil_rrc']:.2f}x   fused / best (b) = {r['fused_over_best_full_decode']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
