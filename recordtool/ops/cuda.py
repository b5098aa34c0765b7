"""An ImageOp on the GPU: its CUDA C kernel over a uint8 NHWC CuPy batch, one launch per batch
on the current stream, with the params computed on the host by `ImageOp.params` — the same
values as on the CPU."""
from __future__ import annotations


import numpy as np

from ..errors import OpCompileError
from ..util import ForkLock

THREADS = 256  # per block; per-image kernels reduce over a block of exactly this many
_lock = ForkLock()  # taken on producer threads: a forked child gets it unlocked
_kernels: dict = {}  # (source, name) → cupy RawKernel, compiled once per process


def kernel(op):
    """The op's compiled RawKernel; OpCompileError when it has no CUDA source or NVRTC refuses it."""
    import cupy

    if not op.cuda_source or not op.cuda_name:
        raise OpCompileError(f"{op.name} has no CUDA kernel (cuda_source, cuda_name): it runs on device='cpu' "
                             "only, or as a batch op written with CuPy")
    key = (op.cuda_source, op.cuda_name)
    with _lock:
        k = _kernels.get(key)
        if k is None:
            try:
                k = cupy.RawKernel(op.cuda_source, op.cuda_name, options=("-std=c++17",))
                k.compile()
            except Exception as e:  # cupy.cuda.compiler.CompileException: NVRTC's log names the line
                raise OpCompileError(f"cannot compile the CUDA kernel {op.cuda_name} of {op.name}: {e}") from e
            _kernels[key] = k
        return k


def grid(op, n: int, h: int, w: int):
    """(grid, block) of one launch over n images of h × w."""
    if op.cuda_block_per_image:
        return (n, 1, 1), (THREADS, 1, 1)
    return ((h * w + THREADS - 1) // THREADS, n, 1), (THREADS, 1, 1)


def check_batch(batch) -> None:
    if batch.dtype != np.uint8 or batch.ndim != 4 or batch.shape[3] != 3 or not batch.flags.c_contiguous:
        raise ValueError(f"batch must be C-contiguous uint8 (N, H, W, 3), got {batch.dtype} {batch.shape}")


def call(op, batch, params_dev) -> tuple:
    """(kernel, grid, block, args) of the op over a C-contiguous uint8 (n, h, w, 3) CuPy batch
    (n ≥ 1) with its params already on the device (float64, n × nparams from their start)."""
    check_batch(batch)
    n, h, w = batch.shape[:3]
    g, b = grid(op, n, h, w)
    return kernel(op), g, b, (batch, np.int32(n), np.int32(h), np.int32(w), params_dev, np.int32(op.nparams))


def launch(op, batch, params: np.ndarray) -> None:
    """Run the op's kernel over a C-contiguous uint8 (n, h, w, 3) CuPy batch in place, on the
    current stream (params go up on it: the kernel sees them whatever the host does next)."""
    import cupy

    check_batch(batch)
    n = batch.shape[0]
    params = np.ascontiguousarray(params, np.float64)
    if params.shape != (n, op.nparams):
        raise ValueError(f"params must be ({n}, {op.nparams}), got {params.shape}")
    if n == 0:
        return
    fn, g, b, args = call(op, batch, cupy.asarray(params))
    fn(g, b, args)
