"""How much the GPU decoder's buffers hold (pure NumPy, tested without a GPU): the arena bytes a
window's region or an image's planes take, the staging a batch's JPEGs take, and `batch_room` —
the room a batch of a dataset's records needs. Sized for a batch as the dataset makes one, not
for its `max_batch` largest files at once: on an ImageNet-like set that bound is ten times what
any random batch needs (BENCHMARKS.md's memory table).
"""
from __future__ import annotations

import numpy as np

ALIGN = 256  # arena placement of each decoded window


def region_bytes(w, h) -> np.ndarray:
    """Upper bound of the arena bytes one window of w × h needs (whole-pixel region + alignment)."""
    return ((np.ceil(w) + 1) * (np.ceil(h) + 1) * 3 + 2 * ALIGN).astype(np.int64)


def staging_bytes(lengths) -> int:
    """Pinned bytes a batch of JPEGs of these lengths needs (64-byte aligned slots)."""
    return int(np.sum(np.asarray(lengths, np.int64))) + 64 * len(lengths)


def staging_each(lengths) -> np.ndarray:
    """Pinned bytes each JPEG takes in the staging (its 64-byte aligned slot)."""
    return (np.asarray(lengths, np.int64) + 63) // 64 * 64


# chroma code (format.jpeg.CHROMA_*, nvJPEG's enum) → the planar path's (horizontal, vertical) chroma
# subsampling; (0, 0) gray; (-1, -1) a code it does not take (4:1:1 and the like go elsewhere)
PLANAR_LAYOUT = np.array([(1, 1), (2, 1), (2, 2), (1, 2), (-1, -1), (-1, -1), (0, 0), (-1, -1)], np.int64)


def planar_subsampling(chroma) -> np.ndarray:
    """(n, 2) subsampling of each chroma code by PLANAR_LAYOUT; -1 for a code outside it."""
    c = np.asarray(chroma, np.int64).reshape(-1)
    known = (c >= 0) & (c < len(PLANAR_LAYOUT))
    return np.where(known[:, None], PLANAR_LAYOUT[np.clip(c, 0, len(PLANAR_LAYOUT) - 1)], -1)


def planar_need(widths, heights, chroma=None) -> np.ndarray:
    """Arena bytes each whole image's planes take at its chroma layout (format.jpeg.CHROMA_*
    codes; None or a code the planar path does not take: 4:4:4, the largest) — what
    place_planar places for it at most (a region is a part of them): PlaneLayout's `total`
    for the whole image."""
    w, h = np.asarray(widths, np.int64).reshape(-1), np.asarray(heights, np.int64).reshape(-1)
    dims = np.zeros((len(w), 8), np.int64)
    dims[:, 0], dims[:, 1] = w, h
    hv = np.ones((len(w), 2), np.int64) if chroma is None else planar_subsampling(chroma)
    dims[:, 2:4] = np.where(hv < 0, 1, hv)
    return PlaneLayout(dims).total


def batch_room(need, batch: int) -> int:
    """Bytes that hold any batch of `batch` records whose needs are `need` nearly always: the
    sum of the `batch` largest where that is less (small datasets), else batch × the mean plus
    four standard deviations of a batch's sum plus the largest one — room for the rarest image
    on top of a heavy batch. A batch past it has its last images decoded by the CPU share."""
    need = np.asarray(need, np.float64)
    if not len(need):
        return 0
    top = float(np.sort(need)[::-1][:batch].sum())
    room = batch * need.mean() + 4.0 * need.std() * np.sqrt(batch) + need.max()
    return int(min(top, np.ceil(room)))


def crop_room(need, batch: int, largest: int) -> int:
    """Bytes that hold a batch of `batch` random crops' regions nearly always, where `need` are
    samples of a region's bytes (sample windows' roi.window_need): batch × the mean plus four
    standard deviations of a batch's sum, plus `largest` (the largest whole image's planes) on
    top. Not batch_room's sum of the largest samples: other windows of those images may need
    more."""
    need = np.asarray(need, np.float64)
    if not len(need):
        return int(largest)
    return int(np.ceil(batch * need.mean() + 4.0 * need.std() * np.sqrt(batch))) + int(largest)


class PlaneLayout:
    """The planes place_planar gives each image (see there for dims, rois, regions): the
    region decoded (r: x, y, w, h), the Y and chroma pitches and rows, and the aligned bytes
    (`total` per image: what it takes of the arena)."""

    def __init__(self, dims, rois=None, regions=None):
        d = np.asarray(dims, np.int64).reshape(-1, 8)
        n = len(d)
        w, h, hs, vs = d[:, 0], d[:, 1], d[:, 2], d[:, 3]
        self.w, self.h = w, h
        gray = self.gray = hs == 0
        hs1, vs1 = self.hs1, self.vs1 = np.maximum(hs, 1), np.maximum(vs, 1)
        cw = self.cw = np.where(gray, 0, -(-w // hs1))  # libjpeg's downsampled_width / height
        ch = self.ch = np.where(gray, 0, -(-h // vs1))
        # what nvJPEG's planes exceed libjpeg's by (0 on the files seen): room for it in either mode
        sy_w, sy_h = np.maximum(d[:, 4] - w, 0), np.maximum(d[:, 5] - h, 0)
        sc_w, sc_h = np.maximum(d[:, 6] - cw, 0), np.maximum(d[:, 7] - ch, 0)
        r = self.r = np.stack([np.zeros_like(w), np.zeros_like(w), w, h], 1)
        used = self.used = np.zeros(n, bool) if rois is None else \
            (np.ones(n, bool) if regions is None else np.asarray(regions, bool).reshape(n))
        if used.any():
            r[used] = np.asarray(rois, np.int64).reshape(n, 4)[used]
        self.ypitch, yrows = r[:, 2] + sy_w, r[:, 3] + sy_h
        self.cpitch = np.where(gray, 0, -(-r[:, 2] // hs1) + sc_w)
        crows = np.where(gray, 0, -(-r[:, 3] // vs1) + sc_h)
        self.ysize = (self.ypitch * yrows + ALIGN - 1) // ALIGN * ALIGN
        self.csize = (self.cpitch * crows + ALIGN - 1) // ALIGN * ALIGN
        self.total = self.ysize + 2 * self.csize
