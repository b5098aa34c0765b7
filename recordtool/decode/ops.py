"""CPU batch ops after the fused decode: the eval transform and mirror (normalize, a native
routine like the decode, is `cpu.normalize`)."""
from __future__ import annotations

import numpy as np

from .cpu import decode_crop_resize, normalize  # noqa: F401  (loader/cpu.py imports normalize from here)
from .windows import center_windows


def eval_transform(buffers, widths, heights, resize: int = 256, crop: int = 224, **kw) -> np.ndarray:
    """Resize shorter side to `resize`, centre crop `crop` — one native crop+resize pass."""
    return decode_crop_resize(buffers, center_windows(widths, heights, resize, crop), size=(crop, crop), **kw)


def mirror(batch: np.ndarray, flags) -> np.ndarray:
    """Flip NHWC images horizontally where flags is true, in place."""
    flags = np.asarray(flags, dtype=bool)
    if flags.any():
        idx = np.nonzero(flags)[0]
        batch[idx] = batch[idx, :, ::-1]
    return batch
