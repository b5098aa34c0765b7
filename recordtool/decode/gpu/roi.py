"""Where chroma="interpolate" decodes each image: the region of interest whose planar YCbCr
holds everything the kernel reads for its window, so nvJPEG decodes (and writes) that region
instead of the whole image. Pure NumPy: CI tests it without a GPU.

The region is the window's kernel taps (the kernel clamps them to the window's whole-pixel
region; at the CPU path's DCT scale, see dct_reduction, they are planned so), plus one chroma sample of context each way (libjpeg's fancy upsampling of a
pixel takes its nearer and its further chroma sample), aligned outward to MCU boundaries (what
a JPEG decoder decodes anyway: the region's chroma plane then starts on a chroma sample) and
clamped to the image. The kernel reads the region's planes at its offset with the whole
image's coordinates and edge rules (struct Sample's ox / oy), so its pixels are those of a
whole-image decode, bit for bit, as long as the decoder's region planes equal the whole
image's planes there (tests/gpu/test_nvjpeg.py checks that on the device).
"""
from __future__ import annotations

import numpy as np

from ..spec import SCALE_MARGIN
from .room import PlaneLayout, planar_subsampling

ONE_WAY = (1, 3)
"""nvJPEG chroma codes of chroma subsampled in one direction only (4:2:2, 4:4:0): the CPU path
decodes them at 1/2 at most (1/4 loses their colour detail)."""

MARGIN = 2
"""Source pixels added beyond the kernel's taps computed in closed form: covers float32
rounding and the compiler's fused multiply-adds in the kernel's own tap arithmetic."""

SUBSAMPLING = {0: (1, 1), 1: (2, 1), 2: (2, 2), 3: (1, 2), 6: (1, 1)}
"""(horizontal, vertical) subsampling per nvJPEG chroma code (444, 422, 420, 440, gray)."""


def tap_span(a0, a1, size, out: int):
    """[lo, hi) of the source pixels the kernel's taps read along one axis for windows
    [a0, a1) (float arrays) of axes of `size` pixels resampled to `out`: the first output's
    lowest tap to the last output's highest (they grow with the output index), ± MARGIN,
    clamped to the axis. Pillow's rule (gpu_resize.cu `taps`): support = max(scale, 1)."""
    a0, a1 = np.asarray(a0, np.float64), np.asarray(a1, np.float64)
    scale = (a1 - a0) / out
    fs = np.maximum(scale, 1.0)
    lo = np.floor(a0 + 0.5 * scale - fs + 0.5).astype(np.int64) - MARGIN
    hi = np.ceil(a1 - 0.5 * scale + fs + 0.5).astype(np.int64) + MARGIN
    size = np.asarray(size, np.int64)
    lo = np.clip(lo, 0, size - 1)
    return lo, np.maximum(np.minimum(hi, size), lo + 1)


def _axis(lo, hi, size, sub, context=1):
    """Extend [lo, hi) by `context` chroma samples each way (sub = 2: one for the fancy
    upsampling's further sample, or the k samples of a reduced chroma sample's mean) and align
    it outward to the MCU (8·sub pixels), clamped to [0, size)."""
    if sub == 2:
        csize = -(-size // 2)
        c0 = np.maximum((lo >> 1) - context, 0)
        c1 = np.minimum(((hi - 1) >> 1) + 1 + context, csize)  # exclusive
        lo, hi = 2 * c0, np.minimum(2 * c1, size)
    mcu = 8 * sub
    return lo // mcu * mcu, np.minimum(-(-hi // mcu) * mcu, size)


def dct_reduction(windows, css, size, margin: float = SCALE_MARGIN) -> np.ndarray:
    """Per window (y, x, h, w) of an image with nvJPEG chroma code css, resampled to `size`
    (out_h, out_w): the factor (1, 2 or 4) by which the CPU path decodes it reduced — libjpeg's
    DCT scaling M/8 = 1 / factor, the smallest that keeps the window ≥ margin × the output
    (native fused.cpp choose_scale; reference.choose_scale), 1/4 only where chroma is
    subsampled alike in both directions (min_scale). The GPU kernel reproduces that reduction
    (gpu_resize.cu reduced_rgb) so that both devices give the same pixels. int64 (n,)."""
    win = np.asarray(windows, np.float64).reshape(-1, 4)
    css = np.asarray(css, np.int64).reshape(len(win))
    out_h, out_w = size
    min_m = np.where(np.isin(css, ONE_WAY), 4, 2)
    red = np.ones(len(win), np.int64)
    for m in (4, 2):  # the smaller M wins
        fits = (m >= min_m) & (win[:, 3] * m / 8.0 >= out_w * margin) & (win[:, 2] * m / 8.0 >= out_h * margin)
        red = np.where(fits, 8 // m, red)
    return red


def chroma_reduction(hs, vs, red):
    """libjpeg's chroma IDCT for luma decoded at 1 / red (jdmaster.c: a component's DCT scaled
    size doubles while its sampling ratio allows, so it needs less upsampling): the chroma
    plane's reduction k and the upsampling (uh, uv) left — gpu_resize.cu chroma_scaling."""
    m = 8 // int(red)
    size = m
    while size < 8 and (hs * m) % (size * 2) == 0 and (vs * m) % (size * 2) == 0:
        size *= 2
    return 8 // size, hs * m // size, vs * m // size


def plan_rois(windows, widths, heights, css, size, red=None) -> np.ndarray:
    """Regions (x, y, w, h), int64 (n, 4), for windows (n, 4) (y, x, h, w) in source pixels of
    images widths × heights with nvJPEG chroma codes `css` (SUBSAMPLING's keys), resampled to
    `size` (out_h, out_w), each from the image reduced by `red` (dct_reduction; None: 1).
    x is a multiple of 8·hs, y of 8·vs; the region ends on an MCU boundary or at the image's
    edge. The taps stay inside the window's whole-pixel region (buffers.scaled_boxes: the
    kernel clamps them there, as the CPU path and Pillow's crop → resize do); reduced, they are
    the reduced image's, each reading red × red pixels and its chroma means."""
    win = np.asarray(windows, np.float64).reshape(-1, 4)
    n = len(win)
    widths, heights = np.asarray(widths, np.int64).reshape(n), np.asarray(heights, np.int64).reshape(n)
    css = np.asarray(css, np.int64).reshape(n)
    red = np.ones(n, np.int64) if red is None else np.asarray(red, np.int64).reshape(n)
    out_h, out_w = size
    xlo, xhi = tap_span(win[:, 1], win[:, 1] + win[:, 3], widths, out_w)
    ylo, yhi = tap_span(win[:, 0], win[:, 0] + win[:, 2], heights, out_h)
    r = red > 1  # (at full scale the span of the unclamped taps holds the clamped ones)
    if r.any():  # the reduced image's taps, clamped to the window's region there, in source pixels
        from .buffers import scaled_boxes

        box = scaled_boxes(win[r], red[r], widths[r], heights[r])
        f = red[r]
        sw, sh = -(-widths[r] // f), -(-heights[r] // f)
        a, b = tap_span(box[:, 0], box[:, 2], sw, out_w)
        c, d = tap_span(box[:, 1], box[:, 3], sh, out_h)
        a, b = np.maximum(a, box[:, 4].astype(np.int64)), np.minimum(b, box[:, 6].astype(np.int64))
        c, d = np.maximum(c, box[:, 5].astype(np.int64)), np.minimum(d, box[:, 7].astype(np.int64))
        xlo[r], xhi[r] = a * f, np.minimum(b * f, widths[r])
        ylo[r], yhi[r] = c * f, np.minimum(d * f, heights[r])
    rois = np.zeros((n, 4), np.int64)
    for code, (hs, vs) in SUBSAMPLING.items():
        k = np.nonzero(css == code)[0]
        if not len(k):
            continue
        # chroma context: one sample (fancy upsampling's further one), or, reduced, the k
        # samples of a reduced chroma sample's mean and its further neighbour's
        ctx = np.array([max(1, 2 * chroma_reduction(hs, vs, f)[0]) if f > 1 else 1 for f in red[k].tolist()])
        x0, x1 = _axis(xlo[k], xhi[k], widths[k], hs, ctx)
        y0, y1 = _axis(ylo[k], yhi[k], heights[k], vs, ctx)
        rois[k] = np.stack([x0, y0, x1 - x0, y1 - y0], 1)
    if n and (rois[:, 2] <= 0).any():
        raise ValueError(f"chroma codes without a planar layout: {sorted(set(css[rois[:, 2] <= 0].tolist()))}")
    return rois


def chroma_dims(rois, hs, vs) -> tuple:
    """(columns, rows) of a region's chroma planes: its luma size over the subsampling, rounded
    up (its origin is on a chroma sample; at the image's right / bottom edge the last sample
    covers one pixel, as libjpeg's downsampled_width / height)."""
    rois = np.asarray(rois, np.int64).reshape(-1, 4)
    return -(-rois[:, 2] // np.asarray(hs)), -(-rois[:, 3] // np.asarray(vs))


def window_need(windows, widths, heights, chroma, size, regions) -> np.ndarray:
    """Arena bytes each window's planes take (PlaneLayout's `total`): the region plan_rois
    gives it at the CPU path's DCT reduction where `regions` (bool per window: its decoder
    decodes regions, GPUDecoder.planar_regions; one bool for all) says so, else its image's
    whole planes.
    windows: (n, 4) (y, x, h, w); widths, heights, chroma: its image's (format.jpeg.CHROMA_*;
    the planar layouts only); size: the output (h, w)."""
    w, h = np.asarray(widths, np.int64).reshape(-1), np.asarray(heights, np.int64).reshape(-1)
    css = np.asarray(chroma, np.int64).reshape(-1)
    dims = np.zeros((len(w), 8), np.int64)
    dims[:, 0], dims[:, 1] = w, h
    dims[:, 2:4] = planar_subsampling(css)
    red = dct_reduction(windows, css, size)
    regions = np.broadcast_to(np.asarray(regions, bool), (len(w),))
    return PlaneLayout(dims, plan_rois(windows, w, h, css, size, red=red), regions).total
