#!/usr/bin/env python3
"""Generate an ImageNet-like folder (OUT/<synset>/<synset>_<i>.JPEG) for tests and benchmarks.

From photos when --photos is given (random crops, rescaled and re-encoded), otherwise
procedural textured, noisy images so the JPEGs weigh like real ones (~100 KB at 500×375).
The mix follows ImageNet train: mostly 500 px long side, a tail of small and large, a few
huge; mostly 4:2:0 with some 4:4:4 and 4:2:2; some grayscale, progressive and CMYK files;
plus, with --quirks (default), one PNG named .JPEG as in ImageNet. Deterministic per --seed.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

# (probability, long-side range)
SIZE_MIX = [(0.78, (500, 500)), (0.165, (120, 499)), (0.052, (501, 1200)), (0.003, (2500, 3600))]
ASPECTS = [(0.55, 4 / 3), (0.2, 3 / 2), (0.15, 1.0), (0.1, 16 / 9)]
SUBSAMPLING = [(0.86, 2), (0.08, 0), (0.06, 1)]  # Pillow: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0
P_GRAY, P_PROGRESSIVE, P_CMYK = 0.02, 0.03, 0.001


def _pick(rng, table):
    r = rng.random()
    acc = 0.0
    for p, v in table:
        acc += p
        if r < acc:
            return v
    return table[-1][1]


def _plan(rng):
    lo, hi = _pick(rng, SIZE_MIX)
    long_side = int(rng.integers(lo, hi + 1))
    aspect = _pick(rng, ASPECTS)
    short = max(16, int(round(long_side / aspect)))
    w, h = (long_side, short) if rng.random() < 0.72 else (short, long_side)
    return {
        "size": (w, h),
        "quality": int(rng.integers(90, 97)),
        "subsampling": _pick(rng, SUBSAMPLING),
        "gray": rng.random() < P_GRAY,
        "progressive": rng.random() < P_PROGRESSIVE,
        "cmyk": rng.random() < P_CMYK,
    }


def procedural(rng, w, h) -> Image.Image:
    """Smooth colour fields + oriented texture + sensor-like noise: compresses like a photo."""
    lw, lh = max(2, w // 48), max(2, h // 48)
    base = Image.fromarray(rng.integers(0, 256, (lh, lw, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    img = np.asarray(base, dtype=np.float32)
    yy = np.arange(h, dtype=np.float32)[:, None]
    xx = np.arange(w, dtype=np.float32)[None, :]
    tex = np.zeros((h, w), np.float32)
    for _ in range(3):
        theta = rng.uniform(0, np.pi)
        freq = rng.uniform(0.02, 0.35)
        tex += np.float32(rng.uniform(6, 22)) * np.sin(
            (xx * np.float32(np.cos(theta) * freq) + yy * np.float32(np.sin(theta) * freq)) + np.float32(rng.uniform(0, 6.3)))
    img += tex[..., None] * rng.uniform(0.4, 1.0, size=3).astype(np.float32)
    noise = rng.standard_normal(size=img.shape, dtype=np.float32)
    noise *= np.float32(rng.uniform(7, 13))
    img += noise
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def from_photo(rng, photo: Image.Image, w, h, noise_scale: float = 1.0) -> Image.Image:
    pw, ph = photo.size
    scale = rng.uniform(0.25, 1.0)
    cw = min(pw, max(16, int(pw * scale)))
    ch = min(ph, max(16, int(cw * h / w)))
    cw = min(pw, int(ch * w / h))
    x = int(rng.integers(0, pw - cw + 1))
    y = int(rng.integers(0, ph - ch + 1))
    img = np.asarray(photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BILINEAR), dtype=np.float32)
    # Wallpaper-grade photos are smoother than ImageNet's; sensor-like noise brings the JPEG
    # size (and so entropy-decode cost) to ImageNet's ~100 KB at 500×375.
    noise = rng.standard_normal(size=img.shape, dtype=np.float32)
    noise *= np.float32(rng.uniform(8, 12) * noise_scale)
    img += noise
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


_PHOTOS: list = []


def _load_photos(folder):
    global _PHOTOS
    if folder and not _PHOTOS:
        names = sorted(n for n in os.listdir(folder) if n.lower().endswith((".jpg", ".jpeg", ".png")))
        _PHOTOS = [Image.open(os.path.join(folder, n)).convert("RGB") for n in names]
        if not _PHOTOS:
            raise SystemExit(f"{folder}: no photos")


def encode(img: Image.Image, plan) -> bytes:
    out = io.BytesIO()
    if plan["cmyk"]:
        img.convert("CMYK").save(out, "JPEG", quality=plan["quality"])
        return out.getvalue()
    if plan["gray"]:
        img = img.convert("L")
    img.save(out, "JPEG", quality=plan["quality"], subsampling=plan["subsampling"],
             progressive=plan["progressive"])
    return out.getvalue()


def make_one(args):
    i, seed, out, classes, photos, noise_scale = args
    rng = np.random.default_rng([seed, i])
    plan = _plan(rng)
    w, h = plan["size"]
    if photos:
        _load_photos(photos)
        img = from_photo(rng, _PHOTOS[int(rng.integers(len(_PHOTOS)))], w, h, noise_scale)
    else:
        img = procedural(rng, w, h)
    cls = i % classes
    synset = f"n{cls:08d}"
    path = os.path.join(out, synset, f"{synset}_{i}.JPEG")
    data = encode(img, plan)
    with open(path, "wb") as f:
        f.write(data)
    return len(data), plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--photos", default=None, help="folder of photos to crop from (default: procedural)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--photo-noise", type=float, default=1.0,
                    help="scale of the sensor-like noise added to photo crops (0: none; 1: ImageNet-like file sizes)")
    ap.add_argument("--no-quirks", dest="quirks", action="store_false",
                    help="leave out the PNG-named-.JPEG file")
    a = ap.parse_args(argv)
    for c in range(a.classes):
        os.makedirs(os.path.join(a.out, f"n{c:08d}"), exist_ok=True)
    jobs = [(i, a.seed, a.out, a.classes, a.photos, a.photo_noise) for i in range(a.images)]
    with ProcessPoolExecutor(a.workers) as ex:
        results = list(ex.map(make_one, jobs, chunksize=16))
    if a.quirks and a.images:
        # ImageNet's n02105855_2933.JPEG is a PNG: keep one such file
        rng = np.random.default_rng([a.seed, 2**32 - 1])
        img = procedural(rng, 500, 375)
        buf = io.BytesIO()
        img.save(buf, "PNG")
        with open(os.path.join(a.out, "n00000000", "n00000000_png.JPEG"), "wb") as f:
            f.write(buf.getvalue())
    sizes = np.array([r[0] for r in results])
    plans = [r[1] for r in results]
    print(f"{a.out}: {a.images} images in {a.classes} classes, {sizes.sum() / 1e6:.1f} MB, "
          f"mean {sizes.mean() / 1e3:.0f} KB; gray {sum(p['gray'] for p in plans)}, progressive "
          f"{sum(p['progressive'] for p in plans)}, cmyk {sum(p['cmyk'] for p in plans)}"
          + (", +1 PNG named .JPEG" if a.quirks and a.images else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
