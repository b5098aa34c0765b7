"""Run an ImageOp's CUDA C kernel on the CPU, so CI (no GPU) checks its indexing, bounds and
block reduction against the NumPy reference: the source is compiled by g++ with a shim for
CUDA's built-ins, and the launch grid of recordtool.ops.cuda.grid is run block after block —
every thread of a block on its own std::thread when the kernel has __syncthreads (a
std::barrier; a thread that returns drops out of it, as an exited CUDA thread does),
sequentially otherwise. What it cannot check: NVRTC's dialect and real concurrency between
blocks (the kernels write disjoint pixels per block)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess

import numpy as np

from recordtool.ops.cuda import grid

_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <thread>
#include <vector>
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local emu_dim3 threadIdx;
static emu_dim3 blockIdx, blockDim, gridDim;
static std::barrier<>* emu_bar = nullptr;
#define __global__
#define __shared__ static
#define __syncthreads() emu_bar->arrive_and_wait()
using std::max;
using std::min;
"""

_RUN = r"""
extern "C" void emu_launch(unsigned char* batch, int n, int h, int w, const double* params, int k,
                           unsigned gx, unsigned gy, unsigned bx, int concurrent) {
    blockDim.x = bx; blockDim.y = 1; blockDim.z = 1;
    gridDim.x = gx; gridDim.y = gy; gridDim.z = 1;
    for (unsigned by = 0; by < gy; by++)
        for (unsigned b = 0; b < gx; b++) {
            blockIdx.x = b; blockIdx.y = by; blockIdx.z = 0;
            if (!concurrent) {
                for (unsigned t = 0; t < bx; t++) { threadIdx.x = t; KERNEL(batch, n, h, w, params, k); }
                continue;
            }
            std::barrier<> bar((std::ptrdiff_t)bx);
            emu_bar = &bar;
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < bx; t++)
                threads.emplace_back([&, t] {
                    threadIdx.x = t;
                    KERNEL(batch, n, h, w, params, k);
                    bar.arrive_and_drop();
                });
            for (auto& th : threads) th.join();
        }
}
"""


def available() -> bool:
    return shutil.which("g++") is not None


def build(op, workdir: str):
    """The op's kernel compiled for the CPU: a callable run(batch uint8 NHWC, params) in place."""
    src = _SHIM + op.cuda_source + f"\n#define KERNEL {op.cuda_name}\n" + _RUN
    tag = hashlib.sha1(src.encode()).hexdigest()[:12]
    cpp, so = os.path.join(workdir, f"{tag}.cpp"), os.path.join(workdir, f"{tag}.so")
    if not os.path.exists(so):  # one build per kernel source and test session
        with open(cpp, "w") as f:
            f.write(src)
        # warnings shown, not fatal: another g++ (the GPU machine's 13) warns where this one does not
        p = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wall",
                            "-Wno-unused-variable", cpp, "-o", so + ".tmp"], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"g++ could not build the emulated kernel {op.cuda_name}:\n{p.stderr[-3000:]}")
        os.replace(so + ".tmp", so)
    lib = ctypes.CDLL(so)
    lib.emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                               ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_int]
    concurrent = int("__syncthreads" in op.cuda_source)

    def run(batch: np.ndarray, params: np.ndarray) -> np.ndarray:
        assert batch.dtype == np.uint8 and batch.flags.c_contiguous
        params = np.ascontiguousarray(params, np.float64)
        n, h, w = batch.shape[:3]
        (gx, gy, _), (bx, _, _) = grid(op, n, h, w)
        lib.emu_launch(batch.ctypes.data, n, h, w, params.ctypes.data, op.nparams, gx, gy, bx, concurrent)
        return batch

    run.lib = lib
    return run
