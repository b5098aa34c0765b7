"""CPU batch ops after the fused decode: the eval transform, mirror and normalize."""
from __future__ import annotations

import numpy as np

from .cpu import decode_crop_resize
from .windows import center_windows

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


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


def normalize(batch: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout: str = "NCHW",
              dtype=np.float32) -> np.ndarray:
    """(x / 255 - mean) / std per channel (torchvision's units), to NCHW or NHWC float32/float16."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError("layout must be NCHW or NHWC")
    scale = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
    bias = (-np.asarray(mean, np.float32) / np.asarray(std, np.float32)).astype(np.float32)
    x = batch.astype(np.float32)
    x *= scale
    x += bias
    if layout == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x.astype(dtype, copy=False)
