"""Plain-Python references for the native routines — the tests' yardstick, and the Python
decoder a program may opt in to where the extension is not built (cpu.allow_python_decoder).

- `choose_scale`, `min_scale`: smallest DCT scale M/8 keeping the window ≥ margin × the
  output size, within the scales that keep fidelity for the file's chroma layout.
- `decode_region`: PyTurboJPEG full decode at scale M/8 (libjpeg-turbo, same IDCT and
  upsampling as the native path), then a numpy crop of the whole-pixel region holding the window.
- `resample`: Pillow's Image.resize(BILINEAR, box=…) on that region.
- `decode_crop_resize_one`: the three chained — what native/fused.cpp computes.
- `truth`: Pillow full decode → crop(window) → resize(BILINEAR): the fidelity reference.
- `normalize`: mirror, (x · scale + bias), layout and element type — the native normalize's.
"""
from __future__ import annotations

import io
import math
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from .. import codec
from ..format.jpeg import DEFAULT_MAX_PIXELS
from .spec import bfloat16_bits


SCALE_MARGIN = 1.1  # see native/fused.cpp choose_scale: which scales and why this margin


def choose_scale(win_w: float, win_h: float, out_w: int, out_h: int, margin: float = SCALE_MARGIN,
                 min_m: int = 2) -> int:
    for m in (2, 4):
        if m >= min_m and win_w * m / 8.0 >= out_w * margin and win_h * m / 8.0 >= out_h * margin:
            return m
    return 8


def min_scale(data) -> int:
    """Native min_scale: no DC-only 1/8; ≥ 4/8 for chroma subsampled in one direction only."""
    from ..format.jpeg import CHROMA_411, CHROMA_422, CHROMA_440, probe

    return 4 if probe(data).chroma in (CHROMA_422, CHROMA_440, CHROMA_411) else 2


def region_of(window, m: int, scaled_w: int, scaled_h: int):
    """Whole-pixel region (x0, y0, x1, y1) of the scaled image holding the window, and the
    window's float box relative to it."""
    y, x, h, w = (float(v) for v in window)
    s = m / 8.0
    bx0, by0, bx1, by1 = x * s, y * s, (x + w) * s, (y + h) * s
    rx0, ry0 = math.floor(bx0 + 1e-9), math.floor(by0 + 1e-9)
    rx1, ry1 = min(scaled_w, math.ceil(bx1 - 1e-9)), min(scaled_h, math.ceil(by1 - 1e-9))
    rx1 = max(rx1, min(scaled_w, rx0 + 1))
    ry1 = max(ry1, min(scaled_h, ry0 + 1))
    return (rx0, ry0, rx1, ry1), (bx0 - rx0, by0 - ry0, bx1 - rx0, by1 - ry0)


def decode_scaled(data, m: int) -> np.ndarray:
    """Full decode at scale m/8 to RGB (H, W, 3) uint8; CMYK through Pillow's conversion."""
    try:
        g = math.gcd(m, 8)
        return codec.decode_rgb(data, (m // g, 8 // g))
    except OSError:
        # libturbojpeg 2.1 cannot convert CMYK to RGB: decode with Pillow's draft (same DCT scaling)
        im = Image.open(io.BytesIO(bytes(data)))
        if m < 8:
            im.draft(im.mode, (math.ceil(im.width * m / 8), math.ceil(im.height * m / 8)))
        return np.asarray(im.convert("RGB"))


def decode_region(data, window, m: int) -> tuple[np.ndarray, tuple]:
    img = decode_scaled(data, m)
    (rx0, ry0, rx1, ry1), box = region_of(window, m, img.shape[1], img.shape[0])
    return np.ascontiguousarray(img[ry0:ry1, rx0:rx1]), box


def resample(region: np.ndarray, box, out_w: int, out_h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(region, "RGB").resize((out_w, out_h), Image.BILINEAR, box=tuple(box)))


def decode_crop_resize_one(data, window, out_w: int, out_h: int, m: int | None = None,
                           margin: float = SCALE_MARGIN) -> np.ndarray:
    if m is None:
        m = choose_scale(float(window[3]), float(window[2]), out_w, out_h, margin, min_scale(data))
    region, box = decode_region(data, window, m)
    return resample(region, box, out_w, out_h)


def truth(data, window, out_w: int, out_h: int) -> np.ndarray:
    """Pillow decode → crop → resize(BILINEAR): crop first, then resize."""
    return truth_of(Image.open(io.BytesIO(bytes(data))).convert("RGB"), window, out_w, out_h)


def truth_of(im, window, out_w: int, out_h: int) -> np.ndarray:
    """`truth` on an image Pillow already decoded (RGB)."""
    y, x, h, w = (float(v) for v in window)
    if float(x).is_integer() and float(y).is_integer() and float(w).is_integer() and float(h).is_integer():
        return np.asarray(im.crop((int(x), int(y), int(x + w), int(y + h))).resize((out_w, out_h), Image.BILINEAR))
    return np.asarray(im.resize((out_w, out_h), Image.BILINEAR, box=(x, y, x + w, y + h)))


def normalize(batch, scale, bias, layout, dtype, flips):
    """numpy reference of the native normalize (and the path without the extension); dtype
    "bfloat16" gives its bits as uint16."""
    x = batch.astype(np.float32)
    if flips.any():
        x[flips] = x[flips, :, ::-1]
    x *= scale
    x += bias
    if layout == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if str(dtype) == "bfloat16":
        return bfloat16_bits(x)
    return x.astype(dtype, copy=False)


def refusal(data, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """Why a decoder must not start on these bytes: format.jpeg.decode_refusal (the native
    decoder's own checks), for the Python paths — the Python decoder and the Pillow retry.
    None when the header does not parse as a JPEG (the decoder then fails on its own, cheaply)."""
    from ..format.jpeg import BadJPEG, NotJPEG, decode_refusal, probe

    try:
        info = probe(data)
    except (NotJPEG, BadJPEG):
        return None
    return decode_refusal(info, len(data), max_pixels)


def python_batch(buffers, windows, out, threads, max_pixels, margin):
    """The Python decoder (cpu.allow_python_decoder): decode_crop_resize_one on a thread pool,
    into `out`; returns the sorted (index, reason) failures, as the native batch call does."""
    oh, ow = out.shape[1:3]

    def one(i):
        data = buffers[i]
        try:
            why = refusal(data, max_pixels)
            if why:
                out[i] = 0
                return i, why
            with Image.open(io.BytesIO(bytes(data))) as im:
                if im.width * im.height > max_pixels:
                    out[i] = 0
                    return i, f"header declares {im.width}x{im.height}, more than max_pixels {max_pixels}"
            out[i] = decode_crop_resize_one(data, windows[i], ow, oh, margin=margin)
            return i, None
        except Exception as e:  # per-image failures never abort the batch
            out[i] = 0
            return i, f"{type(e).__name__}: {e}"

    order = np.argsort([-len(b) for b in buffers], kind="stable")  # largest first
    # libjpeg's corrupt-data warnings (PyTurboJPEG warns) are failures, as in the native path;
    # the filter is process-wide, so it is set here, around the pool, and only for turbojpeg
    with warnings.catch_warnings(), ThreadPoolExecutor(threads) as ex:
        warnings.filterwarnings("error", module="turbojpeg")
        results = list(ex.map(one, order))
    return sorted((i, r) for i, r in results if r is not None)
