"""The one CUDA kernel after decode: resize (Pillow's antialiased BILINEAR) + mirror + normalize +
layout + dtype for a whole batch (native/gpu_resize.cu; numpy reference: decode/gpu/reference.py).

Each sample of the batch is a row of SAMPLE_DTYPE: where its decoded pixels are (any pitch),
the float window inside them, and whether to mirror it; its `format` says whether they are
interleaved RGB (FMT_RGB) or nvJPEG's planar YCbCr / Y (FMT_YCC, FMT_GRAY: the kernel makes
libjpeg-turbo's RGB from them, see reference.planes_to_rgb) — the whole image's planes or a
region's starting at image pixel (ox, oy) (reference.region_planes_to_rgb).
"""
from __future__ import annotations

import os
from typing import Literal

import numpy as np

SAMPLE_DTYPE = np.dtype([("src", "<u8"), ("pitch", "<i8"), ("rw", "<i4"), ("rh", "<i4"), ("x0", "<f4"),
                         ("y0", "<f4"), ("x1", "<f4"), ("y1", "<f4"), ("mirror", "<i4"), ("format", "<i4"),
                         ("cb", "<u8"), ("cr", "<u8"), ("cpitch", "<i8"), ("hs", "<i4"), ("vs", "<i4"),
                         ("cw", "<i4"), ("ch", "<i4"), ("ox", "<i4"), ("oy", "<i4")], align=True)  # = struct Sample in gpu_resize.cu
FMT_RGB, FMT_YCC, FMT_GRAY = 0, 1, 2

DType = Literal["float32", "float16", "bfloat16", "uint8"]  # bfloat16: bits in a uint16 array
Layout = Literal["NCHW", "NHWC"]
_NAMES = {("float32", "NCHW"): "resize_normalize<float, true, true>",
          ("float32", "NHWC"): "resize_normalize<float, false, true>",
          ("float16", "NCHW"): "resize_normalize<__half, true, true>",
          ("float16", "NHWC"): "resize_normalize<__half, false, true>",
          ("bfloat16", "NCHW"): "resize_normalize<__nv_bfloat16, true, true>",
          ("bfloat16", "NHWC"): "resize_normalize<__nv_bfloat16, false, true>",
          ("uint8", "NCHW"): "resize_normalize<unsigned char, true, false>",
          ("uint8", "NHWC"): "resize_normalize<unsigned char, false, false>"}
_modules: dict = {}  # False / True (the bfloat16 variants, compiled apart) → RawModule


def check(dtype: str, layout: str) -> None:
    if (dtype, layout) not in _NAMES:
        raise ValueError(f"dtype float32|float16|bfloat16|uint8 and layout NCHW|NHWC, not {dtype!r}, {layout!r}")


def _source() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "..", "gpu_resize.cu"), os.path.join(here, "..", "..", "..", "native",
                                                                        "gpu_resize.cu")):
        if os.path.exists(p):
            with open(p) as f:
                return f.read()
    raise FileNotFoundError("gpu_resize.cu not found next to recordtool.decode or in native/")


def kernel(dtype: DType, layout: Layout):
    """The compiled resize_normalize<T, NCHW, NORMALIZE> for this output type."""
    import cupy

    check(dtype, layout)
    bf16 = dtype == "bfloat16"
    if bf16 not in _modules:
        names = [v for (d, _), v in _NAMES.items() if (d == "bfloat16") == bf16]
        options = ("-std=c++17",) + (("-DRECORDTOOL_BF16",) if bf16 else ())
        _modules[bf16] = cupy.RawModule(code=_source(), options=options, name_expressions=names)
    return _modules[bf16].get_function(_NAMES[(dtype, layout)])


def geometry(samples_dev, n: int, out, size, mean, std) -> tuple:
    """(grid, block, args) of the kernel over n samples into `out` (n, 3, h, w) or (n, h, w, 3)."""
    from ..spec import scale_bias

    h, w = size
    sc, bi = scale_bias(mean, std)  # the CPU path's constants: its normalised values, bit for bit
    return (((w + 31) // 32, (h + 7) // 8, n), (32, 8, 1),
            (samples_dev, out, np.int32(w), np.int32(h), sc[0], sc[1], sc[2], bi[0], bi[1], bi[2]))


def launch(fn, samples_dev, n: int, out, size, mean, std, stream) -> None:
    """Run the kernel over n samples on `stream` into `out` (n, 3, h, w) or (n, h, w, 3)."""
    grid, block, args = geometry(samples_dev, n, out, size, mean, std)
    with stream:
        fn(grid, block, args)
