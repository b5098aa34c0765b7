#!/usr/bin/env python3
"""GPU vs CPU pixels on real photos: which images fall below a PSNR bound, and why.

  gpu_fidelity.py PHOTOS_DIR [--windows 24] [--chroma replicate,interpolate,nvjpeg] [--json FILE]
  gpu_fidelity.py --set FOLDER [--chroma ...] [--splits gpu,auto] [--json FILE]

Photos: each is tried as it is and re-encoded (long side 500 / 1000 / full; 4:4:4, 4:2:2, 4:2:0;
progressive; gray). For RandomResizedCrop windows it compares, per image and chroma mode
(GPUDecoder's `chroma`):
- gpu_vs_cpu: GPUDecoder with split="gpu" (engines / hybrid decoder) against the CPU fused decode,
- gpu_vs_truth, cpu_vs_truth: each against Pillow decode → crop → resize(BILINEAR),
- raw_vs_libjpeg: the GPU decoder's decoded pixels themselves (before resampling) against
  libjpeg-turbo's full decode: the window region (RGBI modes) or the whole image made from the
  planes by the kernel's reference (interpolate),
grouped by chroma mode, variant, route and the CPU's DCT scale; the worst cases are listed.

--set: a folder of JPEGs (benchmarks/make_fidelity_set.py) is packed and read by the Loader users
run, device="cuda" (each chroma mode × split) against device="cpu" on the same windows (same
seed): PSNR per image, min / p1 / median and the count below 30 / 40 dB, overall and per chroma
layout of the index.
"""
from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import io
import json
import os
import signal
import sys

import numpy as np
from PIL import Image

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
from recordtool import _native  # noqa: E402
from recordtool.decode import decode_crop_resize, random_windows  # noqa: E402
from recordtool.decode import reference as R  # noqa: E402
from recordtool.tools.fidelity import psnr as _psnr  # noqa: E402
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


def _stats(v, exact=None) -> str:
    v = np.asarray(v, np.float64)
    line = (f"min {v.min():5.1f}  p1 {np.percentile(v, 1):5.1f}  median {np.median(v):5.1f}  "
            f"<30 dB {int((v < 30).sum()):>4}  <40 dB {int((v < 40).sum()):>4}  n {len(v)}")
    return line if exact is None else f"{line}  bit-exact {int(np.sum(exact))}"


def _cases_of(ds, ids, size) -> dict:
    """Per record: how its epoch-0 window (seed 0) is made — "1/2" / "1/4" (the CPU decodes it
    DCT-scaled, the GPU reproduces the reduction), "up≥2×" (a window upscaled at least 2×), or
    "other"."""
    from recordtool.decode.gpu.roi import dct_reduction

    ids = np.asarray(ids)
    w, h = ds.index.width[ids], ds.index.height[ids]
    win = random_windows(w, h, ids, 0, 0)
    red = dct_reduction(win, ds.index.chroma[ids], size if isinstance(size, tuple) else (size, size))
    out_h, out_w = size if isinstance(size, tuple) else (size, size)
    up = np.maximum(out_w / win[:, 3], out_h / win[:, 2]) >= 2
    names = np.where(red == 2, "1/2", np.where(red == 4, "1/4", np.where(up, "up≥2×", "other")))
    return dict(zip(ids.tolist(), names.tolist()))


def loader_report(folder, chromas, splits, size=224, batch=256, same_pixels=(True,)):
    """Pack `folder`; the Loader on device="cpu" and on device="cuda" per chroma × split ×
    same_pixels, same seed (same windows and flips); PSNR per image of the uint8 pixels (mean 0,
    std 1/255), and how many images equal the CPU's bit for bit (the normalised floats)."""
    import tempfile

    import cupy

    import recordtool
    from recordtool.format.jpeg import CHROMA_NAMES
    from recordtool.pack import pack

    tmp = tempfile.mkdtemp(prefix="fidelity-set-")
    pack(folder, os.path.join(tmp, "packed"), shards=8, progress=False)
    ds = recordtool.open(os.path.join(tmp, "packed"))
    kw = dict(batch_size=batch, size=size, seed=0, drop_last=False, as_torch=False, dtype="float32", layout="NHWC",
              mean=(0, 0, 0), std=(1 / 255,) * 3, with_ids=True)

    def pixels(x):
        return np.clip(np.rint(x), 0, 255).astype(np.uint8)

    def digest(raw) -> bytes:  # the normalised values, for bit-exact comparison without keeping them
        return hashlib.blake2b(np.ascontiguousarray(raw).tobytes(), digest_size=16).digest()

    cpu, cpu_digest = {}, {}
    for x, _, ids in recordtool.Loader(ds, device="cpu", **kw):
        x = np.asarray(x)
        for i, img, raw in zip(np.asarray(ids).tolist(), pixels(x), x):
            cpu[i], cpu_digest[i] = img, digest(raw)
    chroma_of = {i: CHROMA_NAMES.get(int(c), str(c)) for i, c in enumerate(ds.index.chroma)}
    prog = ds.index.progressive
    print(f"\n=== Loader device=cuda vs device=cpu, same windows: {len(ds)} records of {folder}, {size}²", flush=True)
    out = {}
    for chroma in chromas:
        for split in splits:
            split = split if split in ("auto", "gpu", "cpu") else float(split)
            for same in same_pixels:
                ld = recordtool.Loader(ds, device="cuda", gpu=recordtool.GPUOptions(chroma=chroma, split=split,
                                                                                     same_pixels=same), **kw)
                per, exact = {}, {}
                for x, _, ids in ld:
                    x = cupy.asnumpy(x)
                    for i, img, raw in zip(np.asarray(ids).tolist(), pixels(x), x):
                        per[i], exact[i] = psnr(img, cpu[i]), digest(raw) == cpu_digest[i]
                ld.close()
                ld.backend.close()
                ids = sorted(per)
                v, e = np.array([per[i] for i in ids]), np.array([exact[i] for i in ids])
                print(f"  chroma {chroma:<11} split {str(split):<4} same_pixels {str(same):<5} all      "
                      f"{_stats(v, e)}", flush=True)
                for name in sorted({chroma_of[i] for i in ids}):
                    sel = np.array([chroma_of[i] == name for i in ids])
                    print(f"  {'':<48}{name:<8} {_stats(v[sel], e[sel])}")
                sel = np.array([bool(prog[i]) for i in ids])
                if sel.any():
                    print(f"  {'':<48}{'progr.':<8} {_stats(v[sel], e[sel])}")
                case = _cases_of(ds, ids, size)
                for c in ("1/2", "1/4", "up≥2×", "other"):
                    for name in sorted({chroma_of[i] for i in ids}):
                        sel = np.array([case[i] == c and chroma_of[i] == name for i in ids])
                        if sel.any():
                            print(f"  {'':<48}{c:<6} {name:<8} {_stats(v[sel], e[sel])}")
                worst = [(round(per[i], 1), i, chroma_of[i], int(ds.index.width[i]), int(ds.index.height[i]))
                         for i in sorted(per, key=per.get)[:5]]
                print(f"  {'':<48}worst (dB, record, chroma, w, h): {worst}")
                out[f"{chroma}/{split}/{same}"] = {"psnr": v.tolist(), "ids": ids, "bit_exact": e.tolist()}
    return out


def main():
    from recordtool.decode.options import CHROMA_MODES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("photos", nargs="?")
    ap.add_argument("--set", default=None, help="a folder of JPEGs to read through the Loader (make_fidelity_set.py)")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--chroma", default=",".join(CHROMA_MODES), help="GPUDecoder chroma modes to compare")
    ap.add_argument("--splits", default="gpu,auto", help="--set: Loader splits")
    ap.add_argument("--same-pixels", default="on", help="--set: the Loader's same_pixels, on / off / on,off")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import cupy  # a GPU run from here on (--help works without one)

    from recordtool.decode.gpu import GPUDecoder, route
    from recordtool.decode.options import GPUOptions
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder, HybridDecoder
    from recordtool.decode.gpu.reference import SUBSAMPLING, planes_to_rgb
    from recordtool.decode.spec import Output

    chromas = a.chroma.split(",")
    if a.set:
        same = [{"on": True, "off": False}[v] for v in a.same_pixels.split(",")]
        res = loader_report(a.set, chromas, a.splits.split(","), same_pixels=same)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f)
        return
    from recordtool.codec import turbojpeg
    tj = turbojpeg()
    from turbojpeg import TJPF_RGB

    stream = cupy.cuda.Stream(non_blocking=True)
    spec = Output(224, dtype="uint8", layout="NHWC")
    decs = {c: GPUDecoder(spec, GPUOptions(split="gpu", chroma=c), max_batch=a.windows) for c in chromas}
    raw_dec = {}  # chroma → (engine decoder, hybrid decoder) for the raw pixels
    for c in chromas:
        try:
            raw_dec[c] = (HardwareDecoder(1, planar=c == "interpolate", interpolate=c == "nvjpeg"),
                          HybridDecoder(stream.ptr, interpolate=c == "nvjpeg"))
        except Exception as e:
            print(f"raw decoders for {c}: {e}")
    rows = []
    signal.signal(signal.SIGTERM, _stop)  # `timeout`: report what was measured
    try:
        _photos(a, chromas, decs, raw_dec, stream, tj, TJPF_RGB, rows, planes_to_rgb, SUBSAMPLING, route)
    except _Stopped:
        print(f"stopped by SIGTERM after {len(rows)} rows", flush=True)
    _summary(rows, chromas, a.json)


class _Stopped(Exception):
    pass


def _stop(signum, frame):
    raise _Stopped()


def _photos(a, chromas, decs, raw_dec, stream, tj, TJPF_RGB, rows, planes_to_rgb, SUBSAMPLING, route):
    import cupy

    for k, path in enumerate(sorted(glob.glob(os.path.join(a.photos, "*.jpg")))):
        for vname, data in variants(path):
            info = probe(data)
            rt = int(route([info.chroma], [info.progressive], [info.colorspace])[0])
            W, H = info.width, info.height
            ids = np.arange(a.windows) + 1000 * k
            win = random_windows(np.full(a.windows, W), np.full(a.windows, H), ids, 0, 0)
            bufs = [data] * a.windows
            c = decode_crop_resize(bufs, win)
            full = tj.decode(data, pixel_format=TJPF_RGB)
            pil = Image.open(io.BytesIO(data)).convert("RGB")  # Pillow decode once, crop per window
            truth = [np.asarray(pil.crop((int(x), int(y), int(x + w), int(y + h))).resize((224, 224), Image.BILINEAR))
                     for (y, x, h, w) in win]
            view = np.frombuffer(data, np.uint8)
            pin = cupy.cuda.alloc_pinned_memory(len(view))
            np.frombuffer(pin, np.uint8, len(view))[:] = view
            for mode in chromas:
                g = cupy.asnumpy(decs[mode](bufs, win, np.zeros(a.windows, bool), np.full(a.windows, rt)))
                raw_whole = None
                if mode == "interpolate" and mode in raw_dec and rt in (0, 1):  # the whole image from its planes
                    hwd, hyd = raw_dec[mode]
                    nc, css, ws, hs = hwd.image_info(view.ctypes.data, len(view))
                    gray = nc == 1
                    planes = [cupy.zeros((hs[c_], ws[c_]), np.uint8) for c_ in range(1 if gray else 3)]
                    ptrs = [p.data.ptr for p in planes] + [planes[0].data.ptr] * (3 - len(planes))
                    pitches = [int(p.shape[1]) for p in planes] + [int(planes[0].shape[1])] * (3 - len(planes))
                    try:
                        if rt == 0:
                            hwd.decode_planes([pin.ptr], [len(view)], [ptrs], [pitches], stream.ptr)
                        else:
                            hyd.decode_planes(view.ctypes.data, len(view), ptrs, pitches, gray)
                        stream.synchronize()
                        p = [cupy.asnumpy(q) for q in planes]
                        rgb = planes_to_rgb(p[0][:H, :W]) if gray else planes_to_rgb(p[0][:H, :W], p[1], p[2],
                                                                                      *SUBSAMPLING[css])
                        raw_whole = psnr(rgb, full)
                    except Exception as e:
                        print(f"  raw planes {vname}: {e}")
                for i, (y, x, h, w) in enumerate(win):
                    m = _native.choose_scale(float(w), float(h), 224, 224, R.SCALE_MARGIN, R.min_scale(data))
                    raw = raw_whole if i == 0 else None
                    if i < 4 and rt in (0, 1) and mode != "interpolate" and mode in raw_dec:  # the window region
                        hwd, hyd = raw_dec[mode]
                        region = cupy.zeros((int(h), int(w), 3), np.uint8)
                        if rt == 0:
                            hwd.decode([pin.ptr], [len(view)], [(int(x), int(y), int(w), int(h))], [region.data.ptr],
                                       [int(w) * 3], stream.ptr)
                        else:
                            hyd.decode(view.ctypes.data, len(view), (int(x), int(y), int(w), int(h)),
                                       region.data.ptr, int(w) * 3)
                        stream.synchronize()
                        raw = psnr(cupy.asnumpy(region), full[y:y + h, x:x + w])
                    rows.append({"mode": mode, "variant": vname, "photo": os.path.basename(path), "size": f"{W}x{H}",
                                 "route": rt, "chroma": info.chroma, "window": [int(v) for v in win[i]],
                                 "cpu_scale": m, "gpu_vs_cpu": psnr(g[i], c[i]), "gpu_vs_truth": psnr(g[i], truth[i]),
                                 "cpu_vs_truth": psnr(c[i], truth[i]), "raw_vs_libjpeg": raw})
        print(f"{os.path.basename(path)} done ({len(rows)} rows)", flush=True)


def _summary(rows, chromas, json_path):
    if not rows:
        return
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["mode"], r["variant"].split("-")[-1], r["route"], r["cpu_scale"])].append(r)
    print(f"\n{'chroma':<11} {'variant':<10} {'route':>5} {'m':>2} {'n':>5} | gpu_vs_cpu min/p1/med | "
          "gpu_vs_truth min/med | cpu_vs_truth min/med | raw min")
    for key in sorted(groups):
        g = groups[key]

        def st(f):
            v = np.array([r[f] for r in g if r[f] is not None])
            return v if len(v) else np.array([np.inf])
        gc, gt, ct, rw = st("gpu_vs_cpu"), st("gpu_vs_truth"), st("cpu_vs_truth"), st("raw_vs_libjpeg")
        print(f"{key[0]:<11} {key[1]:<10} {key[2]:>5} {key[3]:>2} {len(g):>5} | {gc.min():5.1f} {np.percentile(gc, 1):5.1f} "
              f"{np.median(gc):5.1f} | {gt.min():5.1f} {np.median(gt):5.1f} | {ct.min():5.1f} {np.median(ct):5.1f} | "
              f"{rw.min():5.1f}")
    for mode in chromas:
        allv = np.array([r["gpu_vs_cpu"] for r in rows if r["mode"] == mode])
        if not len(allv):
            continue
        raw = np.array([r["raw_vs_libjpeg"] for r in rows if r["mode"] == mode and r["raw_vs_libjpeg"] is not None])
        print(f"\nall, chroma {mode}: n {len(allv)}, gpu_vs_cpu min {allv.min():.1f} p1 {np.percentile(allv, 1):.1f} "
              f"p5 {np.percentile(allv, 5):.1f} median {np.median(allv):.1f}; raw vs libjpeg min "
              f"{raw.min() if len(raw) else float('nan'):.1f}, bit-exact {int((raw >= 100).sum())}/{len(raw)}")
        print("worst gpu_vs_cpu:")
        for r in sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["gpu_vs_cpu"])[:6]:
            print("  ", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()})
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
