"""Every buffer the GPU decoder uses, sized once at warm-up so steady state allocates nothing:
pinned staging for JPEG bytes, the device arena for decoded windows, a pinned buffer for the
CPU share's pixels (the kernel reads them there), the per-sample table the kernel reads, and
the ring of output batches handed to the consumer.

How much each holds is room.py's: the planar arena and the staging are sized for a batch as the
dataset's records make one (room.batch_room); a batch that does not fit sends the images past
the room to the CPU share (GPUDecoder counts them in BatchReport.overflow): memory stays fixed.
"""
from __future__ import annotations

import collections
import sys
import threading

import numpy as np

from .kernel import FMT_GRAY, FMT_RGB, FMT_YCC, SAMPLE_DTYPE
from .room import ALIGN, PlaneLayout, region_bytes, staging_bytes


def mapped_pointer(cupy, host_ptr: int) -> int:
    """The device address of pinned host memory (cudaHostAlloc'd: with unified addressing, every
    CUDA 13 platform, it is mapped and the address is the host's)."""
    dev = int(cupy.cuda.runtime.pointerGetAttributes(host_ptr).devicePointer)
    if not dev:
        raise RuntimeError(f"pinned memory at {host_ptr:#x} is not mapped into the device's address space")
    return dev


class DecodeBuffers:
    """The decoder's working memory for batches of up to `max_batch` images of `size` (h, w).

    Args:
        cupy: the cupy module.
        max_batch: images per batch at most.
        size: output (h, w).
        device: the CUDA device every device buffer lives on (whatever the calling thread's
            current device is: producer threads do not inherit the caller's).
    """

    def __init__(self, cupy, max_batch: int, size, device: int = 0):
        self.cupy, self.max_batch, self.device = cupy, max_batch, device
        h, w = size
        b = max_batch
        self.staging = self.staging_np = self.arena = None
        self.allocations = 0  # growths after construction (0 in steady state)
        self.planned = False  # sized by a warm-up: a batch then fits the room (room_for), never grows it
        with cupy.cuda.Device(device):
            self._cpu_out_mem = cupy.cuda.alloc_pinned_memory(b * h * w * 3)
            self.cpu_out = np.frombuffer(self._cpu_out_mem, np.uint8, b * h * w * 3).reshape(b, h, w, 3)
            # the kernel reads the CPU share's pixels where the CPU wrote them: pinned memory is
            # mapped into every device's address space (unified addressing), so they need no
            # device buffer — a whole batch's room, 48 MB at 512 images of 176² — and no copy.
            # They are rewritten only by the next batch, after GPUDecoder waited for this one's kernel
            self.cpu_src = mapped_pointer(cupy, self.cpu_out.ctypes.data)
            self._samples_mem = cupy.cuda.alloc_pinned_memory(b * SAMPLE_DTYPE.itemsize)
            self.samples = np.frombuffer(self._samples_mem, SAMPLE_DTYPE, b)
            self.samples_dev = cupy.empty(b * SAMPLE_DTYPE.itemsize, np.uint8)

    def reserve(self, staging: int, arena: int) -> None:
        """Have at least this many pinned staging and device arena bytes."""
        cupy = self.cupy
        grow_staging = self.staging_np is None or staging > self.staging_np.size
        grow_arena = self.arena is None or arena > self.arena.size
        if not (grow_staging or grow_arena):
            return  # each batch asks; entering the device context alone costs CUDA calls
        with cupy.cuda.Device(self.device):
            if grow_staging:
                self._staging_mem = cupy.cuda.alloc_pinned_memory(staging)
                self.staging_np = np.frombuffer(self._staging_mem, np.uint8, staging)
                self.allocations += 1
            if grow_arena:
                self.arena = cupy.empty(arena, np.uint8)
                self.allocations += 1

    def plan_for(self, jpeg_lengths, widths, heights) -> tuple:
        """(staging, arena) bytes that no batch of this dataset can outgrow: the `max_batch`
        largest files and regions (a window's region is at most the image + 1 px each way)."""
        b = self.max_batch
        lens = np.sort(np.asarray(jpeg_lengths, np.int64))[::-1][:b]
        regions = np.sort(region_bytes(np.asarray(widths, np.float64), np.asarray(heights, np.float64)))[::-1][:b]
        return staging_bytes(lens), int(regions.sum())

    def room_for(self, arena_need, staging_need) -> np.ndarray:
        """Which of these images fit the arena and the staging as they are, taken in order: each
        whose planes (arena_need) and JPEG slot (staging_need) fit beside those of the images
        before it that fit — an image past the room leaves the room to the later, smaller ones
        (a batch's large image first must not send all the rest to the CPU share). Before a
        warm-up planned them, the buffers grow to take all (counted in .allocations)."""
        a, s = np.asarray(arena_need, np.int64), np.asarray(staging_need, np.int64)
        if not len(a):
            return np.zeros(0, bool)
        ca, cs = np.cumsum(a), np.cumsum(s)
        if not self.planned:
            self.reserve(int(cs[-1]), int(ca[-1]))
            return np.ones(len(a), bool)
        room_a, room_s = self.arena.size, self.staging_np.size
        fit = (ca <= room_a) & (cs <= room_s)
        if fit.all():
            return fit
        k = int(np.argmin(fit))  # the first image past the room: from there, one by one
        used_a, used_s = int(ca[k] - a[k]), int(cs[k] - s[k])
        for j in range(k, len(a)):
            fit[j] = used_a + a[j] <= room_a and used_s + s[j] <= room_s
            if fit[j]:
                used_a, used_s = used_a + int(a[j]), used_s + int(s[j])
        return fit

    def ensure(self, buffers, windows) -> None:
        """Grow if this batch needs more than warm-up planned (counted in .allocations)."""
        need_arena = int(region_bytes(windows[:, 3], windows[:, 2]).sum())
        self.reserve(staging_bytes([len(x) for x in buffers]), need_arena)

    def place(self, windows, idx) -> "Places":
        """Place each window of `idx` (whole-pixel region) in the arena and fill its sample row.
        Returns where each landed, for the decoders."""
        s = self.samples
        win = windows[idx]
        y, x, hh, ww = win[:, 0], win[:, 1], win[:, 2], win[:, 3]
        rx, ry = np.floor(x).astype(np.int64), np.floor(y).astype(np.int64)
        rw = np.maximum(1, np.ceil(x + ww).astype(np.int64) - rx)
        rh = np.maximum(1, np.ceil(y + hh).astype(np.int64) - ry)
        pitch = rw * 3
        size = (pitch * rh + ALIGN - 1) // ALIGN * ALIGN
        dst = self.arena.data.ptr + np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64)
        s["src"][idx], s["pitch"][idx], s["rw"][idx], s["rh"][idx] = dst, pitch, rw, rh
        s["x0"][idx], s["y0"][idx], s["x1"][idx], s["y1"][idx] = x - rx, y - ry, x + ww - rx, y + hh - ry
        s["format"][idx], s["ox"][idx], s["oy"][idx] = FMT_RGB, 0, 0
        s["red"][idx], s["tx1"][idx] = 0, 0  # full scale, taps clamped to the region
        return Places(idx, len(windows), np.stack([rx, ry, rw, rh], 1), dst, pitch)

    def place_whole(self, idx, size, base: int) -> None:
        """Sample rows of images that are already output-sized, packed back to back from `base`
        in `idx` order (the CPU share: `cpu_src`)."""
        place_whole(self.samples, idx, size, base)

    def place_planar(self, windows, idx, dims, rois=None, regions=None, red=None,
                     layout: PlaneLayout | None = None) -> "PlanarPlaces":
        """Place the planes of each image of `idx` in the arena (growing it if this batch needs
        more than warm-up planned) and fill its sample row: the window in image pixels, FMT_YCC
        or FMT_GRAY with the chroma planes' geometry, and where its planes start (ox, oy).

        Args:
            windows: (N, 4) (y, x, h, w) of the batch.
            idx: batch positions to place.
            dims: per position of idx, (width, height, hs, vs, y_w, y_h, c_w, c_h): the image,
                its chroma subsampling (hs = 0: grayscale) and the plane sizes nvJPEG writes
                (image_info). Whole planes are allocated for the larger of those and libjpeg's
                sizes; the kernel clamps to libjpeg's (reference.chroma_size).
            rois: per position of idx, the region (x, y, w, h) to decode (gpu.roi.plan_rois:
                x a multiple of hs, y of vs); None: whole images. A region's planes are its
                size (chroma: roi.chroma_dims) plus what nvJPEG's plane sizes exceed libjpeg's by.
            regions: bool per position of idx, whether its region is used (else its whole
                image); None: all of them.
            red: per position of idx, the reduction (1, 2, 4) that reproduces the CPU path's
                DCT scaling of that window (roi.dct_reduction); None: 1 (full scale). The
                sample's size, window and tap box are the (reduced) image's, the taps clamped to
                the window's whole-pixel region there, as the CPU path resamples it.
            layout: PlaneLayout(dims, rois, regions) when the caller has it (it sized the room
                with it); None: made here.
        Returns where each image's planes are, by batch position (PlanarPlaces), for the decoders."""
        s = self.samples
        L = PlaneLayout(dims, rois, regions) if layout is None else layout
        w, h, gray, hs1, vs1, cw, ch = L.w, L.h, L.gray, L.hs1, L.vs1, L.cw, L.ch
        r, used, ypitch, cpitch, ysize, csize, total = L.r, L.used, L.ypitch, L.cpitch, L.ysize, L.csize, L.total
        self.reserve(0, int(total.sum()))  # GPUDecoder fits the batch first (room_for): no growth there
        base = self.arena.data.ptr + np.concatenate([[0], np.cumsum(total)[:-1]]).astype(np.int64)
        cb, cr = base + ysize, base + ysize + csize
        win = windows[idx]
        red = np.ones(len(idx), np.int64) if red is None else np.asarray(red, np.int64).reshape(len(idx))
        s["src"][idx], s["pitch"][idx] = base, ypitch
        s["rw"][idx], s["rh"][idx] = -(-w // red), -(-h // red)  # the (reduced) image's size
        box = scaled_boxes(win, red, w, h)
        s["x0"][idx], s["y0"][idx], s["x1"][idx], s["y1"][idx] = box[:, 0], box[:, 1], box[:, 2], box[:, 3]
        s["red"][idx], s["iw"][idx], s["ih"][idx] = np.where(red > 1, red, 0), w, h
        # taps inside the window's whole-pixel region (of the reduced image): what the CPU path
        # resamples and Pillow's crop → resize does, so the filter never reaches past the window
        s["tx0"][idx], s["ty0"][idx], s["tx1"][idx], s["ty1"][idx] = box[:, 4], box[:, 5], box[:, 6], box[:, 7]
        s["format"][idx] = np.where(gray, FMT_GRAY, FMT_YCC)
        s["cb"][idx], s["cr"][idx], s["cpitch"][idx] = np.where(gray, base, cb), np.where(gray, base, cr), cpitch
        s["hs"][idx], s["vs"][idx], s["cw"][idx], s["ch"][idx] = hs1, vs1, cw, ch
        s["ox"][idx], s["oy"][idx] = r[:, 0], r[:, 1]
        planes = np.stack([base, np.where(gray, base, cb), np.where(gray, base, cr)], 1)
        pitches = np.stack([ypitch, cpitch, cpitch], 1)
        return PlanarPlaces(idx, len(windows), planes, pitches, gray, np.where(used[:, None], r, NO_ROI))


def scaled_boxes(win, red, width, height) -> np.ndarray:
    """Per window (y, x, h, w) of an image width × height decoded at 1 / red: its float box
    (x0, y0, x1, y1) in pixels of the reduced image (ceil(width / red) × ceil(height / red))
    and the whole-pixel region (rx0, ry0, rx1, ry1) holding it, clamped to that image — the
    region the CPU path decodes at that scale and resamples (reference.region_of, native
    fused.cpp). float64 (n, 8)."""
    win = np.asarray(win, np.float64).reshape(-1, 4)
    s = 1.0 / np.asarray(red, np.float64).reshape(-1)
    sw = -(-np.asarray(width, np.int64).reshape(-1) // np.asarray(red, np.int64).reshape(-1))
    sh = -(-np.asarray(height, np.int64).reshape(-1) // np.asarray(red, np.int64).reshape(-1))
    bx0, by0 = win[:, 1] * s, win[:, 0] * s
    bx1, by1 = (win[:, 1] + win[:, 3]) * s, (win[:, 0] + win[:, 2]) * s
    rx0 = np.minimum(sw - 1, np.floor(bx0 + 1e-9))
    ry0 = np.minimum(sh - 1, np.floor(by0 + 1e-9))
    rx1 = np.minimum(sw, np.ceil(bx1 - 1e-9))
    ry1 = np.minimum(sh, np.ceil(by1 - 1e-9))
    rx1, ry1 = np.maximum(rx1, rx0 + 1), np.maximum(ry1, ry0 + 1)
    return np.stack([bx0, by0, bx1, by1, rx0, ry0, rx1, ry1], 1)


def place_whole(samples, idx, size, base: int) -> None:
    """Rows `idx` of a sample table for output-sized uint8 RGB images packed back to back from
    `base` in `idx` order (DecodeBuffers' CPU share; a user op's uint8 batch)."""
    h, w = size
    s = samples
    s["src"][idx] = base + np.arange(len(idx), dtype=np.int64) * (h * w * 3)
    s["pitch"][idx], s["rw"][idx], s["rh"][idx] = w * 3, w, h
    s["x0"][idx], s["y0"][idx], s["x1"][idx], s["y1"][idx] = 0.0, 0.0, float(w), float(h)
    s["format"][idx], s["ox"][idx], s["oy"][idx] = FMT_RGB, 0, 0
    s["red"][idx], s["tx1"][idx] = 0, 0


class Places:
    """Where each placed window of a batch lands: its whole-pixel region (x, y, w, h) of the
    source and its destination (device pointer, pitch) in the arena, by batch position."""

    def __init__(self, idx, n: int, rois, dst, pitch):
        self._row = np.full(n, -1, np.int64)
        self._row[np.asarray(idx, np.int64)] = np.arange(len(idx))
        self.rois, self.dst, self.pitch = rois.astype(np.int64), dst.astype(np.int64), pitch.astype(np.int64)

    def __getitem__(self, i: int) -> tuple:
        """(rx, ry, rw, rh, dst, pitch) of batch position i."""
        r = self._row[int(i)]
        if r < 0:
            raise KeyError(i)
        return (*(int(v) for v in self.rois[r]), int(self.dst[r]), int(self.pitch[r]))

    def take(self, idx) -> tuple:
        """(rois (k, 4), dst (k,), pitch (k,)) of batch positions idx, as arrays."""
        r = self._row[np.asarray(idx, np.int64)]
        if (r < 0).any():
            raise KeyError("position not placed")
        return self.rois[r], self.dst[r], self.pitch[r]


NO_ROI = np.array([0, 0, -1, -1], np.int64)
"""nvJPEG's region (x, y, w, h) for the whole image (its decode params' ROI off)."""


class PlanarPlaces:
    """Where each placed image's planes land (chroma="interpolate"), by batch position, as
    arrays: the decoders take a batch's rows in one indexing, not a Python loop per image."""

    def __init__(self, idx, n: int, planes, pitches, gray, rois):
        self._row = np.full(n, -1, np.int64)
        self._row[np.asarray(idx, np.int64)] = np.arange(len(idx))
        self.planes, self.pitches = np.asarray(planes, np.int64), np.asarray(pitches, np.int64)
        self.gray, self.rois = np.asarray(gray, bool), np.asarray(rois, np.int64).reshape(-1, 4)

    def __getitem__(self, i: int) -> tuple:
        """((Y, Cb, Cr) pointers, (pitches), gray, region (x, y, w, h) or None) of position i."""
        r = self._row[int(i)]
        if r < 0:
            raise KeyError(i)
        roi = self.rois[r]
        return (tuple(int(v) for v in self.planes[r]), tuple(int(v) for v in self.pitches[r]), bool(self.gray[r]),
                None if (roi == NO_ROI).all() else tuple(int(v) for v in roi))

    def take(self, idx) -> tuple:
        """(planes (k, 3), pitches (k, 3), gray (k,), rois (k, 4): NO_ROI for a whole image) of
        batch positions idx; a gray image's Cb, Cr columns are 0."""
        r = self._row[np.asarray(idx, np.int64)]
        if (r < 0).any():
            raise KeyError("position not placed")
        planes, pitches, gray = self.planes[r], self.pitches[r], self.gray[r]
        planes[gray, 1:], pitches[gray, 1:] = 0, 0
        return planes, pitches, gray, self.rois[r]


class OutputRing:
    """Output batches allocated once and recycled, so steady state allocates no device memory.

    A slot is handed out as a CuPy array whose memory owner gives the slot back when the last
    reference dies — the CuPy array or, through DLPack, the torch tensor. At that moment an
    event is recorded on the consumer's current stream (torch's when torch is loaded), and the
    next producer to take the slot waits on it, so work the training loop queued on that batch
    finishes before it is overwritten. A slot is never taken while referenced: when all are
    held (a caller keeping batches), the batch comes from CuPy's pool and counts in `spills`.

    Args:
        shape: the full batch shape (max_batch, ...).
        dtype: element type.
        slots: batches alive at once (queued + being made + held by the consumer).
        device: CUDA device id.
        producer_owned: the slots are given back by the producer itself once the GPU is done
            with them (a user op's uint8 ring: the normalising pass has completed), so no event
            is recorded — an event on the releasing thread's default stream would make the next
            decode wait for whatever the training loop queued there.
    """

    def __init__(self, shape, dtype, slots: int, device: int = 0, producer_owned: bool = False):
        import cupy

        self.cupy, self.producer_owned = cupy, producer_owned
        self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        with cupy.cuda.Device(device):
            self._mem = [cupy.cuda.alloc(self.nbytes) for _ in range(slots)]
        self._free = collections.deque(range(slots))
        self._ready = [None] * slots  # event recorded when the slot was given back
        self._lock = threading.Lock()
        self.spills = 0

    @property
    def slots(self) -> int:
        return len(self._mem)

    def acquire(self, n: int, stream):
        """An (n, ...) array over a free slot; `stream` waits until its last user is done."""
        out, ev = self.take(n)
        if ev is not None:
            stream.wait_event(ev)
        return out

    def take(self, n: int):
        """(an (n, ...) array over a free slot, the event after its last user or None): the
        stream that writes it must wait for that event first (`acquire` does)."""
        cupy = self.cupy
        shape = (n,) + self.shape[1:]
        with self._lock:
            k = self._free.popleft() if self._free else None
            ev = None if k is None else self._ready[k]
            if k is None:
                self.spills += 1
        if k is None:
            return cupy.empty(shape, self.dtype), None
        mem = cupy.cuda.UnownedMemory(self._mem[k].ptr, self.nbytes, _Slot(self, k), self.device)
        return cupy.ndarray(shape, self.dtype, cupy.cuda.MemoryPointer(mem, 0)), ev

    def _release(self, k: int) -> None:
        cupy = self.cupy
        if self.producer_owned:
            with self._lock:
                self._ready[k] = None
                self._free.append(k)
            return
        try:
            with cupy.cuda.Device(self.device):
                ev = cupy.cuda.Event(disable_timing=True)
                cupy.cuda.runtime.eventRecord(ev.ptr, consumer_stream(self.device))
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


def consumer_stream(device: int) -> int:
    """The stream the calling thread works on: torch's current one if torch is loaded, else CuPy's."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_stream(device).cuda_stream
    import cupy

    return cupy.cuda.get_current_stream().ptr


def device_memory_used(device: int = 0) -> int:
    """Bytes in use on the GPU (cudaMemGetInfo): CuPy's pool, nvJPEG's buffers, torch, the context."""
    import cupy

    with cupy.cuda.Device(device):
        free, total = cupy.cuda.runtime.memGetInfo()
    return total - free
