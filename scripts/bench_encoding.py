#!/usr/bin/env python3
"""Which JPEG encoding decodes fastest in recordtool's CPU decoder (RandomResizedCrop, 224²)?

  bench_encoding.py FOLDER [--images 400] [--max-side 384] [--quality 90] [--threads T] [--repeat 3]

The same pixels (each image shrunk to --max-side as `pack --max-side` does) are encoded by
Pillow's libjpeg-turbo in several ways; each set is then decoded with the fused CPU decoder
(`decode_crop_resize`, the Loader's CPU path) under the same RandomResizedCrop windows, best of
--repeat. Variants: baseline 4:2:0 (what pack writes), progressive, 4:4:4, 4:2:2, optimized
Huffman tables, restart markers every MCU row. Plus the ceiling of any restart-marker scheme:
the decoder starting at the window's first MCU row — measured by decoding the same encoding
of only the rows from there down, with the window moved up accordingly.
"""
import argparse
import glob
import io
import os
import sys
import time

import numpy as np
from PIL import Image

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
from recordtool.decode import decode_crop_resize, random_windows  # noqa: E402

VARIANTS = {
    "baseline 4:2:0 (pack's re-encode)": dict(subsampling=2),
    "progressive 4:2:0": dict(subsampling=2, progressive=True),
    "baseline 4:4:4": dict(subsampling=0),
    "baseline 4:2:2": dict(subsampling=1),
    "baseline 4:2:0 optimized Huffman": dict(subsampling=2, optimize=True),
    "baseline 4:2:0 restart every MCU row": dict(subsampling=2, restart_marker_rows=1),
}


def rate(datas, win, threads, repeat, batch=128):
    """(img/s, img per CPU second), each the best of `repeat` passes. CPU time counts every
    thread of this process, so it moves less than wall time when other processes share the
    machine."""
    out = np.empty((batch, 224, 224, 3), np.uint8)
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        for s in range(0, len(datas), batch):
            e = min(len(datas), s + batch)
            decode_crop_resize(datas[s:e], win[s:e], threads=threads, out=out[: e - s])
        best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.process_time() - c)
    return len(datas) / best, len(datas) / best_cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--max-side", type=int, default=384)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.folder, "*", "*")))
    files = [files[i] for i in np.random.default_rng(0).permutation(len(files))[: a.images]]
    pixels = []
    for f in files:
        try:
            im = Image.open(f).convert("RGB")
        except Exception:
            continue
        s = a.max_side / max(im.size)
        if s < 1:
            im = im.resize((max(1, round(im.width * s)), max(1, round(im.height * s))), Image.BILINEAR)
        pixels.append(im)
    n = len(pixels)
    ids = np.arange(n)
    w = np.array([p.width for p in pixels])
    h = np.array([p.height for p in pixels])
    win = random_windows(w, h, ids, 0, 0)
    print(f"bench_encoding: {n} images from {a.folder}, shrunk to ≤ {a.max_side} px, quality {a.quality}, "
          f"{a.threads} threads, RRC 224², best of {a.repeat}")
    sets = {}
    for name, opts in VARIANTS.items():
        datas = []
        for im in pixels:
            b = io.BytesIO()
            im.save(b, "JPEG", quality=a.quality, **opts)
            datas.append(b.getvalue())
        sets[name] = datas
    base = None
    for name, datas in sets.items():
        r, rc = rate(datas, win, a.threads, a.repeat)
        base = base or (r, rc)
        print(f"  {name:<40} {np.mean([len(d) for d in datas]) / 1e3:6.1f} KB  {r:8,.0f} img/s {r / base[0]:5.2f}x"
              f"  {rc:8,.0f} img/CPU-s {rc / base[1]:5.2f}x")
    # ceiling of restart-marker skipping: decode starts at the window's first MCU row, i.e.
    # the same encoding of the rows from there down
    datas = sets["baseline 4:2:0 (pack's re-encode)"]
    cropped, moved = [], win.astype(np.float64).copy()
    for k, (d, im) in enumerate(zip(datas, pixels)):
        y0 = int(win[k, 0]) // 16 * 16  # 4:2:0: MCU rows of 16 pixels
        if y0 > 0:
            b = io.BytesIO()
            im.crop((0, y0, im.width, im.height)).save(b, "JPEG", quality=a.quality, subsampling=2)
            d = b.getvalue()
        cropped.append(d)
        moved[k, 0] -= y0
    (r0, c0), (r1, c1) = rate(datas, win, a.threads, a.repeat), rate(cropped, moved, a.threads, a.repeat)
    frac = np.mean(win[:, 0] / h)
    print(f"  rows above the window: {frac * 100:.1f} % of the image on average; decoding from the window's "
          f"first MCU row: {r1:,.0f} against {r0:,.0f} img/s ({r1 / r0:.2f}x), {c1:,.0f} against {c0:,.0f} "
          f"img/CPU-s ({c1 / c0:.2f}x): the most restart markers could give")


if __name__ == "__main__":
    main()
