"""The CUDA device this package's tests need: CuPy and at least one GPU, else they skip (CI)."""
import pytest

try:
    import cupy

    NGPU = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, or no driver
    cupy, NGPU = None, 0
needs_gpu = pytest.mark.skipif(NGPU == 0, reason="no CuPy or no CUDA device")
