"""GPU decode stage: NVJPG hardware batched decode with one ROI per image (the crop window),
nvJPEG's hybrid decoder (CPU Huffman, GPU IDCT) for progressive and grayscale files, the CPU
native path for what neither takes (CMYK, 4:1:1, damaged files) and for a share of the rest —
in proportion to measured rates — then one CUDA kernel for resize + mirror + normalize + layout.

Routing uses the index columns (chroma, progressive, colorspace) — no parsing in the hot path.
Outputs come from a ring of batches allocated at warm-up (`OutputRing`); `to_torch` hands one
over via DLPack with the consumer stream made to wait.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..format.jpeg import CHROMA_420, CHROMA_422, CHROMA_440, CHROMA_444, CHROMA_GRAY, CS_GRAY, CS_YCBCR
from . import cpu
from .ops import IMAGENET_MEAN, IMAGENET_STD

# Grayscale does not go to the engines: their RGBI output for 1-component JPEGs with an ROI did
# not match the image on the H200 (13.8 dB against libjpeg-turbo, tests/test_gpu.py).
HW_CHROMA = (CHROMA_444, CHROMA_422, CHROMA_420, CHROMA_440)
ENGINE, HYBRID, CPU = 0, 1, 2  # where an image is decoded (`route`)
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


def route(chroma, progressive, colorspace) -> np.ndarray:
    """ENGINE for baseline YCbCr the engines take; HYBRID for progressive YCbCr (same chroma
    layouts) and grayscale; CPU for the rest (CMYK/YCCK/RGB-coded, 4:1:1, unknown)."""
    chroma, progressive, colorspace = np.asarray(chroma), np.asarray(progressive), np.asarray(colorspace)
    hw = hardware_decodable(chroma, progressive, colorspace)
    hybrid = ((np.isin(chroma, HW_CHROMA) & (colorspace == CS_YCBCR))
              | ((chroma == CHROMA_GRAY) & (colorspace == CS_GRAY))) & ~hw
    return np.where(hw, ENGINE, np.where(hybrid, HYBRID, CPU)).astype(np.int8)


class OutputRing:
    """Output batches allocated once and recycled, so steady state allocates no device memory.

    A slot is handed out as a CuPy array whose memory owner gives the slot back when the last
    reference dies — the CuPy array or, through DLPack, the torch tensor. At that moment an
    event is recorded on the consumer's current stream (torch's when torch is loaded), and the
    next producer to take the slot waits on it, so work the training loop queued on that batch
    finishes before it is overwritten. A slot is never taken while referenced: when all are
    held (a caller keeping batches), the batch comes from CuPy's pool and counts in `spills`.
    """

    def __init__(self, shape, dtype, slots: int, device: int = 0):
        import cupy

        self.cupy = cupy
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        with cupy.cuda.Device(device):
            self._mem = [cupy.cuda.alloc(self.nbytes) for _ in range(slots)]
        self._free = collections.deque(range(slots))
        self._ready = [None] * slots  # event recorded when the slot was given back
        self._lock = threading.Lock()
        self.spills = 0

    def acquire(self, n: int, stream):
        """An (n, ...) array over a free slot; `stream` waits until its last user is done."""
        cupy = self.cupy
        shape = (n,) + self.shape[1:]
        with self._lock:
            k = self._free.popleft() if self._free else None
            ev = None if k is None else self._ready[k]
        if k is None:
            self.spills += 1
            return cupy.empty(shape, self.dtype)
        if ev is not None:
            stream.wait_event(ev)
        mem = cupy.cuda.UnownedMemory(self._mem[k].ptr, self.nbytes, _Slot(self, k), self.device)
        return cupy.ndarray(shape, self.dtype, cupy.cuda.MemoryPointer(mem, 0))

    def _release(self, k: int) -> None:
        cupy = self.cupy
        try:
            with cupy.cuda.Device(self.device):
                ev = cupy.cuda.Event(disable_timing=True)
                cupy.cuda.runtime.eventRecord(ev.ptr, _consumer_stream(self.device))
        except Exception:  # interpreter shutdown: nothing will use the slot again
            return
        with self._lock:
            self._ready[k] = ev
            self._free.append(k)

    @property
    def free(self) -> int:
        return len(self._free)


class _Slot:
    """The owner object behind a slot's memory: when it dies, the slot goes back to its ring."""

    __slots__ = ("ring", "k")

    def __init__(self, ring, k):
        self.ring, self.k = ring, k

    def __del__(self):
        self.ring._release(self.k)


def device_memory_used(device: int = 0) -> int:
    """Bytes in use on the GPU (cudaMemGetInfo): CuPy's pool, nvJPEG's buffers, torch, the context."""
    import cupy

    with cupy.cuda.Device(device):
        free, total = cupy.cuda.runtime.memGetInfo()
    return total - free


def _consumer_stream(device: int) -> int:
    """The stream the calling thread works on: torch's current one if torch is loaded, else CuPy's."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_stream(device).cuda_stream
    import cupy

    return cupy.cuda.get_current_stream().ptr


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
    "cpu" forces one side (what the engines cannot take goes to the hybrid decoder or the CPU).
    `hybrid=False` sends progressive and grayscale files to the CPU path instead.
    """

    def __init__(self, size=(224, 224), max_batch: int = 256, layout: str = "NCHW", dtype: str = "float16",
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, cpu_threads: int | None = None, split="auto",
                 device: int = 0, pool: int | None = None, hybrid: bool = True, ring: OutputRing | None = None):
        import cupy

        if layout not in ("NCHW", "NHWC") or dtype not in ("float32", "float16", "uint8"):
            raise ValueError("layout NCHW|NHWC, dtype float32|float16|uint8")
        self.cupy = cupy
        self.device_id = device
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
        self._rates = {"gpu": None, "cpu": None, "hybrid": None}
        self.last = {}
        self.ring = ring
        # the CPU part and the hybrid decoder run beside the engines' submission, on threads kept
        # for the decoder's life (a thread per batch would churn stacks and malloc arenas)
        self._workers = ThreadPoolExecutor(2, thread_name_prefix="recordtool-gpu")
        with self.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._kernel = kernel(dtype, layout)
            self.hw = None
            self.hw_error = None
            self.hybrid = None
            self.hybrid_error = None
            if split != "cpu":
                from .nvjpeg import HardwareDecoder, HybridDecoder, NvjpegError

                try:
                    self.hw = HardwareDecoder(max_batch)
                except (NvjpegError, OSError) as e:  # no engines here: everything on the CPU path
                    self.hw_error = str(e)
                if hybrid:
                    try:
                        self.hybrid_stream = cupy.cuda.Stream(non_blocking=True)
                        self.hybrid = HybridDecoder(self.hybrid_stream.ptr)
                    except (NvjpegError, OSError) as e:
                        self.hybrid_error = str(e)
        self.allocations = 0
        self.prealloc_error = None
        self._arena = None  # device bytes for decoded windows
        self._staging = None  # pinned host bytes for JPEG data
        self._cpu_out = None  # pinned host uint8 (N, h, w, 3) for CPU-decoded samples
        self._cpu_dev = None
        self._samples_host = None

    def output_shape(self, n: int | None = None):
        h, w = self.size
        n = self.max_batch if n is None else n
        return (n, 3, h, w) if self.layout == "NCHW" else (n, h, w, 3)

    # ------------------------------------------------------------------ buffers
    def warmup(self, jpeg_lengths, widths, heights, outputs: int = 3, routes=None) -> None:
        """Size every buffer from the index's largest images, so steady state allocates nothing.

        Uses the same per-image bound as `_ensure` (a window's region is at most the image + 1 px
        each way), so no batch of this dataset can outgrow what warm-up planned; nvJPEG's own
        buffers are pre-allocated for the largest engine-bound image. `outputs`: how many output
        batches can be alive at once (queued + being made + held by the consumer) — the ring's
        slots, unless a shared ring was passed in."""
        b = self.max_batch
        lens = np.sort(np.asarray(jpeg_lengths, np.int64))[::-1][:b]
        regions = np.sort(_region_bytes(np.asarray(widths, np.float64), np.asarray(heights, np.float64)))[::-1][:b]
        self._alloc(int(lens.sum()) + b * 64, int(regions.sum()))
        cpu.reserve(widths, heights, self.cpu_threads, self.pool)  # the CPU share's decode buffers
        if self.ring is None and outputs > 0:
            self.ring = OutputRing(self.output_shape(), self.dtype, outputs, self.device_id)
        if self.hybrid is not None and routes is not None and (np.asarray(routes) == HYBRID).any():
            sel = np.asarray(routes) == HYBRID
            try:
                self._prime_hybrid(int(np.asarray(widths)[sel].max()), int(np.asarray(heights)[sel].max()))
            except Exception as e:
                self.prealloc_error = f"hybrid: {e}"
        if self.hw is not None and len(widths):
            engine = np.ones(len(widths), bool) if routes is None else np.asarray(routes) == ENGINE
            if engine.any():
                W = int(np.asarray(widths)[engine].max())
                H = int(np.asarray(heights)[engine].max())
                try:  # 4:4:4 is the largest layout: enough for any chroma of these sizes
                    with self.device:
                        self.hw.set_padding(16 << 20)
                        self.hw.preallocate(b, W, H, CHROMA_444)
                except Exception as e:  # a sizing hint only: decoding works without it
                    self.prealloc_error = str(e)

    def _prime_hybrid(self, width: int, height: int) -> None:
        """Decode one progressive 4:4:4 image of the largest hybrid-bound size, so the hybrid
        decoder's device and pinned buffers reach their final size now, not mid-epoch."""
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (width, height), (120, 130, 140)).save(buf, "JPEG", quality=90, progressive=True,
                                                                  subsampling=0)
        view = np.frombuffer(buf.getbuffer(), np.uint8)
        with self.device:
            for _ in range(2):  # once per pinned buffer (they alternate)
                self.hybrid.decode(view.ctypes.data, len(view), (0, 0, width, height), self._arena.data.ptr,
                                   width * 3)
            self.hybrid_stream.synchronize()
        del view

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
    def __call__(self, buffers, windows, flips, routes):
        """buffers: JPEG bytes-likes; windows (N, 4) (y, x, h, w); flips: bool (N,); routes:
        `route(...)` codes (N,) from the index, or bool (N,) = hardware-decodable or not.
        Returns a CuPy array (N, 3, h, w) or (N, h, w, 3), complete when the call returns."""
        cupy = self.cupy
        n = len(buffers)
        if n > self.max_batch:
            raise ValueError(f"batch of {n} > max_batch {self.max_batch}")
        windows = np.asarray(windows, np.float64).reshape(n, 4)
        flips = np.asarray(flips, bool).reshape(n)
        routes = np.asarray(routes).reshape(n)
        routes = np.where(routes, ENGINE, CPU) if routes.dtype == bool else routes.copy()
        # Neither GPU decoder reports a truncated stream (seen on the H200): a file that does not
        # end in EOI goes to libjpeg, which names it — or decodes it, if only trailing bytes follow.
        routes[[bytes(b[-2:]) != b"\xff\xd9" for b in buffers]] = CPU
        self._ensure(buffers, windows)
        # -- split: everything no GPU decoder takes, plus a share of the engines' images, to the CPU
        eligible = np.nonzero(routes == ENGINE)[0] if self.hw is not None else np.zeros(0, np.int64)
        hyb_idx = np.nonzero(routes == HYBRID)[0] if self.hybrid is not None else np.zeros(0, np.int64)
        rh, rg = self._rates["hybrid"], self._rates["gpu"]
        if self.split == "auto" and rh and rg and len(hyb_idx) > 2:
            # the hybrid decoder's Huffman pass is one thread: give it what it finishes while the
            # engines do their share; the rest goes to the CPU threads
            t_engines = len(eligible) * (1 - self.cpu_fraction) / rg
            hyb_idx = hyb_idx[: max(2, int(rh * t_engines))]
        on_gpu = np.zeros(n, bool)
        on_gpu[eligible] = True
        on_gpu[hyb_idx] = True
        forced = np.nonzero(~on_gpu)[0]
        want_cpu = int(round(self.cpu_fraction * n))
        extra = max(0, min(len(eligible), want_cpu - len(forced)))
        gpu_idx = eligible[: len(eligible) - extra]
        cpu_idx = np.concatenate([forced, eligible[len(eligible) - extra:]]).astype(np.int64)
        h, w = self.size
        t0 = time.perf_counter()
        samples = self._samples_host[:n]
        # arena places for every window a GPU decoder writes (engines and hybrid)
        layout = self._layout(windows, np.concatenate([gpu_idx, hyb_idx]).astype(np.int64), samples)

        def cpu_part():
            t = time.perf_counter()
            errors = []
            if len(cpu_idx):
                cpu.decode_crop_resize([buffers[i] for i in cpu_idx], windows[cpu_idx], size=(h, w),
                                       threads=self.cpu_threads, out=self._cpu_out[: len(cpu_idx)],
                                       on_error="skip", fallback=True, errors=errors, pool=self.pool)
            return time.perf_counter() - t, [(int(cpu_idx[i]), r) for i, r in errors]

        cpu_job = self._workers.submit(cpu_part)
        hyb_job = self._workers.submit(self._decode_hybrid, buffers, hyb_idx, layout) if len(hyb_idx) else None
        t_hyb = None
        hw_failed, hyb_failed = [], []
        with self.device, self.stream:
            ev_start = self.stream.record()
            tg = time.perf_counter()
            if len(gpu_idx):
                try:
                    self._decode_hw(buffers, gpu_idx, layout)
                except Exception as e:  # the engines refused the batch: the CPU takes it
                    hw_failed = gpu_idx.tolist()
                    self.last_gpu_error = str(e)
            t_host = time.perf_counter() - tg
            ev_decoded = self.stream.record()
            t_cpu, errors = cpu_job.result()
            if hyb_job is not None:
                hyb_failed, t_hyb = hyb_job.result()
                self.stream.wait_event(self.hybrid_stream.record())
            gpu_failed = hw_failed + hyb_failed
            if gpu_failed:  # what a GPU decoder refused: the CPU path decodes it (or names the error)
                gpu_failed = np.asarray(gpu_failed, np.int64)
                extra_out = np.empty((len(gpu_failed), h, w, 3), np.uint8)
                errs = []
                cpu.decode_crop_resize([buffers[i] for i in gpu_failed], windows[gpu_failed], size=(h, w),
                                       threads=self.cpu_threads, out=extra_out, on_error="skip", fallback=True, errors=errs,
                                       pool=self.pool)
                errors += [(int(gpu_failed[i]), r) for i, r in errs]
                cpu_idx = np.concatenate([cpu_idx, gpu_failed])
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
            out = self.ring.acquire(n, self.stream) if self.ring is not None else \
                cupy.empty(self.output_shape(n), self.dtype)
            m, s = self.mean, self.std
            self._kernel(((w + 31) // 32, (h + 7) // 8, n), (32, 8, 1),
                         (self._samples_dev, out, np.int32(w), np.int32(h), np.float32(m[0]), np.float32(m[1]),
                          np.float32(m[2]), np.float32(s[0]), np.float32(s[1]), np.float32(s[2])))
            self.stream.synchronize()
            t_gpu = None
            if len(gpu_idx) and not hw_failed:  # engine time: host submission or device work, the longer
                t_gpu = max(t_host, cupy.cuda.get_elapsed_time(ev_start, ev_decoded) / 1e3)
        n_gpu = len(gpu_idx) - len(hw_failed)
        self._adapt(n, n_gpu, t_gpu, len(cpu_idx) - len(gpu_failed), t_cpu,
                    len(hyb_idx) - len(hyb_failed), t_hyb if not hyb_failed else None)
        self.last = {"n": n, "gpu": int(n_gpu), "hybrid": int(len(hyb_idx) - len(hyb_failed)),
                     "cpu": int(len(cpu_idx)), "cpu_forced": int(len(forced)), "cpu_fraction": self.cpu_fraction,
                     "gpu_rate": self._rates["gpu"], "cpu_rate": self._rates["cpu"],
                     "hybrid_rate": self._rates["hybrid"],
                     "errors": errors, "seconds": time.perf_counter() - t0}
        return out

    def _layout(self, windows, idx, samples):
        """Place each GPU-decoded window's whole-pixel region in the arena; fill its sample row.
        Returns {index: (rx, ry, rw, rh, dst, pitch)}."""
        win = windows[idx]
        y, x, hh, ww = win[:, 0], win[:, 1], win[:, 2], win[:, 3]
        rx, ry = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
        rw = np.maximum(1, np.ceil(x + ww).astype(np.int64) - rx)
        rh = np.maximum(1, np.ceil(y + hh).astype(np.int64) - ry)
        pitch = rw * 3
        size = (pitch * rh + _ALIGN - 1) // _ALIGN * _ALIGN
        dst = self._arena.data.ptr + np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
        s = samples[idx]
        s["src"], s["pitch"], s["rw"], s["rh"] = dst, pitch, rw, rh
        s["x0"], s["y0"], s["x1"], s["y1"] = x - rx, y - ry, x + ww - rx, y + hh - ry
        samples[idx] = s
        return dict(zip(idx.tolist(), zip(rx.tolist(), ry.tolist(), rw.tolist(), rh.tolist(), dst.tolist(),
                                          pitch.tolist())))

    def _decode_hw(self, buffers, gpu_idx, layout):
        """Stage JPEG bytes in pinned memory, decode each window as an ROI into the arena."""
        bufs = [buffers[i] for i in gpu_idx]
        stage_base = self._staging_np.ctypes.data
        if cpu.native_available():  # one GIL-free memcpy pass
            offs = cpu._native.gather(bufs, stage_base, self._staging_np.size, 64)
        else:
            offs = np.cumsum([0] + [(len(b) + 63) // 64 * 64 for b in bufs[:-1]])
            for o, b in zip(offs, bufs):
                self._staging_np[o:o + len(b)] = np.frombuffer(b, np.uint8)
        places = [layout[int(i)] for i in gpu_idx]
        self.hw.decode((stage_base + np.asarray(offs, np.int64)).tolist(), [len(b) for b in bufs],
                       [p[:4] for p in places], [p[4] for p in places], [p[5] for p in places], self.stream.ptr)

    def _decode_hybrid(self, buffers, hyb_idx, layout) -> list:
        """Hybrid-decode each window (Huffman on this thread, the rest on the hybrid stream);
        return the indices it refused, for the CPU path, and the seconds it took."""
        t = time.perf_counter()
        failed = []
        with self.device:
            for i in hyb_idx.tolist():
                b = buffers[i]
                rx, ry, rw, rh, dst, pitch = layout[i]
                try:
                    view = np.frombuffer(b, np.uint8)
                    self.hybrid.decode(view.ctypes.data, len(view), (rx, ry, rw, rh), dst, pitch)
                except Exception:
                    failed.append(i)
            self.hybrid_stream.synchronize()
        return failed, time.perf_counter() - t

    def _adapt(self, n, n_gpu, t_gpu, n_cpu, t_cpu, n_hyb=0, t_hyb=None):
        """Move the CPU share so that both sides take the same time on the next batch."""
        a = 0.3
        for key, nn, t, least in (("gpu", n_gpu, t_gpu, 8), ("cpu", n_cpu, t_cpu, 8), ("hybrid", n_hyb, t_hyb, 2)):
            if nn >= least and t:
                r = nn / t
                self._rates[key] = r if self._rates[key] is None else (1 - a) * self._rates[key] + a * r
        if self.split != "auto" or self.hw is None:
            return
        rg, rc = self._rates["gpu"], self._rates["cpu"]
        if rg and rc:
            self.cpu_fraction = float(np.clip(rc / (rc + rg), 0.0, 0.9))
        elif rg and not rc:
            self.cpu_fraction = max(0.05, 8.5 / max(n, 1))  # measure the CPU once (≥ 8 images)
        elif rc and not rg:
            self.cpu_fraction = 0.5

    def close(self):
        self._workers.shutdown(wait=True)
        for name in ("hw", "hybrid"):
            d = getattr(self, name, None)
            if d is not None:
                d.close()
                setattr(self, name, None)


def to_torch(array, stream=None):
    """Hand a CuPy array to PyTorch through DLPack; PyTorch's current stream waits for `stream`."""
    import torch

    if stream is not None:
        dev = torch.device("cuda", array.device.id)
        torch.cuda.current_stream(dev).wait_stream(torch.cuda.ExternalStream(stream.ptr, device=dev))
    return torch.from_dlpack(array)
