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
    if mean is not None:
        img = (img / 255.0 - np.asarray(mean)) / np.asarray(std)
    return img
