"""Where chroma="interpolate" decodes each image: the region of interest whose planar YCbCr
holds everything the kernel reads for its window, so nvJPEG decodes (and writes) that region
instead of the whole image. Pure NumPy: CI tests it without a GPU.

The region is the window's kernel taps (the antialiased filter reaches past the window's edges
on a downscale), plus one chroma sample of context each way (libjpeg's fancy upsampling of a
pixel takes its nearer and its further chroma sample), aligned outward to MCU boundaries (what
a JPEG decoder decodes anyway: the region's chroma plane then starts on a chroma sample) and
clamped to the image. The kernel reads the region's planes at its offset with the whole
image's coordinates and edge rules (struct Sample's ox / oy), so its pixels are those of a
whole-image decode, bit for bit, as long as the decoder's region planes equal the whole
image's planes there (tests/test_gpu.py checks that on the device).
"""
from __future__ import annotations

import numpy as np

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


def _axis(lo, hi, size, sub):
    """Extend [lo, hi) by one chroma sample each way (sub = 2) and align it outward to the MCU
    (8·sub pixels), clamped to [0, size)."""
    if sub == 2:
        csize = -(-size // 2)
        c0 = np.maximum((lo >> 1) - 1, 0)
        c1 = np.minimum(((hi - 1) >> 1) + 2, csize)  # exclusive
        lo, hi = 2 * c0, np.minimum(2 * c1, size)
    mcu = 8 * sub
    return lo // mcu * mcu, np.minimum(-(-hi // mcu) * mcu, size)


def plan_rois(windows, widths, heights, css, size) -> np.ndarray:
    """Regions (x, y, w, h), int64 (n, 4), for windows (n, 4) (y, x, h, w) in source pixels of
    images widths × heights with nvJPEG chroma codes `css` (SUBSAMPLING's keys), resampled to
    `size` (out_h, out_w). x is a multiple of 8·hs, y of 8·vs; the region ends on an MCU
    boundary or at the image's edge."""
    win = np.asarray(windows, np.float64).reshape(-1, 4)
    n = len(win)
    widths, heights = np.asarray(widths, np.int64).reshape(n), np.asarray(heights, np.int64).reshape(n)
    css = np.asarray(css, np.int64).reshape(n)
    out_h, out_w = size
    xlo, xhi = tap_span(win[:, 1], win[:, 1] + win[:, 3], widths, out_w)
    ylo, yhi = tap_span(win[:, 0], win[:, 0] + win[:, 2], heights, out_h)
    rois = np.zeros((n, 4), np.int64)
    for code, (hs, vs) in SUBSAMPLING.items():
        k = np.nonzero(css == code)[0]
        if not len(k):
            continue
        x0, x1 = _axis(xlo[k], xhi[k], widths[k], hs)
        y0, y1 = _axis(ylo[k], yhi[k], heights[k], vs)
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
