#!/usr/bin/env python3
"""GPU vs CPU pixels on real photos: which images fall below a PSNR bound, and why.

  gpu_fidelity.py PHOTOS_DIR [--windows 24] [--json FILE]

Each photo is tried as it is and re-encoded (long side 500 / 1000 / full; 4:4:4, 4:2:2, 4:2:0;
progressive; gray). For RandomResizedCrop windows it compares, per image:
- gpu_vs_cpu: GPUDecoder(split="gpu") (engines / hybrid decoder) against the CPU fused decode,
- gpu_vs_truth, cpu_vs_truth: each against Pillow decode → crop → resize(BILINEAR),
- raw_vs_libjpeg: the GPU decoder's decoded window region itself (before resampling) against
  libjpeg-turbo's full decode cropped to the same region,
grouped by variant, route and the CPU's DCT scale; the worst cases are listed with details.
"""
from __future__ import annotations

import argparse
import collections
import glob
import io
import json
import os
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from recordtool import _native  # noqa: E402
from recordtool.decode import decode_crop_resize, random_windows  # noqa: E402
from recordtool.decode import reference as R  # noqa: E402
from recordtool.fidelity import psnr as _psnr  # noqa: E402
from recordtool.format.jpeg import probe  # noqa: E402


def psnr(a, b) -> float:
    return float(_psnr(np.asarray(a, np.uint8), np.asarray(b, np.uint8)))


def variants(path):
    data = open(path, "rb").read()
    yield "orig", data
    im = Image.open(io.BytesIO(data)).convert("RGB")
    for side in (500, 1000, None):
        x = im
        if side and max(im.size) > side:
            s = side / max(im.size)
            x = im.resize((round(im.width * s), round(im.height * s)), Image.BILINEAR)
        for name, kw in (("444", dict(subsampling=0)), ("422", dict(subsampling=1)), ("420", dict(subsampling=2)),
                         ("prog420", dict(subsampling=2, progressive=True))):
            b = io.BytesIO()
            x.save(b, "JPEG", quality=90, **kw)
            yield f"{side or 'full'}-{name}", b.getvalue()
        b = io.BytesIO()
        x.convert("L").save(b, "JPEG", quality=90)
        yield f"{side or 'full'}-gray", b.getvalue()


def main():
    import cupy

    from recordtool.decode.gpu import GPUDecoder, route
    from recordtool.decode.nvjpeg import HardwareDecoder, HybridDecoder
    from recordtool.decode.spec import OutputSpec

    ap = argparse.ArgumentParser()
    ap.add_argument("photos")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    tj = R._turbojpeg()
    from turbojpeg import TJPF_RGB

    dec = GPUDecoder(OutputSpec(224, dtype="uint8", layout="NHWC"), max_batch=a.windows, split="gpu")
    stream = cupy.cuda.Stream(non_blocking=True)
    hw = HardwareDecoder(1)
    hyb = HybridDecoder(stream.ptr)
    rows = []
    for k, path in enumerate(sorted(glob.glob(os.path.join(a.photos, "*.jpg")))):
        for vname, data in variants(path):
            info = probe(data)
            rt = int(route([info.chroma], [info.progressive], [info.colorspace])[0])
            W, H = info.width, info.height
            ids = np.arange(a.windows) + 1000 * k
            win = random_windows(np.full(a.windows, W), np.full(a.windows, H), ids, 0, 0)
            bufs = [data] * a.windows
            g = cupy.asnumpy(dec(bufs, win, np.zeros(a.windows, bool), np.full(a.windows, rt)))
            c = decode_crop_resize(bufs, win)
            full = tj.decode(data, pixel_format=TJPF_RGB)
            pil = Image.open(io.BytesIO(data)).convert("RGB")  # Pillow decode once, crop per window
            for i, (y, x, h, w) in enumerate(win):
                t = np.asarray(pil.crop((int(x), int(y), int(x + w), int(y + h))).resize((224, 224), Image.BILINEAR))
                m = _native.choose_scale(float(w), float(h), 224, 224, R.SCALE_MARGIN, R.min_scale(data))
                raw = None
                if i < 4 and rt in (0, 1):  # the decoded region itself, before resampling
                    region = cupy.zeros((int(h), int(w), 3), np.uint8)
                    d = hw if rt == 0 else hyb
                    with cupy.cuda.Device(0):
                        if rt == 0:
                            view = np.frombuffer(data, np.uint8)
                            pin = cupy.cuda.alloc_pinned_memory(len(view))
                            np.frombuffer(pin, np.uint8, len(view))[:] = view
                            hw.decode([pin.ptr], [len(view)], [(int(x), int(y), int(w), int(h))], [region.data.ptr],
                                      [int(w) * 3], stream.ptr)
                        else:
                            view = np.frombuffer(data, np.uint8)
                            d.decode(view.ctypes.data, len(view), (int(x), int(y), int(w), int(h)), region.data.ptr,
                                     int(w) * 3)
                        stream.synchronize()
                    raw = psnr(cupy.asnumpy(region), full[y:y + h, x:x + w])
                rows.append({"variant": vname, "photo": os.path.basename(path), "size": f"{W}x{H}", "route": rt,
                             "chroma": info.chroma, "window": [int(v) for v in win[i]], "cpu_scale": m,
                             "gpu_vs_cpu": psnr(g[i], c[i]), "gpu_vs_truth": psnr(g[i], t),
                             "cpu_vs_truth": psnr(c[i], t), "raw_vs_libjpeg": raw})
        print(f"{os.path.basename(path)} done ({len(rows)} rows)", flush=True)
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["variant"].split("-")[-1], r["route"], r["cpu_scale"])].append(r)
    print(f"\n{'variant':<10} {'route':>5} {'m':>2} {'n':>5} | gpu_vs_cpu min/p1/med | gpu_vs_truth min/med | "
          "cpu_vs_truth min/med | raw min")
    for key in sorted(groups):
        g = groups[key]

        def st(f):
            v = np.array([r[f] for r in g if r[f] is not None])
            return v if len(v) else np.array([np.inf])
        gc, gt, ct, rw = st("gpu_vs_cpu"), st("gpu_vs_truth"), st("cpu_vs_truth"), st("raw_vs_libjpeg")
        print(f"{key[0]:<10} {key[1]:>5} {key[2]:>2} {len(g):>5} | {gc.min():5.1f} {np.percentile(gc, 1):5.1f} "
              f"{np.median(gc):5.1f} | {gt.min():5.1f} {np.median(gt):5.1f} | {ct.min():5.1f} {np.median(ct):5.1f} | "
              f"{rw.min():5.1f}")
    allv = np.array([r["gpu_vs_cpu"] for r in rows])
    print(f"\nall: n {len(allv)}, gpu_vs_cpu min {allv.min():.1f} p1 {np.percentile(allv, 1):.1f} "
          f"p5 {np.percentile(allv, 5):.1f} median {np.median(allv):.1f}")
    print("worst gpu_vs_cpu:")
    for r in sorted(rows, key=lambda r: r["gpu_vs_cpu"])[:12]:
        print("  ", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
