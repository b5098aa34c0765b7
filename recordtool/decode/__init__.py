"""Decode stage: crop windows from the index, fused JPEG decode → crop → resize, and the
CPU-side mirror/normalize for CPU-only training. One documented function per op. The backends
that make a Loader's batches (decode.backend's protocol: cpu_backend, gpu) are made by
decode.device."""
from .cpu import (DecodeError, allow_python_decoder, decode_crop_resize, eval_transform, mirror, native_available,
                  normalize)
from .windows import center_windows, random_flips, random_windows

__all__ = ["random_windows", "random_flips", "center_windows", "decode_crop_resize", "eval_transform",
           "mirror", "normalize", "DecodeError", "native_available",
           "allow_python_decoder"]
