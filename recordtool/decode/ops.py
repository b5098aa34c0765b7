"""CPU batch ops after the fused decode: the eval transform, mirror and normalize."""
from __future__ import annotations


import numpy as np

from . import cpu
from .cpu import decode_crop_resize
from .spec import IMAGENET_MEAN, IMAGENET_STD, bfloat16_bits, name_of
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


def scale_bias(mean, std):
    """(scale, bias) float32 per channel so that pixel · scale + bias = (pixel / 255 - mean) / std."""
    scale = (1.0 / (255.0 * np.asarray(std, np.float32))).astype(np.float32)
    bias = (-np.asarray(mean, np.float32) / np.asarray(std, np.float32)).astype(np.float32)
    return scale, bias


def out_dtype(dtype) -> tuple:
    """(name, numpy dtype of the buffer) of a normalised output type: float32, float16, or
    bfloat16 (its bits in uint16: numpy has no bfloat16)."""
    name = name_of(dtype)
    if name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, not {dtype}")
    return name, np.dtype(np.uint16 if name == "bfloat16" else name)


def normalize(batch: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout: str = "NCHW",
              dtype=np.float32, flips=None, threads: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """(x / 255 - mean) / std per channel (torchvision's units), to NCHW or NHWC float32/float16/
    bfloat16 (bits in uint16); images with flips[n] true are mirrored on the way (saves a separate
    mirror pass); written into `out` when given (C-contiguous, that shape and dtype)."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError("layout must be NCHW or NHWC")
    name, dtype = out_dtype(dtype)
    scale, bias = scale_bias(mean, std)
    n, h, w, _ = batch.shape
    flips = np.zeros(n, bool) if flips is None else np.ascontiguousarray(flips, bool)
    shape = (n, 3, h, w) if layout == "NCHW" else (n, h, w, 3)
    if out is not None and (out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous):
        raise ValueError(f"out must be C-contiguous {dtype} {shape}, got {out.dtype} {out.shape}")
    if cpu._native is not None and batch.dtype == np.uint8:
        out = np.empty(shape, dtype) if out is None else out
        cpu._native.normalize(np.ascontiguousarray(batch), flips, out, scale.tolist(), bias.tolist(),
                              layout == "NCHW", threads or cpu.cores())
        return out
    ref = normalize_reference(batch, scale, bias, layout, name, flips)
    if out is None:
        return ref
    out[...] = ref
    return out


def normalize_reference(batch, scale, bias, layout, dtype, flips):
    """numpy reference of the native normalize (and the path without the extension); dtype
    "bfloat16" gives its bits as uint16."""
    x = batch.astype(np.float32)
    if flips.any():
        x[flips] = x[flips, :, ::-1]
    x *= scale
    x += bias
    if layout == "NCHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    if str(dtype) == "bfloat16":
        return bfloat16_bits(x)
    return x.astype(dtype, copy=False)
