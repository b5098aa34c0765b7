#!/usr/bin/env python3
"""Pack-time transcoding (--max-side) against an OpenCV decode → resize → encode converter.

  bench_transcode.py FOLDER [--images N] [--sides 128,256,384] [--quality 90]

Same images, one thread each, page cache warm. recordtool: header probe, DCT-domain scaled
decode (PyTurboJPEG scaling_factor) when shrinking ≥ 2×, antialiased resize, TurboJPEG
encode. OpenCV (what OneFlow's converter does): imdecode, resize INTER_AREA, imencode.
"""
import argparse
import glob
import os
import sys
import time

import numpy as np

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
from recordtool.pack.transcode import Transcode, prepare  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--sides", default="128,256,384,512")
    ap.add_argument("--quality", type=int, default=90)
    a = ap.parse_args()
    import cv2

    cv2.setNumThreads(1)
    files = sorted(glob.glob(os.path.join(a.folder, "*", "*")))[: a.images]
    datas = [open(f, "rb").read() for f in files]
    print(f"bench_transcode: {len(datas)} images, {np.mean([len(d) for d in datas]) / 1e3:.0f} KB mean, 1 thread")
    for side in [int(s) for s in a.sides.split(",")]:
        t = Transcode(max_side=side, quality=a.quality)
        s0 = time.perf_counter()
        n_ours = 0
        for d in datas:
            try:
                prepare(d, transcode=t)
                n_ours += 1
            except Exception:
                pass
        t_ours = time.perf_counter() - s0
        s0 = time.perf_counter()
        for d in datas:
            img = cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR)
            if img is None:
                continue
            h, w = img.shape[:2]
            if max(w, h) > side:
                s = side / max(w, h)
                img = cv2.resize(img, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)
            cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, a.quality])
        t_cv = time.perf_counter() - s0
        print(f"  --max-side {side:<4} recordtool {len(datas) / t_ours:7.0f} img/s   OpenCV {len(datas) / t_cv:7.0f} img/s"
              f"   ratio {t_cv / t_ours:.2f}x")


if __name__ == "__main__":
    main()
