"""Crop windows and flips from the index's sizes alone, reproducible per sample.

Each sample's random numbers come from a counter-based hash of (seed, epoch, sample id,
draw number) — splitmix64 — so a window never depends on thread count, batch composition,
order of evaluation or device. The rule is torchvision's RandomResizedCrop.get_params.
"""
from __future__ import annotations

import math

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ATTEMPTS = 10
_DRAWS = 4  # per attempt: area, log-ratio, row, column
_FLIP_DRAW = _ATTEMPTS * _DRAWS  # counter used for the horizontal flip


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _keys(ids, seed: int, epoch: int) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        k = _mix(np.uint64(seed & (2**64 - 1)) ^ np.uint64(0x5EED5EED5EED5EED))
        k = _mix(k + np.uint64(epoch & (2**64 - 1)) * _GOLDEN)
        return _mix(k + ids * _GOLDEN)


def uniforms(ids, seed: int, epoch: int, draws) -> np.ndarray:
    """U[0, 1) of shape (len(ids), len(draws)): draw d of sample id under (seed, epoch)."""
    keys = _keys(ids, seed, epoch)[:, None]
    d = np.asarray(draws, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        x = _mix(keys + (d + np.uint64(1)) * _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def random_windows(widths, heights, ids, seed: int, epoch: int, scale=(0.08, 1.0),
                   ratio=(3 / 4, 4 / 3)) -> np.ndarray:
    """RandomResizedCrop windows (y, x, h, w), int64 (N, 4), in source pixels.

    Area uniform in `scale` × image area, aspect log-uniform in `ratio`, 10 attempts, else a
    centre crop clamped to the ratio range — torchvision's rule, vectorised.
    """
    W = np.asarray(widths, dtype=np.int64)
    H = np.asarray(heights, dtype=np.int64)
    n = len(W)
    if len(H) != n or len(ids) != n:
        raise ValueError("widths, heights and ids must have the same length")
    if n == 0:
        return np.zeros((0, 4), np.int64)
    u = uniforms(ids, seed, epoch, range(_ATTEMPTS * _DRAWS)).reshape(n, _ATTEMPTS, _DRAWS)
    area = (W * H).astype(np.float64)[:, None]
    target = area * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(lr0 + (lr1 - lr0) * u[..., 1])
    w = np.round(np.sqrt(target * aspect)).astype(np.int64)  # round half to even, like Python's round
    h = np.round(np.sqrt(target / aspect)).astype(np.int64)
    ok = (w > 0) & (w <= W[:, None]) & (h > 0) & (h <= H[:, None])
    first = np.argmax(ok, axis=1)
    found = ok[np.arange(n), first]
    rows = np.arange(n)
    wa, ha = w[rows, first], h[rows, first]
    i = np.floor(u[rows, first, 2] * (H - ha + 1)).astype(np.int64)
    j = np.floor(u[rows, first, 3] * (W - wa + 1)).astype(np.int64)
    # fallback: centre crop clamped to the ratio range
    in_ratio = W / H
    lo, hi = min(ratio), max(ratio)
    fw = np.where(in_ratio < lo, W, np.where(in_ratio > hi, np.round(H * hi).astype(np.int64), W))
    fh = np.where(in_ratio < lo, np.round(W / lo).astype(np.int64), H)
    fi, fj = (H - fh) // 2, (W - fw) // 2
    out = np.empty((n, 4), np.int64)
    out[:, 0] = np.where(found, i, fi)
    out[:, 1] = np.where(found, j, fj)
    out[:, 2] = np.where(found, ha, fh)
    out[:, 3] = np.where(found, wa, fw)
    return out


def random_flips(ids, seed: int, epoch: int, p: float = 0.5) -> np.ndarray:
    """Horizontal-flip decisions, bool (N,), keyed like the windows (independent draws)."""
    return uniforms(ids, seed, epoch, [_FLIP_DRAW])[:, 0] < p


def center_windows(widths, heights, resize=256, crop=224) -> np.ndarray:
    """Eval transform as one window: resize + centre crop, mapped back to source pixels.
    float64 (N, 4) (y, x, h, w) — fractional, resampled in one pass.

    Args:
        resize: an int — torchvision's Resize(resize): the shorter side to `resize`, the longer
            to int(resize · long / short); or (rh, rw) — the image scaled, keeping its aspect,
            to cover rh × rw: the side that binds gets its length exactly, the other is
            truncated as torchvision truncates (timm's ResizeKeepRatio, with torchvision's int()).
            (r, r) is Resize(r).
        crop: CenterCrop's side (int) or (h, w); the window is cut to the resized image where
            the crop is larger.
    """
    W = np.asarray(widths, dtype=np.float64)
    H = np.asarray(heights, dtype=np.float64)
    ch, cw = (crop, crop) if np.isscalar(crop) else (crop[0], crop[1])
    bh, bw = (resize, resize) if np.isscalar(resize) else (resize[0], resize[1])
    x_binds = bw * H >= bh * W  # bw / W ≥ bh / H, exact in integers (a square box: W ≤ H)
    rw = np.where(x_binds, bw, np.floor(bh * W / H))  # torchvision: int(size * long / short)
    rh = np.where(x_binds, np.floor(bw * H / W), bh)
    sx, sy = W / rw, H / rh
    top = np.round((rh - ch) / 2.0)
    left = np.round((rw - cw) / 2.0)
    out = np.empty((len(W), 4), np.float64)
    out[:, 0] = np.clip(top * sy, 0, None)
    out[:, 1] = np.clip(left * sx, 0, None)
    out[:, 2] = np.minimum(ch * sy, H - out[:, 0])
    out[:, 3] = np.minimum(cw * sx, W - out[:, 1])
    return out
