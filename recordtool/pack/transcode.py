"""Pack's fix-up stage (`prepare`): a source image's bytes into bytes every decoder of ours
takes, touching as few as possible.

JPEGs that every decoder of ours takes are kept byte for byte. CMYK/YCCK JPEGs, arithmetic-coded
JPEGs (nvJPEG cannot decode them), PNGs (also PNGs named .JPEG) and other formats Pillow opens
are converted to baseline RGB JPEG, as tf-slim's ImageNet converter does. Anything else is
refused with a reason. Optional transcoding (`Transcode`): shrink images over a maximum side
(FFCV's max_resolution), and re-encode what NVIDIA's hardware decoder cannot take as baseline
4:2:0.
"""
from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass

from .. import codec
from ..checks import MAX_SIDE, bounded_int
from ..errors import Rejected
from ..format.jpeg import (DEFAULT_MAX_PIXELS, BadJPEG, CHROMA_410, CHROMA_411, CHROMA_UNKNOWN,
                           JpegInfo, NotJPEG, decode_refusal, probe)
from ..format.schema import MAX_IMAGE_BYTES

CONVERT_QUALITY = 95


@dataclass(frozen=True)
class Transcode:
    max_side: int | None = None  # shrink so the longer side is at most this
    quality: int = CONVERT_QUALITY  # for every re-encode, conversions included
    hw_friendly: bool = False  # re-encode progressive / 4:1:1 / 4:1:0 / odd layouts as baseline 4:2:0

    def __post_init__(self):  # ConfigError for `--max-side -5` (1x1 images before), a quality of 0
        if self.max_side is not None:
            object.__setattr__(self, "max_side", bounded_int("max_side", self.max_side, 1, MAX_SIDE))
        object.__setattr__(self, "quality", bounded_int("quality", self.quality, 1, 100))

    def hw_reason(self, info: JpegInfo) -> str | None:
        if not self.hw_friendly:
            return None
        if info.progressive:
            return "progressive JPEG (hardware decoder: baseline only)"
        if info.chroma in (CHROMA_411, CHROMA_410, CHROMA_UNKNOWN) and info.channels == 3:
            return "chroma layout the hardware decoder cannot take"
        return None


NO_TRANSCODE = Transcode()

# `pack --preset`: settings measured by `recordtool tune` on photos (BENCHMARKS.md, "Speed
# presets"). lossless: JPEG bytes as they are. balanced / fast: shrink to a maximum side and
# re-encode as baseline 4:2:0 (hw_friendly: the smaller progressive / odd-layout files too).
SPEED_PRESETS = {
    "lossless": NO_TRANSCODE,
    "balanced": Transcode(max_side=448, quality=95, hw_friendly=True),
    "fast": Transcode(max_side=320, quality=90, hw_friendly=True),
}


@dataclass
class Prepared:
    data: bytes
    info: JpegInfo
    converted: str | None  # why the bytes were re-encoded, None when copied as-is


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise Rejected(f"declares {width}x{height} = {width * height / 1e6:.1f} Mpx, more than "
                       f"max_pixels {max_pixels / 1e6:.1f} Mpx (decompression bomb?)")


def prepare(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, transcode: Transcode = NO_TRANSCODE) -> Prepared:
    """Bytes every decoder of ours takes, with their header info; Rejected with the reason
    (empty, too large, not an image, a JPEG no decoder should start on, …)."""
    if len(data) == 0:
        raise Rejected("empty file (0 bytes)")
    if len(data) > MAX_IMAGE_BYTES:
        raise Rejected(f"{len(data)} bytes, more than the {MAX_IMAGE_BYTES} an image may have")
    try:
        info = probe(data)
    except NotJPEG:
        return _convert(data, max_pixels, transcode, None)
    except BadJPEG as e:
        raise Rejected(f"bad JPEG: {e}") from None
    why = decode_refusal(info, len(data), max_pixels)
    if why:  # the decoders would refuse it: never put it in a dataset
        raise Rejected(f"bad JPEG: {why}")
    if info.convert_reason:  # CMYK, arithmetic coding: not every decoder of ours takes it
        return _convert(data, max_pixels, transcode, info.convert_reason)
    if transcode.max_side and max(info.width, info.height) > transcode.max_side:
        return _shrink_jpeg(data, info, transcode)
    why = transcode.hw_reason(info)
    if why:
        return _convert(data, max_pixels, transcode, why)
    return Prepared(data, info, None)


def _target(w: int, h: int, max_side: int) -> tuple[int, int]:
    s = max_side / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def _encode(rgb_array_or_image, quality: int) -> bytes:
    """Baseline 4:2:0 JPEG; TurboJPEG's encoder when its library loads, else Pillow's."""
    import numpy as np

    arr = np.ascontiguousarray(np.asarray(rgb_array_or_image, dtype=np.uint8))
    try:
        return codec.encode_rgb(arr, quality)
    except (ImportError, OSError, RuntimeError):
        from PIL import Image

        out = io.BytesIO()
        Image.fromarray(arr, "RGB").save(out, "JPEG", quality=quality, subsampling=2)
        return out.getvalue()


def _shrink_jpeg(data: bytes, info: JpegInfo, t: Transcode) -> Prepared:
    """Shrink with the fused native decoder (DCT-domain scaling + antialiased resample in one
    pass), else (cpu.allow_python_decoder) PyTurboJPEG's scaled decode + Pillow resize; re-encode."""
    import numpy as np

    from ..decode import cpu

    w, h = _target(info.width, info.height, t.max_side)
    cpu.require_native()  # a missing decoder stops the pack (its fix), it is no fault of this file
    try:
        if cpu.native_available():
            rgb = cpu.decode_crop_resize([data], np.array([[0, 0, info.height, info.width]]), size=(h, w),
                                         pool=-1)[0]  # this worker's thread: workers run in parallel
        else:
            rgb = _shrink_python(data, info, w, h)
    except Exception as e:
        raise Rejected(f"undecodable JPEG while shrinking: {e}") from None
    jpeg = _encode(rgb, t.quality)
    why = f"shrunk {info.width}x{info.height} → {w}x{h} (--max-side {t.max_side})"
    return Prepared(jpeg, probe(jpeg), why)


def _shrink_python(data: bytes, info: JpegInfo, w: int, h: int):
    from PIL import Image

    factor = max(info.width, info.height) / max(w, h)
    denom = 8 if factor >= 8 else 4 if factor >= 4 else 2 if factor >= 2 else 1
    try:
        im = Image.fromarray(codec.decode_rgb(data, (1, denom)), "RGB")
    except (ImportError, OSError, RuntimeError):
        im = Image.open(io.BytesIO(data))
        im.draft("RGB", (math.ceil(info.width / denom), math.ceil(info.height / denom)))
        im = im.convert("RGB")
    return im.resize((w, h), Image.BILINEAR, reducing_gap=None)


def _convert(data: bytes, max_pixels: int, t: Transcode, why: str | None) -> Prepared:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            fmt = im.format
            _check_pixels(im.width, im.height, max_pixels)
            im.load()
            rgb = _to_rgb(im)
    except Rejected:
        raise
    except UnidentifiedImageError:
        raise Rejected("not an image Pillow can identify") from None
    except Image.DecompressionBombError as e:
        raise Rejected(f"decompression bomb: {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise Rejected(f"undecodable {why or 'image'}: {e}") from None
    why = why or f"{fmt} image"
    if t.max_side and max(rgb.width, rgb.height) > t.max_side:
        w, h = _target(rgb.width, rgb.height, t.max_side)
        rgb = rgb.resize((w, h), Image.BILINEAR)
        why += f", shrunk to {w}x{h}"
    jpeg = _encode(rgb, t.quality)
    return Prepared(jpeg, probe(jpeg), why)


def _to_rgb(im):
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit gray: scale to 8 bits instead of clipping
        import numpy as np
        from PIL import Image

        a = np.asarray(im, dtype=np.float64)
        hi = 65535.0 if im.mode.startswith("I;16") else max(float(a.max()), 1.0)
        im = Image.fromarray(np.clip(a * (255.0 / hi), 0, 255).astype("uint8"), "L")
    return im.convert("RGB")
