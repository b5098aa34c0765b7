"""numpy reference of native/gpu_resize.cu: the same float math, one sample at a time.

Used by the GPU tests (kernel vs this) and, on CPU-only machines, tested itself against
Pillow's resize so the chain kernel → reference → Pillow holds everywhere.
"""
from __future__ import annotations

import numpy as np


def _axis_weights(in0: float, in1: float, in_size: int, out_size: int) -> np.ndarray:
    """(out_size, in_size) matrix of normalised triangle-filter weights (Pillow's rule)."""
    scale = (in1 - in0) / out_size
    fs = max(scale, 1.0)
    m = np.zeros((out_size, in_size), np.float64)
    for o in range(out_size):
        center = in0 + (o + 0.5) * scale
        lo = max(int(center - fs + 0.5), 0)
        hi = min(int(center + fs + 0.5), in_size)
        x = np.arange(lo, hi)
        w = np.clip(1.0 - np.abs((x - center + 0.5) / fs), 0.0, None)
        if w.sum() > 0:
            w = w / w.sum()
        m[o, lo:hi] = w
    return m


def resize_normalize(region: np.ndarray, box, out_h: int, out_w: int, mirror: bool = False,
                     mean=None, std=None) -> np.ndarray:
    """region (h, w, 3) uint8 → (out_h, out_w, 3) float: resampled, mirrored, normalised."""
    x0, y0, x1, y1 = box
    wx = _axis_weights(x0, x1, region.shape[1], out_w)
    wy = _axis_weights(y0, y1, region.shape[0], out_h)
    chw = region.astype(np.float64).transpose(2, 0, 1)  # (3, h, w): two matrix products per channel
    img = np.matmul(wy, np.matmul(chw, wx.T)).transpose(1, 2, 0)
    if mirror:
        img = img[:, ::-1]
    if mean is not None:  # the kernel's (and the CPU path's) constants: (img / 255 - mean) / std
        from ..spec import scale_bias

        scale, bias = scale_bias(mean, std)
        img = img * scale.astype(np.float64) + bias.astype(np.float64)
    return img


# ------------------------------------------------------------------ planar YCbCr → RGB (chroma="interpolate")
# libjpeg-turbo's decoder after the IDCT (jdsample.c, jdcolor.c), in integers: what the kernel
# does on nvJPEG's planar output so that the GPU gives libjpeg's pixels, not nvJPEG's replicated chroma.

SUBSAMPLING = {0: (1, 1), 1: (2, 1), 2: (2, 2), 3: (1, 2)}
"""(horizontal, vertical) chroma subsampling per nvJPEG chroma code (444, 422, 420, 440)."""


def _fix(x: float) -> int:
    return int(x * 65536 + 0.5)  # jdcolor.c FIX(), SCALEBITS 16


CR_R, CB_B, CR_G, CB_G = _fix(1.40200), _fix(1.77200), _fix(0.71414), _fix(0.34414)  # 91881 116130 46802 22554


def chroma_size(width: int, height: int, hs: int, vs: int) -> tuple:
    """(w, h) of a chroma plane: libjpeg's downsampled_width / height (rounded up)."""
    return -(-width // hs), -(-height // vs)


def _near_far(o: np.ndarray, n_in: int):
    """For full-resolution indices o: the nearer chroma sample, the further one (the previous
    one for even indices, the next for odd, clamped at the plane's edges as libjpeg replicates
    its edge samples) and whether it is odd."""
    near = o >> 1
    odd = (o & 1).astype(bool)
    far = np.clip(np.where(odd, near + 1, near - 1), 0, n_in - 1)
    return np.minimum(near, n_in - 1), far, odd


def upsample(plane: np.ndarray, hs: int, vs: int, width: int, height: int) -> np.ndarray:
    """libjpeg-turbo's fancy (triangle-filter) upsampling of one chroma plane to width × height,
    bit for bit: h2v1 (3·near + far + 1|2) >> 2, h1v2 the same down the rows, h2v2 column sums
    3·near + far then (3·this + other + 8|7) >> 4; planes of ≤ 2 columns are replicated
    horizontally (libjpeg's rule: fancy only when downsampled_width > 2), and h2v2 then also
    vertically."""
    ch, cw = plane.shape
    return upsample_region(plane, hs, vs, np.arange(width), np.arange(height), cw, ch)


def upsample_region(plane: np.ndarray, hs: int, vs: int, xs, ys, cw: int, ch: int, cx0: int = 0,
                    cy0: int = 0) -> np.ndarray:
    """`upsample` at the full-resolution columns xs and rows ys of an image whose chroma plane
    is cw × ch, from the part of that plane starting at chroma sample (cx0, cy0) (`plane`: what
    a region decode gives, chroma="interpolate"'s windowed planes). Edge rules are the whole
    plane's: the kernel's chroma_at with a region offset."""
    xs, ys = np.asarray(xs, np.int64), np.asarray(ys, np.int64)
    p = plane.astype(np.int64)
    if hs == 1 and vs == 1:
        return plane[np.ix_(ys - cy0, xs - cx0)].copy()
    if hs == 2 and cw <= 2:  # h2v1_upsample / h2v2_upsample: plain replication
        cols = np.minimum(xs >> 1, cw - 1) - cx0
        rows = np.minimum(ys >> (vs - 1), ch - 1) - cy0
        return plane[np.ix_(rows, cols)].copy()
    if vs == 2:
        near, far, odd = _near_far(ys, ch)
        colsum = 3 * p[near - cy0] + p[far - cy0]  # (len(ys), plane columns)
        if hs == 1:
            return ((colsum[:, xs - cx0] + np.where(odd, 2, 1)[:, None]) >> 2).astype(np.uint8)
    else:
        colsum = p[ys - cy0]
    near, far, odd = _near_far(xs, cw)
    near, far = near - cx0, far - cx0
    if vs == 2:  # h2v2
        return ((3 * colsum[:, near] + colsum[:, far] + np.where(odd, 7, 8)[None, :]) >> 4).astype(np.uint8)
    return ((3 * colsum[:, near] + colsum[:, far] + np.where(odd, 2, 1)[None, :]) >> 2).astype(np.uint8)  # h2v1


def ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """libjpeg's YCbCr → RGB (jdcolor.c ycc_rgb_convert: 16-bit fixed point, range-limited)."""
    y = y.astype(np.int64)
    xb, xr = cb.astype(np.int64) - 128, cr.astype(np.int64) - 128
    r = y + ((CR_R * xr + 32768) >> 16)
    g = y + ((-CB_G * xb + 32768 - CR_G * xr) >> 16)
    b = y + ((CB_B * xb + 32768) >> 16)
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def planes_to_rgb(y: np.ndarray, cb=None, cr=None, hs: int = 1, vs: int = 1) -> np.ndarray:
    """The RGB image libjpeg-turbo (fancy upsampling, the default) makes from these decoded
    planes: y (h, w); cb, cr at their subsampled sizes (chroma_size), None for grayscale."""
    h, w = y.shape
    if cb is None:
        return np.repeat(y[:, :, None], 3, axis=2)
    return ycc_to_rgb(y, upsample(cb, hs, vs, w, h), upsample(cr, hs, vs, w, h))


def region_planes_to_rgb(y: np.ndarray, cb, cr, hs: int, vs: int, roi, width: int, height: int, xs=None,
                         ys=None) -> np.ndarray:
    """What the kernel makes of a region's planes (chroma="interpolate", windowed): RGB at image
    columns xs × rows ys (default: the whole region) of a width × height image, from the planes
    of its region roi = (x, y, w, h): y (h, w) and cb, cr starting at chroma sample (x / hs,
    y / vs), None for grayscale — with the whole image's upsampling edges, so equal to
    planes_to_rgb(whole planes)[ys][:, xs] wherever the region holds the chroma samples those
    pixels take (gpu.roi.plan_rois makes sure it does for every pixel the kernel reads)."""
    rx, ry, rw, rh = (int(v) for v in roi)
    xs = np.arange(rx, rx + rw) if xs is None else np.asarray(xs, np.int64)
    ys = np.arange(ry, ry + rh) if ys is None else np.asarray(ys, np.int64)
    luma = y[np.ix_(ys - ry, xs - rx)]
    if cb is None:
        return np.repeat(luma[:, :, None], 3, axis=2)
    cw, ch = chroma_size(width, height, hs, vs)
    up = [upsample_region(c, hs, vs, xs, ys, cw, ch, rx // hs, ry // vs) for c in (cb, cr)]
    return ycc_to_rgb(luma, *up)
