"""The libturbojpeg a platform wheel carries, for PyTurboJPEG.

A wheel made by scripts/build_wheels.sh holds libjpeg-turbo's two libraries in
`recordtool.libs/` beside the package (auditwheel's folder, names with a hash:
`libturbojpeg-1a2b3c4d.so.0.2.0`). The native decoder finds its libjpeg there by its RPATH;
PyTurboJPEG, which loads its library with ctypes by path, is handed this file instead of
searching the system's folders — so pack's encoder and the reference decoder work on a machine
without libturbojpeg0. A source build has no such folder: PyTurboJPEG then finds the system's
library itself.
"""
from __future__ import annotations

import glob
import os

LIBS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recordtool.libs")


def turbojpeg_path() -> str | None:
    """The bundled libturbojpeg's path, or None where this install has none (a source build)."""
    found = sorted(glob.glob(os.path.join(LIBS, "libturbojpeg*.so*")))
    return found[0] if found else None
