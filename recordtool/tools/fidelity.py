"""Image fidelity measures for `recordtool tune`: PSNR and SSIM of uint8 RGB batches.

SSIM follows Wang, Bovik, Sheikh & Simoncelli (2004), a grayscale measure: an 11×11
Gaussian window of σ 1.5, K1 0.01, K2 0.03, dynamic range 255, population (not sample)
variances, the map averaged over the positions where the window fits entirely ("valid"),
computed on luma (ITU-R BT.601 Y = 0.299 R + 0.587 G + 0.114 B, unrounded). Colour loss
(4:2:0 chroma) shows in the PSNR, taken over all three RGB channels.

`psnr` and `ssim` are scikit-image's `peak_signal_noise_ratio` and `structural_similarity`
(gaussian_weights=True, sigma 1.5, use_sample_covariance=False, data_range=255, on that Y) where
scikit-image is installed — the well-kept implementation —, else `psnr_numpy` / `ssim_numpy`,
the same measures in numpy (tested equal to scikit-image's). `IMPLEMENTATION` says which.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PSNR_CAP = 100.0  # identical images: reported as 100 dB instead of infinity
_K1, _K2, _RANGE = 0.01, 0.03, 255.0
_C1, _C2 = (_K1 * _RANGE) ** 2, (_K2 * _RANGE) ** 2


def gaussian_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    """1-D Gaussian weights summing to 1; the 2-D window is its outer product (separable)."""
    x = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
    g = np.exp(-(x * x) / (2.0 * sigma * sigma))
    return g / g.sum()


def _filter(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Valid 2-D correlation of the last two axes with the separable window g ⊗ g."""
    k = len(g)
    a = sliding_window_view(a, k, axis=-1) @ g
    return sliding_window_view(a, k, axis=-2) @ g


def _skimage():
    try:
        from skimage import __version__
        from skimage.metrics import peak_signal_noise_ratio, structural_similarity
    except ImportError:
        return None
    return __version__, peak_signal_noise_ratio, structural_similarity


_SK = _skimage()
IMPLEMENTATION = f"scikit-image {_SK[0]}" if _SK else "numpy"


def _pairs(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    single = a.ndim == 3
    return (a[None], b[None], single) if single else (a, b, single)


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PSNR in dB per image of two uint8 batches (N, H, W, C) (or one image (H, W, C)), peak 255,
    over all pixels and channels; capped at PSNR_CAP for identical images. scikit-image's where
    installed, else psnr_numpy."""
    if _SK is None:
        return psnr_numpy(a, b)
    a, b, single = _pairs(a, b)
    out = np.array([PSNR_CAP if np.array_equal(x, y) else min(_SK[1](x, y, data_range=_RANGE), PSNR_CAP)
                    for x, y in zip(a, b)], np.float64)
    return out[0] if single else out


def psnr_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PSNR in dB per image of two uint8 batches (N, H, W, C) (or one image (H, W, C)), peak 255,
    over all pixels and channels; capped at PSNR_CAP for identical images."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    single = a.ndim == 3
    a, b = (a[None], b[None]) if single else (a, b)
    d = (a.astype(np.int32) - b.astype(np.int32)).reshape(len(a), -1)  # exact: integer squares and sums
    mse = np.einsum("ij,ij->i", d, d, dtype=np.int64) / d.shape[1]
    with np.errstate(divide="ignore"):
        out = np.minimum(10.0 * np.log10(_RANGE * _RANGE / mse), PSNR_CAP)
    return out[0] if single else out


_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def luma(a: np.ndarray) -> np.ndarray:
    """BT.601 Y of uint8 RGB (..., 3) as float32 (unrounded)."""
    return np.asarray(a, np.float32) @ _LUMA


def ssim(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean SSIM of the luma per image of two uint8 RGB batches (N, H, W, 3) (or one image
    (H, W, 3)): scikit-image's where installed, else ssim_numpy. Sides must be at least 11."""
    if _SK is None:
        return ssim_numpy(a, b)
    a, b, single = _pairs(a, b)
    if min(a.shape[1:3]) < 11:
        raise ValueError(f"images of {a.shape[1]}x{a.shape[2]} are smaller than the 11x11 window")
    out = np.array([_SK[2](luma(x).astype(np.float64), luma(y).astype(np.float64), gaussian_weights=True, sigma=1.5,
                           use_sample_covariance=False, data_range=_RANGE) for x, y in zip(a, b)], np.float64)
    return out[0] if single else out


def ssim_numpy(a: np.ndarray, b: np.ndarray, sigma: float = 1.5, size: int = 11,
               chunk: int | None = None) -> np.ndarray:
    """Mean SSIM of the luma per image of two uint8 RGB batches (N, H, W, 3) (or one image
    (H, W, 3)).

    Args:
        a, b: the two batches; sides must be at least `size`.
        sigma: Gaussian window σ (Wang et al.: 1.5).
        size: window side (Wang et al.: 11).
        chunk: images per step (speed, not results). Default: planes of ≤ 512 KiB, which stay
            below the 1 MiB mmap threshold the native module sets — larger temporaries would
            each be a fresh mapping, page-faulted in and unmapped at every step.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    single = a.ndim == 3
    a, b = (a[None], b[None]) if single else (a, b)
    if min(a.shape[1:3]) < size:
        raise ValueError(f"images of {a.shape[1]}x{a.shape[2]} are smaller than the {size}x{size} window")
    g = gaussian_window(size, sigma).astype(np.float32)
    chunk = chunk or max(1, (512 << 10) // (a.shape[1] * a.shape[2] * 4))
    out = np.empty(len(a))
    for s in range(0, len(a), chunk):
        # centred on 128 so float32 keeps E[x²] − μ² accurate (|x| ≤ 128)
        x, y = luma(a[s:s + chunk]) - 128.0, luma(b[s:s + chunk]) - 128.0
        mx, my = _filter(x, g), _filter(y, g)
        sxx = _filter(x * x, g) - mx * mx
        syy = _filter(y * y, g) - my * my
        sxy = _filter(x * y, g) - mx * my
        mx, my = mx + 128.0, my + 128.0  # the luminance term needs the uncentred means
        num = (2 * mx * my + _C1) * (2 * sxy + _C2)
        den = (mx * mx + my * my + _C1) * (sxx + syy + _C2)
        out[s:s + chunk] = (num / den).astype(np.float64).mean(axis=(1, 2))
    return out[0] if single else out
