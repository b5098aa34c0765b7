"""Three compiled per-image ops: RandomGrayscale, Cutout and ColorJitter (brightness, contrast,
saturation) — what a user writes with `ImageOp`.

All three are defined in integer arithmetic (luma and factors in fixed point), so the Numba
function, the CUDA kernel and the NumPy reference give bit-identical pixels (ColorJitter's Numba
function computes those integers in float32, exactly: see its `image`). RandomGrayscale's and
Cutout's references are array code for NumPy and CuPy alike (`reference_on_device`): without
Numba, `ReferenceOp(op)` runs them on the whole batch where it is.
"""
from __future__ import annotations

import numpy as np

from .base import ImageOp
from .batch import _xp, check_number, check_side

# ITU-R 601 luma in 16-bit fixed point (Pillow's convert("L")): (R·19595 + G·38470 + B·7471 + 2^15) >> 16
_LR, _LG, _LB = 19595, 38470, 7471
_Q = 10  # ColorJitter factors in Q10 fixed point
_ONE, _HALF = 1 << _Q, 1 << (_Q - 1)


def _luma(batch: np.ndarray) -> np.ndarray:
    x = batch.astype(np.int64)
    return (x[..., 0] * _LR + x[..., 1] * _LG + x[..., 2] * _LB + 32768) >> 16


class RandomGrayscale(ImageOp):
    """With probability p, an image becomes its luma in all 3 channels (Pillow's integer ITU-R
    601 luma; torchvision's float luma is at most 1 level apart).

    Args:
        p: probability per image.
        seed: mixed into the draws.
    """

    nparams = 1
    cuda_name = "rt_grayscale"
    reference_on_device = True

    def __init__(self, p: float = 0.2, seed: int = 0):
        super().__init__(seed)
        self.p = check_number(p, "RandomGrayscale p", 0, 1)

    def params(self, n, keys, h, w):
        return (self.draws(n, [101], keys)[:, :1] < self.p).astype(np.float64)

    @staticmethod
    def image(img, p):
        if p[0] == 0:
            return
        h, w = img.shape[0], img.shape[1]
        for y in range(h):
            for x in range(w):
                v = (np.int32(img[y, x, 0]) * 19595 + np.int32(img[y, x, 1]) * 38470
                     + np.int32(img[y, x, 2]) * 7471 + 32768) >> 16
                img[y, x, 0] = v
                img[y, x, 1] = v
                img[y, x, 2] = v

    def reference(self, batch, params):
        pick = _xp(batch).asarray(np.nonzero(params[:, 0] != 0)[0])
        if len(pick):
            batch[pick] = _luma(batch[pick]).astype(np.uint8)[..., None]
        return batch

    cuda_source = r'''
extern "C" __global__ void rt_grayscale(unsigned char* batch, int n, int h, int w, const double* params, int k) {
    const int img = blockIdx.y;
    const long long px = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (img >= n || px >= (long long)h * w || params[(long long)img * k] == 0.0) return;
    unsigned char* q = batch + ((long long)img * h * w + px) * 3;
    const int v = (q[0] * 19595 + q[1] * 38470 + q[2] * 7471 + 32768) >> 16;
    q[0] = (unsigned char)v;
    q[1] = (unsigned char)v;
    q[2] = (unsigned char)v;
}
'''


class Cutout(ImageOp):
    """Zero one size×size square per image, centre uniform over the image (DeVries & Taylor),
    clipped at the edges; applied before the mirror (a flipped image's square is mirrored with it).

    Args:
        size: side of the square, whole pixels in [1, 2**31 - 1] (larger than the image: all of it).
        seed: mixed into the draws, an integer ≥ 0.
    """

    nparams = 4  # y0, y1, x0, x1: rows y0..y1-1, columns x0..x1-1
    cuda_name = "rt_cutout"
    reference_on_device = True

    def __init__(self, size: int = 56, seed: int = 0):
        super().__init__(seed)
        self.size = check_side(size, "Cutout size")

    def params(self, n, keys, h, w):
        u = self.draws(n, [102, 103], keys)
        cy, cx = (u[:, 0] * h).astype(np.int64), (u[:, 1] * w).astype(np.int64)
        half = self.size // 2
        return np.stack([np.maximum(0, cy - half), np.minimum(h, cy + half + 1),
                         np.maximum(0, cx - half), np.minimum(w, cx + half + 1)], axis=1).astype(np.float64)

    @staticmethod
    def image(img, p):
        img[int(p[0]):int(p[1]), int(p[2]):int(p[3]), :] = 0

    def reference(self, batch, params):
        p = params.astype(np.int64)
        xp = _xp(batch)
        if xp is np:  # one small slice per image: no full-batch mask on the CPU
            for k, (y0, y1, x0, x1) in enumerate(p):
                batch[k, y0:y1, x0:x1] = 0
            return batch
        return _zero_boxes(xp, batch, xp.asarray(p))  # on the GPU one masked kernel beats n slice launches

    cuda_source = r'''
extern "C" __global__ void rt_cutout(unsigned char* batch, int n, int h, int w, const double* params, int k) {
    const int img = blockIdx.y;
    const long long px = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (img >= n || px >= (long long)h * w) return;
    const double* p = params + (long long)img * k;
    const int y = (int)(px / w), x = (int)(px % w);
    if (y < (int)p[0] || y >= (int)p[1] || x < (int)p[2] || x >= (int)p[3]) return;
    unsigned char* q = batch + ((long long)img * h * w + px) * 3;
    q[0] = 0;
    q[1] = 0;
    q[2] = 0;
}
'''


def _zero_boxes(xp, batch, p):
    """Zero rows p[k, 0]..p[k, 1]-1 × columns p[k, 2]..p[k, 3]-1 of each image k, as one mask."""
    h, w = batch.shape[1:3]
    yy, xx = xp.arange(h)[None, :, None], xp.arange(w)[None, None, :]
    y0, y1, x0, x1 = (p[:, j, None, None] for j in range(4))
    batch[(yy >= y0) & (yy < y1) & (xx >= x0) & (xx < x1)] = 0
    return batch


class ColorJitter(ImageOp):
    """torchvision's ColorJitter(brightness, contrast, saturation) in that fixed order, factors
    uniform in [max(0, 1 − a), 1 + a], in integer arithmetic: factors in Q10 fixed point,
    rounded after each step, clamped to 0..255 after each step; contrast blends with the image's
    mean luma (rounded to an integer) after the brightness step, saturation with each pixel's
    luma. (torchvision: float blends truncated to uint8 and a random order of the three.)

    Args:
        brightness, contrast, saturation: the jitter amplitudes a (0: that step is off, factor 1).
        seed: mixed into the draws.
    """

    nparams = 3  # brightness, contrast, saturation factors × 1024
    fastmath = frozenset({"contract"})  # fused multiply-adds: exact here, every value is below 2**24
    cuda_name = "rt_color_jitter"
    cuda_block_per_image = True

    def __init__(self, brightness: float = 0.4, contrast: float = 0.4, saturation: float = 0.4, seed: int = 0):
        super().__init__(seed)
        self.amp = tuple(check_number(v, f"ColorJitter {k}", 0, 4) for k, v in
                         (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)))

    def params(self, n, keys, h, w):
        u = self.draws(n, [104, 105, 106], keys)
        a = np.asarray(self.amp)
        lo, hi = np.maximum(0.0, 1 - a), 1 + a
        return np.rint((lo + (hi - lo) * u) * _ONE)

    @staticmethod
    def image(img, p):
        # The integer definition (see reference) computed in float32: every intermediate is an
        # integer below 2**24 (factors ≤ 5 × 1024, luma weights sum to 2**16), so float32 holds
        # it exactly, x · 2**-k is exact and truncating a non-negative value is the shift: the
        # same pixels as int32, and SIMD float multiplies are far cheaper than int32 ones. Two
        # passes over the flat bytes with the pixel's channels at constant offsets (3i, 3i + 1,
        # 3i + 2), which LLVM vectorises; every constant float32, so nothing widens to float64.
        n = img.shape[0] * img.shape[1]
        if n == 0:
            return
        f = img.reshape(n * 3)
        fb, fc, fs = np.float32(p[0]), np.float32(p[1]), np.float32(p[2])
        zero, one, h10, h16 = np.float32(0), np.float32(1024), np.float32(512), np.float32(32768)
        q10, q16, top = np.float32(1 / 1024), np.float32(1 / 65536), np.float32(255 * 1024)
        wr, wg, wb = np.float32(19595), np.float32(38470), np.float32(7471)
        total = np.int64(0)
        for i in range(n):  # the mean luma after the brightness step
            r = np.float32(np.int32(min(top, np.float32(f[3 * i]) * fb + h10) * q10))
            g = np.float32(np.int32(min(top, np.float32(f[3 * i + 1]) * fb + h10) * q10))
            b = np.float32(np.int32(min(top, np.float32(f[3 * i + 2]) * fb + h10) * q10))
            total += np.int32((r * wr + g * wg + b * wb + h16) * q16)
        m = np.float32((total + n // 2) // n)
        mc = m * (one - fc) + h10  # contrast: (m·1024 + (x − m)·fc + 512) >> 10 = (x·fc + mc) >> 10
        gs = one - fs  # saturation: (y·1024 + (x − y)·fs + 512) >> 10 = (x·fs + y·gs + 512) >> 10
        for i in range(n):  # brightness again (cheaper than a store and a load), contrast, saturation
            r = np.float32(np.int32(min(top, np.float32(f[3 * i]) * fb + h10) * q10))
            g = np.float32(np.int32(min(top, np.float32(f[3 * i + 1]) * fb + h10) * q10))
            b = np.float32(np.int32(min(top, np.float32(f[3 * i + 2]) * fb + h10) * q10))
            r = np.float32(np.int32(max(zero, min(top, r * fc + mc)) * q10))
            g = np.float32(np.int32(max(zero, min(top, g * fc + mc)) * q10))
            b = np.float32(np.int32(max(zero, min(top, b * fc + mc)) * q10))
            t = np.float32(np.int32((r * wr + g * wg + b * wb + h16) * q16)) * gs + h10
            f[3 * i] = np.uint8(max(zero, min(top, r * fs + t)) * q10)
            f[3 * i + 1] = np.uint8(max(zero, min(top, g * fs + t)) * q10)
            f[3 * i + 2] = np.uint8(max(zero, min(top, b * fs + t)) * q10)

    def reference(self, batch, params):
        f = params.astype(np.int64)[:, None, None, None, :]  # (n, 1, 1, 1, 3)
        x = batch.astype(np.int64)
        x = np.minimum(255, (x * f[..., 0] + _HALF) >> _Q)
        hw = x.shape[1] * x.shape[2]
        m = (_luma(x).sum(axis=(1, 2)) + hw // 2) // hw
        m = m[:, None, None, None]
        x = np.clip((m * _ONE + (x - m) * f[..., 1] + _HALF) >> _Q, 0, 255)
        gray = _luma(x)[..., None]
        x = np.clip((gray * _ONE + (x - gray) * f[..., 2] + _HALF) >> _Q, 0, 255)
        batch[...] = x.astype(np.uint8)
        return batch

    cuda_source = r'''
extern "C" __global__ void rt_color_jitter(unsigned char* batch, int n, int h, int w, const double* params, int k) {
    // one block of 256 threads per image: brightness + the image's luma sum, a block reduction,
    // then contrast and saturation
    __shared__ long long part[256];
    const int img = blockIdx.x;
    if (img >= n) return;  // uniform per block: every thread of the block leaves together
    const double* p = params + (long long)img * k;
    const long long fb = (long long)p[0], fc = (long long)p[1], fs = (long long)p[2];
    const long long hw = (long long)h * w;
    unsigned char* base = batch + (long long)img * hw * 3;
    long long total = 0;
    for (long long px = threadIdx.x; px < hw; px += blockDim.x) {
        unsigned char* q = base + px * 3;
        const long long r = min(255LL, (q[0] * fb + 512) >> 10);
        const long long g = min(255LL, (q[1] * fb + 512) >> 10);
        const long long b = min(255LL, (q[2] * fb + 512) >> 10);
        q[0] = (unsigned char)r;
        q[1] = (unsigned char)g;
        q[2] = (unsigned char)b;
        total += (r * 19595 + g * 38470 + b * 7471 + 32768) >> 16;
    }
    part[threadIdx.x] = total;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const long long m = (part[0] + hw / 2) / hw;
    for (long long px = threadIdx.x; px < hw; px += blockDim.x) {
        unsigned char* q = base + px * 3;
        const long long r = max(0LL, min(255LL, (m * 1024 + (q[0] - m) * fc + 512) >> 10));
        const long long g = max(0LL, min(255LL, (m * 1024 + (q[1] - m) * fc + 512) >> 10));
        const long long b = max(0LL, min(255LL, (m * 1024 + (q[2] - m) * fc + 512) >> 10));
        const long long gray = (r * 19595 + g * 38470 + b * 7471 + 32768) >> 16;
        q[0] = (unsigned char)max(0LL, min(255LL, (gray * 1024 + (r - gray) * fs + 512) >> 10));
        q[1] = (unsigned char)max(0LL, min(255LL, (gray * 1024 + (g - gray) * fs + 512) >> 10));
        q[2] = (unsigned char)max(0LL, min(255LL, (gray * 1024 + (b - gray) * fs + 512) >> 10));
    }
}
'''
