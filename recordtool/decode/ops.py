"""CPU batch ops after the fused decode: the eval transform and mirror (normalize, a native
routine like the decode, is `cpu.normalize`)."""
from __future__ import annotations

import numpy as np

from .cpu import decode_crop_resize, normalize  # noqa: F401  (loader/cpu.py imports normalize from here)
from .windows import center_windows


def eval_transform(buffers, widths, heights, resize=256, crop=224, **kw) -> np.ndarray:
    """Resize (shorter side to `resize`, or to cover (rh, rw): center_windows), centre crop
    `crop` (side or (h, w)) — one native crop+resize pass."""
    size = (crop, crop) if np.isscalar(crop) else tuple(crop)
    return decode_crop_resize(buffers, center_windows(widths, heights, resize, crop), size=size, **kw)


def mirror(batch: np.ndarray, flags) -> np.ndarray:
    """Flip NHWC images horizontally where flags is true, in place."""
    flags = np.asarray(flags, dtype=bool)
    if flags.any():
        idx = np.nonzero(flags)[0]
        batch[idx] = batch[idx, :, ::-1]
    return batch
