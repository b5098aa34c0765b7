"""Two example user ops for `Loader(user_op=...)`: plain array code, no C++.

A user op takes a uint8 NHWC batch (numpy on the CPU loader, CuPy on the GPU loader — the same
code runs on both through the array module) and returns it. Ops whose randomness must be
reproducible subclass `KeyedOp`: the Loader then calls `op(batch, keys)` with the batch's
`BatchKeys` (sample ids, epoch, seed), so their draws are keyed like the crop windows — a pure
function of (seed, epoch, sample id) whatever the producer threads. The op object itself holds
no per-batch state: several producers call it at the same time.
"""
from __future__ import annotations

import sys

import numpy as np

from ..decode.windows import uniforms
from ..checks import bounded_float, bounded_int

MAX_SIDE = 2**31 - 1  # a square side bound (larger than any image: it covers the whole image)


def check_seed(seed, op: str) -> int:
    """An op's seed: an integer ≥ 0 (Python or NumPy, not a bool) — checked when the op is made,
    not by the first batch inside a producer thread. ConfigError names the op."""
    return bounded_int(f"{op}: seed", seed, 0)


def check_number(value, what: str, low: float, high: float) -> float:
    """A finite real number in [low, high] (not a bool, not a string), or ConfigError naming it."""
    return bounded_float(what, value, low, high)


def check_side(value, what: str) -> int:
    """A whole number of pixels in [1, MAX_SIDE] (an integral float such as 32.0 is taken;
    1.5, inf, nan, a string are not), or ConfigError naming it."""
    return bounded_int(what, value, 1, MAX_SIDE)


def _xp(batch):
    """The array module of `batch`: CuPy for a CuPy array, else NumPy. Told by the array's type,
    never by trying `import cupy`: ops run on the producer threads, and where CuPy is not
    installed each failed import takes the import system's lock for "cupy" again — a process
    forked meanwhile (a fork DataLoader worker) would find it held for good."""
    if type(batch).__module__.split(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


class KeyedOp:
    """Base of ops whose randomness is keyed like the crop windows: called `op(batch, keys)`.

    Args:
        seed: mixed into the op's draws (beside the loader's seed in `keys`).
    """

    keyed = True  # the Loader passes BatchKeys with each call

    def __init__(self, seed: int = 0):
        self.seed = check_seed(seed, type(self).__name__)

    def draws(self, n: int, counters, keys=None) -> np.ndarray:
        """U[0, 1) (n, len(counters)) keyed by (seed, keys.seed, keys.epoch, keys.ids); without
        keys (a direct call), by batch position and epoch 0."""
        if keys is None:
            return uniforms(np.arange(n), self.seed, 0, counters)
        return uniforms(keys.ids, self.seed ^ (int(keys.seed) * 0x9E3779B1), keys.epoch, counters)

    def __call__(self, batch, keys=None):
        raise NotImplementedError


class RandomGrayscale(KeyedOp):
    """With probability p, replace an image by its luma (ITU-R 601, as torchvision), 3 channels."""

    def __init__(self, p: float = 0.2, seed: int = 0):
        super().__init__(seed)
        self.p = check_number(p, "RandomGrayscale p", 0, 1)

    def __call__(self, batch, keys=None):
        xp = _xp(batch)
        pick = np.nonzero(self.draws(batch.shape[0], [101], keys)[:, 0] < self.p)[0]
        if len(pick):
            sel = batch[xp.asarray(pick)].astype(xp.float32)
            gray = sel[..., 0] * 0.299 + sel[..., 1] * 0.587 + sel[..., 2] * 0.114
            batch[xp.asarray(pick)] = xp.clip(xp.rint(gray), 0, 255).astype(xp.uint8)[..., None]
        return batch


class Cutout(KeyedOp):
    """Zero one size×size square per image, centre uniform over the image (DeVries & Taylor)."""

    def __init__(self, size: int = 56, seed: int = 0):
        super().__init__(seed)
        self.size = check_side(size, "Cutout size")

    def __call__(self, batch, keys=None):
        xp = _xp(batch)
        n, h, w = batch.shape[:3]
        u = self.draws(n, [102, 103], keys)
        cy = (u[:, 0] * h).astype(np.int64)
        cx = (u[:, 1] * w).astype(np.int64)
        half = self.size // 2
        if xp is np:  # one small slice per image: no full-batch mask on the CPU
            for k in range(n):
                batch[k, max(0, cy[k] - half):cy[k] + half + 1, max(0, cx[k] - half):cx[k] + half + 1] = 0
            return batch
        yy = xp.arange(h)[None, :, None]  # on the GPU one masked kernel beats n slice launches
        xx = xp.arange(w)[None, None, :]
        cy, cx = xp.asarray(cy)[:, None, None], xp.asarray(cx)[:, None, None]
        mask = (xp.abs(yy - cy) <= half) & (xp.abs(xx - cx) <= half)
        batch[mask] = 0
        return batch
