"""Per-image user ops at native speed: plain Python compiled by Numba, run by the native decode
threads on each image while it is in cache (after resize, before mirror and normalize, without
the GIL), and as one CUDA kernel launch per batch on the GPU. Pass one as `Loader(user_op=...)`.

Write one by subclassing `ImageOp` (see recordtool.ops.base and the examples). Numba is the
optional extra `recordtool[numba]`, imported only when an op is first compiled; batch ops
(recordtool.ops.batch, and `ReferenceOp(op)`: an ImageOp's array code) need none of this. The
tools build theirs by name (`by_name`, recordtool.ops.registry).
"""
from .base import ImageOp, ReferenceOp
from .examples import ColorJitter, Cutout, RandomGrayscale
from .registry import by_name, names, register

__all__ = ["ImageOp", "ReferenceOp", "RandomGrayscale", "Cutout", "ColorJitter", "by_name", "names", "register"]
