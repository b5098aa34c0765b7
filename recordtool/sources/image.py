"""Turn a source file's bytes into bytes every decoder of ours takes, touching as few as possible.

JPEGs that libjpeg-turbo decodes to RGB are kept byte for byte. CMYK/YCCK JPEGs, PNGs (also
PNGs named .JPEG) and other formats Pillow opens are converted to RGB JPEG, quality 95, as
tf-slim's ImageNet converter does. Anything else is refused with a reason.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from ..format.jpeg import BadJPEG, JpegInfo, NotJPEG, CS_NAMES, probe

DEFAULT_MAX_PIXELS = 64 * 1024 * 1024  # same default as the decoders' bomb check
CONVERT_QUALITY = 95


class Rejected(ValueError):
    """This file cannot become a record; str() is the reason for the report."""


@dataclass
class Prepared:
    data: bytes
    info: JpegInfo
    converted: str | None  # why the bytes were re-encoded, None when copied as-is


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise Rejected(f"declares {width}x{height} = {width * height / 1e6:.1f} Mpx, more than "
                       f"max_pixels {max_pixels / 1e6:.1f} Mpx (decompression bomb?)")


def prepare(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, quality: int = CONVERT_QUALITY) -> Prepared:
    if len(data) == 0:
        raise Rejected("empty file (0 bytes)")
    try:
        info = probe(data)
    except NotJPEG:
        return _convert(data, max_pixels, quality, None)
    except BadJPEG as e:
        raise Rejected(f"bad JPEG: {e}") from None
    _check_pixels(info.width, info.height, max_pixels)
    if info.decodable_as_is:
        return Prepared(data, info, None)
    return _convert(data, max_pixels, quality, f"{CS_NAMES[info.colorspace].upper()} JPEG")


def _convert(data: bytes, max_pixels: int, quality: int, why: str | None) -> Prepared:
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            fmt = im.format
            _check_pixels(im.width, im.height, max_pixels)
            im.load()
            if getattr(im, "n_frames", 1) > 1:
                im.seek(0)
            rgb = _to_rgb(im)
    except Rejected:
        raise
    except UnidentifiedImageError:
        raise Rejected("not an image Pillow can identify") from None
    except Image.DecompressionBombError as e:
        raise Rejected(f"decompression bomb: {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise Rejected(f"undecodable {why or 'image'}: {e}") from None
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=quality)
    jpeg = out.getvalue()
    return Prepared(jpeg, probe(jpeg), why or f"{fmt} image")


def _to_rgb(im):
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit gray: scale to 8 bits instead of clipping
        import numpy as np

        a = np.asarray(im, dtype=np.float64)
        hi = 65535.0 if im.mode.startswith("I;16") else max(float(a.max()), 1.0)
        from PIL import Image

        im = Image.fromarray(np.clip(a * (255.0 / hi), 0, 255).astype("uint8"), "L")
    return im.convert("RGB")
