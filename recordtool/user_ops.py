"""Two example user ops for `Loader(user_op=...)`: plain array code, no C++.

Each takes a uint8 NHWC batch (numpy on the CPU loader, CuPy on the GPU loader — the same
code runs on both through the array module) and returns it. Randomness is keyed like the crop
windows: pass the batch's sample ids and the epoch for reproducible augmentation.
"""
from __future__ import annotations

import numpy as np

from .decode.windows import uniforms


def _xp(batch):
    try:
        import cupy

        return cupy.get_array_module(batch)
    except ImportError:
        return np


class KeyedOp:
    """Base of ops whose randomness is keyed like the crop windows. The Loader sets `ids` (the
    batch's sample ids) and `epoch` before each call; without them, batch positions are used."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.ids, self.epoch = None, 0

    def draws(self, n: int, counters) -> np.ndarray:
        ids = np.arange(n) if self.ids is None else self.ids
        return uniforms(ids, self.seed, self.epoch, counters)


class RandomGrayscale(KeyedOp):
    """With probability p, replace an image by its luma (ITU-R 601, as torchvision), 3 channels."""

    def __init__(self, p: float = 0.2, seed: int = 0):
        super().__init__(seed)
        self.p = p

    def __call__(self, batch):
        xp = _xp(batch)
        pick = np.nonzero(self.draws(batch.shape[0], [101])[:, 0] < self.p)[0]
        if len(pick):
            sel = batch[xp.asarray(pick)].astype(xp.float32)
            gray = sel[..., 0] * 0.299 + sel[..., 1] * 0.587 + sel[..., 2] * 0.114
            batch[xp.asarray(pick)] = xp.clip(xp.rint(gray), 0, 255).astype(xp.uint8)[..., None]
        return batch


class Cutout(KeyedOp):
    """Zero one size×size square per image, centre uniform over the image (DeVries & Taylor)."""

    def __init__(self, size: int = 56, seed: int = 0):
        super().__init__(seed)
        self.size = size

    def __call__(self, batch):
        xp = _xp(batch)
        n, h, w = batch.shape[:3]
        u = self.draws(n, [102, 103])
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
