"""native/gpu_resize.cu built for the host: CUDA's qualifiers defined away and the launch grid
run as loops, so CI (no GPU) runs the resize kernel's own source (uint8 NHWC output, not
normalised) against decode.gpu.reference and against itself."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

_SHIM = r"""
#include <cmath>
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__
struct __half { unsigned short x; };
inline __half __float2half_rn(float) { return __half{0}; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
struct Dim3 { int x, y, z; };
static Dim3 blockIdx, threadIdx, blockDim;
"""
_DRIVER = r"""
extern "C" void run(const Sample* samples, int n, unsigned char* out, int W, int H) {
    blockDim = {32, 8, 1};
    for (int z = 0; z < n; z++)
        for (int by = 0; by < (H + 7) / 8; by++)
            for (int bx = 0; bx < (W + 31) / 32; bx++)
                for (int ty = 0; ty < 8; ty++)
                    for (int tx = 0; tx < 32; tx++) {
                        blockIdx = {bx, by, z};
                        threadIdx = {tx, ty, 0};
                        resize_normalize<unsigned char, false, false>(samples, out, W, H, 0, 0, 0, 1, 1, 1);
                    }
}
"""


def build(workdir):
    """The kernel compiled into workdir: a ctypes library whose run(samples, n, out, W, H) runs
    the grid over n SAMPLE_DTYPE rows into out (n, H, W, 3) uint8. None without a C++ compiler."""
    from recordtool.decode.gpu.kernel import _source

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    (workdir / "cuda_fp16.h").write_text("")
    (workdir / "k.cpp").write_text(_SHIM + _source() + _DRIVER)
    subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-I", str(workdir), str(workdir / "k.cpp"),
                    "-o", str(workdir / "k.so")], check=True)
    return ctypes.CDLL(str(workdir / "k.so"))
