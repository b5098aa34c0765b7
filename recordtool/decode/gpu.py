"""GPU decode stage: NVJPG hardware batched decode with one ROI per image (the crop window),
the CPU native path for what the engines cannot take, both at once in proportion to their
measured rates, then one CUDA kernel for resize + mirror + normalize + layout.

Routing uses the index columns (chroma, progressive, colorspace) — no parsing in the hot path.
Output is a CuPy array on the decoder's stream; `to_torch` hands it over via DLPack with the
consumer stream made to wait.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from ..format.jpeg import CHROMA_420, CHROMA_422, CHROMA_440, CHROMA_444, CS_YCBCR
from . import cpu
from .ops import IMAGENET_MEAN, IMAGENET_STD

# Grayscale goes to the CPU: the engines' RGBI output for 1-component JPEGs with an ROI did not
# match the image on the H200 (13.8 dB against libjpeg-turbo, tests/test_gpu.py).
HW_CHROMA = (CHROMA_444, CHROMA_422, CHROMA_420, CHROMA_440)
SAMPLE_DTYPE = np.dtype([("src", "<u8"), ("pitch", "<i8"), ("rw", "<i4"), ("rh", "<i4"), ("x0", "<f4"),
                         ("y0", "<f4"), ("x1", "<f4"), ("y1", "<f4"), ("mirror", "<i4")], align=True)
_ALIGN = 256


def _region_bytes(w, h) -> np.ndarray:
    """Upper bound of the arena bytes one window of w × h needs (whole-pixel region + alignment)."""
    return ((np.ceil(w) + 1) * (np.ceil(h) + 1) * 3 + 2 * _ALIGN).astype(np.int64)


def hardware_decodable(chroma, progressive, colorspace) -> np.ndarray:
    """What goes to the NVJPG engines: baseline YCbCr 4:4:4/4:2:2/4:2:0/4:4:0."""
    chroma = np.asarray(chroma)
    return np.isin(chroma, HW_CHROMA) & (np.asarray(progressive) == 0) & (np.asarray(colorspace) == CS_YCBCR)


def _kernel_source() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "gpu_resize.cu"), os.path.join(here, "..", "..", "native", "gpu_resize.cu")):
        if os.path.exists(p):
            with open(p) as f:
                return f.read()
    raise FileNotFoundError("gpu_resize.cu not found next to recordtool.decode or in native/")


_module = None


def kernel(dtype: str, layout: str):
    """The compiled resize_normalize<T, NCHW, NORMALIZE> for this output type."""
    global _module
    import cupy

    names = {("float32", "NCHW"): "resize_normalize<float, true, true>",
             ("float32", "NHWC"): "resize_normalize<float, false, true>",
             ("float16", "NCHW"): "resize_normalize<__half, true, true>",
             ("float16", "NHWC"): "resize_normalize<__half, false, true>",
             ("uint8", "NCHW"): "resize_normalize<unsigned char, true, false>",
             ("uint8", "NHWC"): "resize_normalize<unsigned char, false, false>"}
    if _module is None:
        _module = cupy.RawModule(code=_kernel_source(), options=("-std=c++17",),
                                 name_expressions=list(names.values()))
    return _module.get_function(names[(dtype, layout)])


class GPUDecoder:
    """Decode → crop → resize → mirror → normalize a batch onto the GPU.

    One instance per producer thread. `split="auto"` adapts the CPU share so both sides finish
    together; a float in [0, 1] fixes the CPU share of hardware-decodable images; "gpu" or
    "cpu" forces one side (what the engines cannot take always goes to the CPU).
    """

    def __init__(self, size=(224, 224), max_batch: int = 256, layout: str = "NCHW", dtype: str = "float16",
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, cpu_threads: int | None = None, split="auto",
                 device: int = 0, pool: int | None = None):
        import cupy

        if layout not in ("NCHW", "NHWC") or dtype not in ("float32", "float16", "uint8"):
            raise ValueError("layout NCHW|NHWC, dtype float32|float16|uint8")
        self.cupy = cupy
        self.device = cupy.cuda.Device(device)
        self.size = (int(size[0]), int(size[1]))
        self.max_batch = max_batch
        self.layout, self.dtype = layout, dtype
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.cpu_threads = cpu_threads or max(1, (os.cpu_count() or 2) - 1)
        self.split = split
        # each decoder owns a native CPU pool, so producers running side by side do not queue
        GPUDecoder._instances = getattr(GPUDecoder, "_instances", 0) + 1
        self.pool = 1 + (GPUDecoder._instances - 1) % 63 if pool is None else pool  # ids 1..63; 0 is the default
        self.cpu_fraction = 0.0 if split in ("gpu", "auto") else (1.0 if split == "cpu" else float(split))
        self._rates = {"gpu": None, "cpu": None}
        self.last = {}
        with self.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._kernel = kernel(dtype, layout)
            self.hw = None
            self.hw_error = None
            if split != "cpu":
                from .nvjpeg import HardwareDecoder, NvjpegError

                try:
                    self.hw = HardwareDecoder(max_batch)
                except (NvjpegError, OSError) as e:  # no engines here: everything on the CPU path
                    self.hw_error = str(e)
        self.allocations = 0
        self._arena = None  # device bytes for decoded windows
        self._staging = None  # pinned host bytes for JPEG data
        self._cpu_out = None  # pinned host uint8 (N, h, w, 3) for CPU-decoded samples
        self._cpu_dev = None
        self._samples_host = None

    # ------------------------------------------------------------------ buffers
    def warmup(self, jpeg_lengths, widths, heights, outputs: int = 3) -> None:
        """Size every buffer from the index's largest images, so steady state allocates nothing.

        Uses the same per-image bound as `_ensure` (a window's region is at most the image + 1 px
        each way), so no batch of this dataset can outgrow what warm-up planned. `outputs`: how
        many output batches can be alive at once (queued + being made + held by the consumer);
        that many are cycled through CuPy's pool on this decoder's stream now, so later batches
        reuse them instead of growing the pool."""
        b = self.max_batch
        lens = np.sort(np.asarray(jpeg_lengths, np.int64))[::-1][:b]
        regions = np.sort(_region_bytes(np.asarray(widths, np.float64), np.asarray(heights, np.float64)))[::-1][:b]
        self._alloc(int(lens.sum()) + b * 64, int(regions.sum()))
        h, w = self.size
        shape = (b, 3, h, w) if self.layout == "NCHW" else (b, h, w, 3)
        with self.device, self.stream:
            held = [self.cupy.empty(shape, self.dtype) for _ in range(max(0, outputs))]
            del held  # back to the pool of this stream, ready for the batches to come

    def _alloc(self, staging: int, arena: int) -> None:
        cupy = self.cupy
        b = self.max_batch
        h, w = self.size
        with self.device:
            self._staging = cupy.cuda.alloc_pinned_memory(staging)
            self._staging_np = np.frombuffer(self._staging, np.uint8, staging)
            self._arena = cupy.empty(arena, np.uint8)
            if self._cpu_out is None:
                self._cpu_out_mem = cupy.cuda.alloc_pinned_memory(b * h * w * 3)
                self._cpu_out = np.frombuffer(self._cpu_out_mem, np.uint8, b * h * w * 3).reshape(b, h, w, 3)
                self._cpu_dev = cupy.empty((b, h, w, 3), np.uint8)
                self._samples_mem = cupy.cuda.alloc_pinned_memory(b * SAMPLE_DTYPE.itemsize)
                self._samples_host = np.frombuffer(self._samples_mem, SAMPLE_DTYPE, b)
                self._samples_dev = cupy.empty(b * SAMPLE_DTYPE.itemsize, np.uint8)
        self.allocations = getattr(self, "allocations", 0) + 1

    def _ensure(self, buffers, windows):
        """Grow the buffers if a batch needs more than warm-up planned (counted in .allocations)."""
        need_stage = sum(len(x) for x in buffers) + 64 * len(buffers)
        need_arena = int(_region_bytes(windows[:, 3], windows[:, 2]).sum())
        if self._staging is None or need_stage > self._staging_np.size or need_arena > self._arena.size:
            cur_s = 0 if self._staging is None else self._staging_np.size
            cur_a = 0 if self._arena is None else self._arena.size
            self._alloc(max(need_stage, cur_s), max(need_arena, cur_a))

    # ------------------------------------------------------------------ one batch
    def __call__(self, buffers, windows, flips, hw_ok):
        """buffers: JPEG bytes-likes; windows (N, 4) (y, x, h, w); flips, hw_ok: bool (N,).
        Returns a CuPy array (N, 3, h, w) or (N, h, w, 3), complete when the call returns."""
        cupy = self.cupy
        n = len(buffers)
        if n > self.max_batch:
            raise ValueError(f"batch of {n} > max_batch {self.max_batch}")
        windows = np.asarray(windows, np.float64).reshape(n, 4)
        flips = np.asarray(flips, bool).reshape(n)
        hw_ok = np.asarray(hw_ok, bool).reshape(n) & (self.hw is not None)
        self._ensure(buffers, windows)
        # -- split: everything the engines cannot take, plus a share of the rest, to the CPU
        eligible = np.nonzero(hw_ok)[0]
        forced = np.nonzero(~hw_ok)[0]
        want_cpu = int(round(self.cpu_fraction * n))
        extra = max(0, min(len(eligible), want_cpu - len(forced)))
        gpu_idx = eligible[: len(eligible) - extra]
        cpu_idx = np.concatenate([forced, eligible[len(eligible) - extra:]]).astype(np.int64)
        h, w = self.size
        t0 = time.perf_counter()
        cpu_result = {}

        def cpu_part():
            t = time.perf_counter()
            errors = []
            if len(cpu_idx):
                cpu.decode_crop_resize([buffers[i] for i in cpu_idx], windows[cpu_idx], size=(h, w),
                                       threads=self.cpu_threads, out=self._cpu_out[: len(cpu_idx)],
                                       policy="fallback", errors=errors, pool=self.pool)
            cpu_result["t"] = time.perf_counter() - t
            cpu_result["errors"] = [(int(cpu_idx[i]), r) for i, r in errors]

        th = threading.Thread(target=cpu_part, name="recordtool-cpu-decode")
        th.start()
        samples = self._samples_host[:n]
        gpu_failed = []
        with self.device, self.stream:
            ev_start = self.stream.record()
            tg = time.perf_counter()
            if len(gpu_idx):
                try:
                    self._decode_hw(buffers, windows, gpu_idx, samples)
                except Exception as e:  # the engines refused the batch: the CPU takes it
                    gpu_failed = list(gpu_idx)
                    self.last_gpu_error = str(e)
            t_host = time.perf_counter() - tg
            ev_decoded = self.stream.record()
            th.join()
            if gpu_failed:
                extra_out = np.empty((len(gpu_failed), h, w, 3), np.uint8)
                errs = []
                cpu.decode_crop_resize([buffers[i] for i in gpu_failed], windows[gpu_failed], size=(h, w),
                                       threads=self.cpu_threads, out=extra_out, policy="fallback", errors=errs,
                                       pool=self.pool)
                cpu_result["errors"] += [(int(gpu_failed[i]), r) for i, r in errs]
                cpu_idx = np.concatenate([cpu_idx, np.asarray(gpu_failed, np.int64)])
                self._cpu_out[len(cpu_idx) - len(gpu_failed):len(cpu_idx)] = extra_out
            if len(cpu_idx):
                self._cpu_dev[: len(cpu_idx)].set(self._cpu_out[: len(cpu_idx)], stream=self.stream)
                s = samples[cpu_idx]
                s["src"] = self._cpu_dev.data.ptr + np.arange(len(cpu_idx), dtype=np.int64) * (h * w * 3)
                s["pitch"], s["rw"], s["rh"] = w * 3, w, h
                s["x0"], s["y0"], s["x1"], s["y1"] = 0.0, 0.0, float(w), float(h)
                samples[cpu_idx] = s
            samples["mirror"] = flips.astype(np.int32)
            self._samples_dev[: samples.nbytes].set(samples.view(np.uint8), stream=self.stream)
            shape = (n, 3, h, w) if self.layout == "NCHW" else (n, h, w, 3)
            out = cupy.empty(shape, self.dtype)
            m, s = self.mean, self.std
            self._kernel(((w + 31) // 32, (h + 7) // 8, n), (32, 8, 1),
                         (self._samples_dev, out, np.int32(w), np.int32(h), np.float32(m[0]), np.float32(m[1]),
                          np.float32(m[2]), np.float32(s[0]), np.float32(s[1]), np.float32(s[2])))
            self.stream.synchronize()
            t_gpu = None
            if len(gpu_idx) and not gpu_failed:  # engine time: host submission or device work, the longer
                t_gpu = max(t_host, cupy.cuda.get_elapsed_time(ev_start, ev_decoded) / 1e3)
        self._adapt(len(gpu_idx) - len(gpu_failed), t_gpu, len(cpu_idx), cpu_result.get("t"))
        self.last = {"n": n, "gpu": int(len(gpu_idx) - len(gpu_failed)), "cpu": int(len(cpu_idx)),
                     "cpu_forced": int(len(forced)), "cpu_fraction": self.cpu_fraction,
                     "gpu_rate": self._rates["gpu"], "cpu_rate": self._rates["cpu"],
                     "errors": cpu_result.get("errors", []), "seconds": time.perf_counter() - t0}
        return out

    def _decode_hw(self, buffers, windows, gpu_idx, samples):
        """Stage JPEG bytes in pinned memory, decode each window as an ROI into the arena."""
        bufs = [buffers[i] for i in gpu_idx]
        stage_base = self._staging_np.ctypes.data
        if cpu.native_available():  # one GIL-free memcpy pass
            offs = cpu._native.gather(bufs, stage_base, self._staging_np.size, 64)
        else:
            offs = np.cumsum([0] + [(len(b) + 63) // 64 * 64 for b in bufs[:-1]])
            for o, b in zip(offs, bufs):
                self._staging_np[o:o + len(b)] = np.frombuffer(b, np.uint8)
        win = windows[gpu_idx]
        y, x, hh, ww = win[:, 0], win[:, 1], win[:, 2], win[:, 3]
        rx, ry = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
        rw = np.maximum(1, np.ceil(x + ww).astype(np.int64) - rx)
        rh = np.maximum(1, np.ceil(y + hh).astype(np.int64) - ry)
        pitch = rw * 3
        size = (pitch * rh + _ALIGN - 1) // _ALIGN * _ALIGN
        dst = self._arena.data.ptr + np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
        s = samples[gpu_idx]
        s["src"], s["pitch"], s["rw"], s["rh"] = dst, pitch, rw, rh
        s["x0"], s["y0"], s["x1"], s["y1"] = x - rx, y - ry, x + ww - rx, y + hh - ry
        samples[gpu_idx] = s
        self.hw.decode((stage_base + offs).tolist(), [len(b) for b in bufs],
                       np.stack([rx, ry, rw, rh], 1).tolist(), dst.tolist(), pitch.tolist(), self.stream.ptr)

    def _adapt(self, n_gpu, t_gpu, n_cpu, t_cpu):
        """Move the CPU share so that both sides take the same time on the next batch."""
        a = 0.3
        for key, nn, t in (("gpu", n_gpu, t_gpu), ("cpu", n_cpu, t_cpu)):
            if nn >= 8 and t:
                r = nn / t
                self._rates[key] = r if self._rates[key] is None else (1 - a) * self._rates[key] + a * r
        if self.split != "auto" or self.hw is None:
            return
        rg, rc = self._rates["gpu"], self._rates["cpu"]
        if rg and rc:
            self.cpu_fraction = float(np.clip(rc / (rc + rg), 0.0, 0.9))
        elif rg and not rc:
            self.cpu_fraction = 0.05  # measure the CPU once
        elif rc and not rg:
            self.cpu_fraction = 0.5

    def close(self):
        if self.hw is not None:
            self.hw.close()
            self.hw = None


def to_torch(array, stream=None):
    """Hand a CuPy array to PyTorch through DLPack; PyTorch's current stream waits for `stream`."""
    import torch

    if stream is not None:
        dev = torch.device("cuda", array.device.id)
        torch.cuda.current_stream(dev).wait_stream(torch.cuda.ExternalStream(stream.ptr, device=dev))
    return torch.from_dlpack(array)
