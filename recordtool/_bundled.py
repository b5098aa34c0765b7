"""Where the shared libraries loaded by path are: the libturbojpeg a platform wheel carries,
for PyTurboJPEG, and the places nvJPEG is looked for (`nvjpeg_candidates`).

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
import sys

LIBS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recordtool.libs")


def turbojpeg_path() -> str | None:
    """The bundled libturbojpeg's path, or None where this install has none (a source build)."""
    found = sorted(glob.glob(os.path.join(LIBS, "libturbojpeg*.so*")))
    return found[0] if found else None


def nvjpeg_candidates(major: int) -> list[str]:
    """The libnvjpeg.so.{major} files to try, in order: the nvidia-nvjpeg wheels on sys.path,
    the CUDA toolkit ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda, /usr/local/cuda-{major}[.*]),
    then the bare name (the loader's own search path)."""
    names = []
    for base in sys.path:
        names += glob.glob(os.path.join(base, "nvidia", "cu13" if major >= 13 else "nvjpeg", "lib",
                                        f"libnvjpeg.so.{major}*"))
    for root in [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda",
                 f"/usr/local/cuda-{major}", *sorted(glob.glob(f"/usr/local/cuda-{major}.*"))]:
        if root:
            names += glob.glob(os.path.join(root, "targets", "*", "lib", f"libnvjpeg.so.{major}*"))
            names += glob.glob(os.path.join(root, "lib64", f"libnvjpeg.so.{major}*"))
    names.append(f"libnvjpeg.so.{major}")
    return names
