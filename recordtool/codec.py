"""libjpeg-turbo through PyTurboJPEG: one handle per process, on the library a platform wheel
carries in recordtool.libs/ (`_bundled`), else the one PyTurboJPEG finds.

Pack's re-encode (pack/transcode.py), verify's full decode (verify.py) and the Python decoder
(decode/reference.py) share it: the library is loaded once, and neither pack nor verify reaches
it through the decoder's reference implementation. Each caller keeps its own fallback (Pillow)
for a machine where PyTurboJPEG or its library is missing: `turbojpeg()` raises ImportError
(no PyTurboJPEG) or OSError / RuntimeError (its library does not load) there.
"""
from __future__ import annotations

import numpy as np

_tj = None


def turbojpeg():
    """The process's `turbojpeg.TurboJPEG`, created at the first call."""
    global _tj
    if _tj is None:
        from turbojpeg import TurboJPEG

        from ._bundled import turbojpeg_path

        _tj = TurboJPEG(turbojpeg_path())  # the wheel's own library; None: PyTurboJPEG searches
    return _tj


def encode_rgb(rgb: np.ndarray, quality: int) -> bytes:
    """(H, W, 3) uint8 RGB → baseline 4:2:0 JPEG at `quality` (what pack re-encodes to)."""
    from turbojpeg import TJPF_RGB, TJSAMP_420

    return turbojpeg().encode(np.ascontiguousarray(rgb, dtype=np.uint8), quality=quality, pixel_format=TJPF_RGB,
                              jpeg_subsample=TJSAMP_420)


def decode_rgb(data, scale: tuple[int, int] | None = None) -> np.ndarray:
    """JPEG bytes → (H, W, 3) uint8 RGB, whole or at `scale` (num, den: libjpeg's DCT scaling)."""
    from turbojpeg import TJPF_RGB

    return turbojpeg().decode(bytes(data), pixel_format=TJPF_RGB, scaling_factor=scale)
