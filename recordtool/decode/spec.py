"""`Output`: what the decode stage writes — output side, normalisation, element type, layout
and memory format — validated once where a user hands it in (the `Loader`, a `GPUDecoder`
caller) into a frozen value that every layer below (backends, decoders, rings, kernels) trusts.

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

from ..checks import bounded_int
from ..errors import ConfigError

MAX_OUTPUT_SIDE = 16384  # a decoded image's output side: larger is refused (its batch would not fit in memory)
SCALE_MARGIN = 1.1
"""The CPU path decodes a window at libjpeg's DCT scale M/8 only while the scaled window stays
≥ SCALE_MARGIN × the output (native fused.cpp choose_scale, which says why 1.1); the GPU kernel
reproduces the same reduction (decode.gpu.roi.dct_reduction)."""
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
    return bounded_int(what, v, 1, MAX_OUTPUT_SIDE, floats=False)


MAX_NORMALISED = 1000.0
"""The largest magnitude (x / 255 - mean) / std may reach, x a 0..255 pixel: four times the raw
pixel scale (mean 0, std 1/255: the pixel values themselves as floats), far beyond the unit scale
models take. Every output dtype holds it (float16's largest finite value is 65504), so a checked
Output never writes inf or NaN."""
_FINITE_MAX = {"float32": float(np.finfo(np.float32).max), "float16": float(np.finfo(np.float16).max),
               "bfloat16": 3.3895313892515355e38}


def _triple(v, what: str, positive: bool) -> tuple:
    try:
        t = tuple(float(x) for x in v)
    except (TypeError, ValueError):
        t = ()
    if len(t) != 3 or not all(math.isfinite(x) for x in t) or (positive and not all(x > 0 for x in t)):
        raise ConfigError(f"{what} needs 3 finite numbers{' > 0' if positive else ''} (one per RGB channel), "
                          f"not {v!r}")
    return t


def _units(mean: tuple, std: tuple) -> str:
    """The fix for mean / std given in 0-255 units (DALI's, OpenCV's): the values divided by
    255 — of each of the two that is past 1 with all three values in 1..255; "" when either
    past 1 is not such (so no advice that would make a wrong value another wrong one)."""
    past = [(what, t) for what, t in (("mean", mean), ("std", std)) if max(t) > 1]
    if min(mean) < 0 or not all(1 < x <= 255 for _, t in past for x in t):
        return ""
    scaled = [f"{what}=({', '.join(f'{x / 255:.6g}' for x in t)})" for what, t in past]
    return f"; values in 0-255 units (DALI's, OpenCV's): divide them by 255, {', '.join(scaled)}"


def check_normalisation(mean: tuple, std: tuple, dtype: str) -> None:
    """ConfigError unless (x / 255 - mean) / std, x a 0..255 pixel, is a normalisation: mean in
    0..1 and std ≤ 1 (0-1 units, torchvision's Normalize; 0-255 units are refused with the values
    to pass instead), and the values within ±MAX_NORMALISED — so finite in every dtype."""
    units = "mean and std are in 0-1 units, as torchvision's Normalize takes them: (x / 255 - mean) / std"
    if not all(0.0 <= m <= 1.0 for m in mean):
        raise ConfigError(f"mean={mean} is outside 0..1: {units}{_units(mean, std)}")
    if max(std) > 1.0:
        raise ConfigError(f"std={std} is above 1: a channel's values would span only {1 / max(std):.3g}, nearly "
                          f"constant batches (the std of pixels in 0-1 units is at most 0.5; 1 leaves them unscaled): "
                          f"{units}{_units(mean, std)}")
    reach = max(max(m, 1.0 - m) / s for m, s in zip(mean, std))
    if reach > MAX_NORMALISED:
        limit = _FINITE_MAX.get(dtype, math.inf)
        beyond = f", beyond {dtype}'s largest finite value {limit:g} (inf or NaN in the batch)" if reach > limit else ""
        raise ConfigError(f"std={std} is too small: (x / 255 - mean) / std would reach {reach:.3g}{beyond}; the "
                          f"values may reach ±{MAX_NORMALISED:g} at most (std 1/255 with mean 0 gives the pixels "
                          f"as they are, 0..255)")


@dataclass(frozen=True)
class Output:
    """What a batch looks like: `size` images, (x / 255 - mean) / std per channel, written in
    `dtype`, `layout` and `memory_format`. Frozen and hashable; every field is checked once
    here (ConfigError naming it), and every layer below (backends, decoders, rings, kernels)
    trusts it.

    Args:
        size: 224 — the output side, an int (square, size × size) or (h, w), each 1..MAX_OUTPUT_SIDE:
            what torchvision's RandomResizedCrop(size) / CenterCrop(size) take; 224 is the
            ImageNet models' input. Stored as (h, w).
        mean: IMAGENET_MEAN — per channel (R, G, B), 0-1 units (torchvision's Normalize), each
            in 0..1: ImageNet's, what pretrained models expect. Unused for uint8, checked still.
        std: IMAGENET_STD — per channel, 0-1 units, each in 0..1 (the std of 0..1 pixels is at
            most 0.5; 1 leaves them unscaled) and not so small that a value passes
            ±MAX_NORMALISED (1000): ImageNet's. So every normalisation in use is taken —
            ImageNet's, CLIP's, (0.5, 0.5, 0.5), mean 0 with std 1 (pixels in 0..1) or 1/255 (the
            pixels as they are) — and every value is finite in every dtype (float16's largest is
            65504). DALI's and OpenCV's 0-255 units (mean=(123.675, 116.28, 103.53)) are refused,
            naming the values divided by 255; unchecked they would give near-constant batches.
        dtype: "float32" — "float32", "float16", "bfloat16" (normalised), or "uint8" (pixels,
            for a GPUDecoder; the Loader normalises); numpy and torch dtypes are taken too.
            float32 is what a model takes without autocast; bfloat16 and float16 halve the
            batch's bytes (bfloat16 comes as torch.bfloat16, or as its bits in uint16).
        layout: "NCHW" — the batch's shape: "NCHW" (n, 3, h, w), torch's convention, or
            "NHWC" (n, h, w, 3).
        memory_format: "contiguous" — or "channels_last" (NCHW shape in NHWC memory, layout
            NCHW only: what a model in torch.channels_last takes without a copy);
            torch.contiguous_format / torch.channels_last are taken too. Every combination is
            written directly: none costs a copy.
    """

    size: int | tuple = 224
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
            s = _side(size, "size (an int, or (h, w))")
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
        check_normalisation(self.mean, self.std, dtype)
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


DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3 / 4, 4 / 3)
DEFAULT_HFLIP = 0.5
DEFAULT_CROP_PCT = 0.875  # 224 / 256: torchvision's and timm's evaluation crop
MIN_CROP_PCT = 0.01


def _number(v, what: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(v):
        raise ConfigError(f"{what} must be a finite number, not {v!r}")
    return float(v)


def _pair(v, what: str, low: float, high: float) -> tuple:
    """(lo, hi) with low < lo ≤ hi ≤ high, or ConfigError naming the option. An ordered pair: a
    tuple, list or array — a set or a dict has no order to say which is lo."""
    if not isinstance(v, (tuple, list, np.ndarray)) or len(v) != 2:
        raise ConfigError(f"{what} must be a pair (lo, hi), a tuple or list, not {v!r}")
    lo, hi = _number(v[0], what), _number(v[1], what)
    if not low < lo <= hi <= high:
        raise ConfigError(f"{what} must satisfy {low:g} < lo ≤ hi ≤ {high:g}, not {v!r}")
    return lo, hi


@dataclass(frozen=True)
class TrainCrop:
    """Training augmentation: torchvision's RandomResizedCrop and RandomHorizontalFlip, each
    window and flip keyed by (seed, epoch, sample id). Frozen and hashable; every field is
    checked once here (ConfigError naming it), and the windows of every batch trust it. The
    defaults are torchvision's.

    Args:
        scale: (0.08, 1.0) — the crop's area range, a share of the image's area:
            0 < lo ≤ hi ≤ 1. torchvision's default, the ImageNet recipe's.
        ratio: (3/4, 4/3) — the crop's aspect (width / height) range, drawn log-uniformly:
            0 < lo ≤ hi. torchvision's default. The window does not depend on the output size:
            it is resized to (h, w) whatever its aspect, as torchvision does.
        hflip: 0.5 — the probability of a horizontal flip, 0..1 (RandomHorizontalFlip());
            0 never flips.
    """

    scale: tuple = DEFAULT_SCALE
    ratio: tuple = DEFAULT_RATIO
    hflip: float = DEFAULT_HFLIP

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "scale", _pair(self.scale, "scale", 0.0, 1.0))
        set_(self, "ratio", _pair(self.ratio, "ratio", 0.0, math.inf))
        hflip = _number(self.hflip, "hflip")
        if not 0.0 <= hflip <= 1.0:
            raise ConfigError(f"hflip (the flip probability) must be in 0..1, not {self.hflip!r}")
        set_(self, "hflip", hflip)


@dataclass(frozen=True)
class EvalCrop:
    """Evaluation: resize, keeping the aspect, then the centre crop — the same window for an
    image every epoch, no flip. Frozen and hashable; checked once here (ConfigError naming the
    field).

    Args:
        crop_pct: 0.875 — the centre crop's share of the resized image (timm's crop_pct),
            MIN_CROP_PCT..1 (above 1 the crop would need padding): the image is resized to
            cover floor(h / crop_pct) × floor(w / crop_pct) of the output (h, w) — for a
            square output: its shorter side to floor(size / crop_pct), torchvision's
            Resize(int) — and the centre (h, w) is the output. 0.875 = 224 / 256, the
            evaluation crop of torchvision's and timm's reference scripts.
    """

    crop_pct: float = DEFAULT_CROP_PCT

    def __post_init__(self):
        crop_pct = _number(self.crop_pct, "crop_pct")
        if not MIN_CROP_PCT <= crop_pct <= 1.0:
            raise ConfigError(f"crop_pct must be in {MIN_CROP_PCT:g}..1 (the centre crop's share of the resized "
                              f"image), not {self.crop_pct!r}")
        object.__setattr__(self, "crop_pct", crop_pct)

    def resize(self, size) -> tuple:
        """The resize box (h, w) of an output size (h, w): floor(side / crop_pct), as timm
        computes it (224 at 0.875: 256)."""
        return tuple(math.floor(s / self.crop_pct) for s in size)


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
