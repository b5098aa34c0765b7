"""`OutputSpec`: what the decode stage writes — output side, normalisation, element type, layout
and memory format — validated once where a user hands it in (the `Loader`, a `GPUDecoder`
caller) into a frozen value that every layer below (batchers, decoders, rings, kernels) trusts.

Which outputs are free: every one. The fused CPU pass and the GPU kernel write each element
straight in its final type and place (no second pass): NCHW, NHWC, float32, float16, bfloat16.
`memory_format="channels_last"` (layout NCHW only) writes the batch in NHWC order and hands it
out as its NCHW-shaped view (`x.permute(0, 3, 1, 2)`: torch's channels_last tensor, what a
model converted with `.to(memory_format=torch.channels_last)` takes without a copy).

bfloat16 has no numpy or CuPy dtype: its buffers hold the bit patterns as uint16
(`storage_dtype`); the Loader hands torch tensors out as torch.bfloat16 (a dtype view, no copy)
and numpy / CuPy arrays as those uint16 bits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

MAX_SIDE = 16384  # output sides above this are refused (the batch would not fit in memory anyway)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

DTYPES = ("float32", "float16", "bfloat16", "uint8")  # uint8: pixels, not normalised
LAYOUTS = ("NCHW", "NHWC")
MEMORY_FORMATS = ("contiguous", "channels_last")


def name_of(value) -> str:
    """A dtype / memory format given as a string, a numpy dtype or a torch object → its name
    ('float16', np.float16, torch.float16 → 'float16'; torch.channels_last → 'channels_last')."""
    if isinstance(value, str):
        return value
    text = str(value)
    if text.startswith("torch."):
        return {"contiguous_format": "contiguous", "half": "float16", "float": "float32"}.get(text[6:], text[6:])
    try:
        return np.dtype(value).name
    except TypeError:
        return text


def _side(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= MAX_SIDE:
        raise ConfigError(f"{what} must be an integer in 1..{MAX_SIDE}, not {v!r}")
    return int(v)


def _triple(v, what: str, positive: bool) -> tuple:
    try:
        t = tuple(float(x) for x in v)
    except (TypeError, ValueError):
        t = ()
    if len(t) != 3 or not all(math.isfinite(x) for x in t) or (positive and not all(x > 0 for x in t)):
        raise ConfigError(f"{what} needs 3 finite numbers{' > 0' if positive else ''} (one per RGB channel), "
                          f"not {v!r}")
    return t


@dataclass(frozen=True)
class OutputSpec:
    """The output of a decode: batches of `size` images, (x / 255 - mean) / std per channel.

    Args:
        size: output side (int, square) or (h, w), each 1..MAX_SIDE.
        mean, std: per channel, 0..1 units (torchvision's); std > 0. Unused for uint8.
        dtype: "float32", "float16", "bfloat16" (normalised), or "uint8" (pixels); numpy and
            torch dtypes are accepted too.
        layout: the batch's shape: "NCHW" (n, 3, h, w) or "NHWC" (n, h, w, 3).
        memory_format: "contiguous", or "channels_last" (NCHW shape in NHWC memory; layout
            NCHW only); torch.contiguous_format / torch.channels_last are accepted too.
    """

    size: tuple = (224, 224)
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    dtype: str = "float32"
    layout: str = "NCHW"
    memory_format: str = "contiguous"

    def __post_init__(self):
        size = self.size
        if isinstance(size, (tuple, list)) and len(size) == 2:
            size = (_side(size[0], "size (height)"), _side(size[1], "size (width)"))
        else:
            s = _side(size, "size")
            size = (s, s)
        dtype, memory_format = name_of(self.dtype), name_of(self.memory_format)
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be 'NCHW' or 'NHWC', not {self.layout!r}")
        if memory_format not in MEMORY_FORMATS:
            raise ConfigError(f"memory_format must be 'contiguous' or 'channels_last', not {self.memory_format!r}")
        if memory_format == "channels_last" and self.layout != "NCHW":
            raise ConfigError("memory_format='channels_last' is for layout='NCHW' (an NHWC batch is already "
                              "channels-last in memory)")
        set_ = object.__setattr__
        set_(self, "size", size)
        set_(self, "mean", _triple(self.mean, "mean", positive=False))
        set_(self, "std", _triple(self.std, "std", positive=True))
        set_(self, "dtype", dtype)
        set_(self, "memory_format", memory_format)

    @property
    def normalized(self) -> bool:
        return self.dtype != "uint8"

    @property
    def buffer_layout(self) -> str:
        """The order the elements are written in: NHWC for NHWC and for channels_last."""
        return "NHWC" if self.layout == "NHWC" or self.memory_format == "channels_last" else "NCHW"

    @property
    def storage_dtype(self) -> np.dtype:
        """The numpy / CuPy dtype of the buffers: uint16 bits for bfloat16."""
        return np.dtype("uint16") if self.dtype == "bfloat16" else np.dtype(self.dtype)

    def buffer_shape(self, n: int) -> tuple:
        """The shape of the memory a batch of n is written into."""
        h, w = self.size
        return (n, 3, h, w) if self.buffer_layout == "NCHW" else (n, h, w, 3)

    def shape(self, n: int) -> tuple:
        """The shape of a batch of n as handed out."""
        h, w = self.size
        return (n, 3, h, w) if self.layout == "NCHW" else (n, h, w, 3)

    def nbytes(self, n: int) -> int:
        return int(np.prod(self.buffer_shape(n))) * self.storage_dtype.itemsize

    def arrange(self, batch):
        """A written batch (numpy, CuPy or torch) as handed out: channels_last's NHWC memory as
        its NCHW-shaped view (no copy); anything else as it is."""
        if self.memory_format != "channels_last":
            return batch
        return batch.permute(0, 3, 1, 2) if hasattr(batch, "permute") else batch.transpose(0, 3, 1, 2)


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


def bfloat16_bits(x) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16), round to nearest even — the reference of the
    native and CUDA conversions (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bfloat16_values(bits) -> np.ndarray:
    """bfloat16 bit patterns (uint16) → their float32 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)
