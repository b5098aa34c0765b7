#!/usr/bin/env python3
"""Generate a fidelity set (OUT/<synset>/<name>.JPEG) for GPU-vs-CPU pixel checks: images
ImageNet's mix of sizes, chroma layouts, qualities, progressive and grayscale files, cut from
photos at random places and scales (so mostly other content than benchmarks/gpu_fidelity.py's
whole-photo variants), and a share with sharp saturated colour edges drawn in (text-like
strokes, flags, stripes, logos on flat colour) — where replicated and interpolated chroma differ
most — and a share of large downscales (big originals).

  make_fidelity_set.py OUT --photos DIR [--images 3000] [--seed 0] [--cases imagenet|hard]

Measure on photos the code was not tuned on: pass --photos a folder of photographs kept out of
the tuning (e.g. half of ../shared/photos).

Deterministic per --seed. The plan of each image (size, chroma, quality, edges) is printed as a
summary; benchmarks/gpu_fidelity.py --set OUT reports it.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image, ImageDraw

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))  # make_imagenet_like
import make_imagenet_like as M  # noqa: E402

# ImageNet train: 4:2:0 mostly, some 4:4:4 / 4:2:2; quality spread wider than the benchmark set's
QUALITY = [(0.15, (70, 79)), (0.45, (80, 89)), (0.4, (90, 97))]
P_EDGES = 0.35  # images with drawn colour edges
P_HUGE = 0.04  # 2000-3600 px originals: large downscales to 224


def _plan(rng):
    p = M._plan(rng)
    lo, hi = M._pick(rng, QUALITY)
    p["quality"] = int(rng.integers(lo, hi + 1))
    if rng.random() < P_HUGE:
        w, h = p["size"]
        s = rng.uniform(2000, 3600) / max(w, h)
        p["size"] = (int(w * s), int(h * s))
    p["edges"] = bool(rng.random() < P_EDGES)
    return p


def draw_edges(rng, img: Image.Image) -> Image.Image:
    """Hard-edged saturated shapes: strokes, stripes, blocks, a flag — chroma steps of one pixel."""
    w, h = img.size
    d = ImageDraw.Draw(img)
    sat = [(255, 0, 0), (0, 160, 0), (0, 0, 255), (255, 220, 0), (255, 0, 255), (0, 200, 255), (255, 255, 255),
           (0, 0, 0), (200, 60, 0)]
    for _ in range(int(rng.integers(3, 12))):
        c = sat[int(rng.integers(len(sat)))]
        kind = rng.integers(4)
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        s = int(rng.integers(max(4, min(w, h) // 40), max(8, min(w, h) // 3)))
        if kind == 0:  # a block
            d.rectangle([x0, y0, x0 + s, y0 + s // 2], fill=c)
        elif kind == 1:  # thin strokes, text-like
            for k in range(int(rng.integers(3, 9))):
                t = int(rng.integers(1, 4))
                d.line([x0 + k * 3 * t, y0, x0 + k * 3 * t + s // 4, y0 + s // 3], fill=c, width=t)
        elif kind == 2:  # stripes (a flag)
            c2 = sat[int(rng.integers(len(sat)))]
            for k in range(3):
                d.rectangle([x0, y0 + k * s // 6, x0 + s, y0 + (k + 1) * s // 6], fill=c if k % 2 else c2)
        else:  # a disc
            d.ellipse([x0, y0, x0 + s, y0 + s], fill=c)
    return img


# --cases hard: the cases where the devices' pixels can differ most, each layout alike
HARD_CASES = [(0.4, "large"), (0.3, "tiny"), (0.3, "imagenet")]
HARD_LAYOUTS = ["4:2:0", "4:2:2", "4:4:0", "4:4:4", "gray"]
P_HARD_PROGRESSIVE = 0.2


def _hard_plan(rng):
    """A large image (1000–3600 px long side: RandomResizedCrop windows far larger than the
    output, decoded DCT-scaled at 1/2 or 1/4 on the CPU), a tiny one (24–160 px: windows
    upscaled 1.5–9×) or ImageNet's mix; every chroma layout alike (4:4:0 too), a fifth
    progressive, qualities 70–97, colour edges in a third."""
    p = M._plan(rng)
    case = HARD_CASES[int(rng.choice(len(HARD_CASES), p=[c[0] for c in HARD_CASES]))][1]
    w, h = p["size"]
    if case != "imagenet":
        long_side = rng.uniform(1000, 3600) if case == "large" else rng.uniform(24, 160)
        s = long_side / max(w, h)
        p["size"] = (max(8, int(w * s)), max(8, int(h * s)))
    layout = HARD_LAYOUTS[int(rng.integers(len(HARD_LAYOUTS)))]
    p.update(case=case, layout=layout, gray=layout == "gray", cmyk=False,
             progressive=bool(rng.random() < P_HARD_PROGRESSIVE), quality=int(rng.integers(70, 98)),
             edges=bool(rng.random() < P_EDGES))
    return p


def _encode_layout(img: Image.Image, plan) -> bytes:
    """libjpeg-turbo's encoder for every layout (Pillow's has no 4:4:0)."""
    from turbojpeg import TJFLAG_PROGRESSIVE, TJPF_GRAY, TJPF_RGB, TJSAMP_420, TJSAMP_422, TJSAMP_440, TJSAMP_444, \
        TJSAMP_GRAY

    from recordtool.codec import turbojpeg

    sub = {"4:2:0": TJSAMP_420, "4:2:2": TJSAMP_422, "4:4:0": TJSAMP_440, "4:4:4": TJSAMP_444,
           "gray": TJSAMP_GRAY}[plan["layout"]]
    flags = TJFLAG_PROGRESSIVE if plan["progressive"] else 0
    if plan["layout"] == "gray":
        arr = np.asarray(img.convert("L"))[:, :, None]
        return turbojpeg().encode(np.ascontiguousarray(arr), quality=plan["quality"], pixel_format=TJPF_GRAY,
                                  jpeg_subsample=sub, flags=flags)
    return turbojpeg().encode(np.asarray(img.convert("RGB")), quality=plan["quality"], pixel_format=TJPF_RGB,
                              jpeg_subsample=sub, flags=flags)


def make_one(args):
    i, seed, out, classes, photos, cases = args
    rng = np.random.default_rng([seed, 77, i])
    plan = _hard_plan(rng) if cases == "hard" else _plan(rng)
    w, h = plan["size"]
    M._load_photos(photos)
    img = M.from_photo(rng, M._PHOTOS[int(rng.integers(len(M._PHOTOS)))], w, h, noise_scale=rng.uniform(0, 1))
    if plan["edges"]:
        img = draw_edges(rng, img)
    synset = f"n{i % classes:08d}"
    data = _encode_layout(img, plan) if cases == "hard" else M.encode(img, plan)
    with open(os.path.join(out, synset, f"{synset}_{i}.JPEG"), "wb") as f:
        f.write(data)
    return len(data), plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--photos", required=True)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--cases", choices=["imagenet", "hard"], default="imagenet",
                    help="imagenet: ImageNet's mix of sizes and layouts; hard: large (DCT-scaled) and tiny "
                         "(upscaled) images, every chroma layout alike, a fifth progressive")
    a = ap.parse_args(argv)
    for c in range(a.classes):
        os.makedirs(os.path.join(a.out, f"n{c:08d}"), exist_ok=True)
    jobs = [(i, a.seed, a.out, a.classes, a.photos, a.cases) for i in range(a.images)]
    with ProcessPoolExecutor(a.workers) as ex:
        res = list(ex.map(make_one, jobs, chunksize=16))
    plans = [p for _, p in res]
    if a.cases == "hard":
        from collections import Counter

        print(f"{a.out}: {a.images} images, {sum(n for n, _ in res) / 1e6:.1f} MB; cases "
              f"{dict(Counter(p['case'] for p in plans))}; layouts {dict(Counter(p['layout'] for p in plans))}; "
              f"progressive {sum(p['progressive'] for p in plans)}, colour edges {sum(p['edges'] for p in plans)}",
              file=sys.stderr)
        return
    sub = np.array([p["subsampling"] for p in plans if not (p["gray"] or p["cmyk"])])
    print(f"{a.out}: {a.images} images, {sum(n for n, _ in res) / 1e6:.1f} MB; 4:2:0 {int((sub == 2).sum())}, "
          f"4:2:2 {int((sub == 1).sum())}, 4:4:4 {int((sub == 0).sum())}, gray {sum(p['gray'] for p in plans)}, "
          f"progressive {sum(p['progressive'] for p in plans)}, cmyk {sum(p['cmyk'] for p in plans)}, "
          f"colour edges {sum(p['edges'] for p in plans)}, ≥ 2000 px {sum(max(p['size']) >= 2000 for p in plans)}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
