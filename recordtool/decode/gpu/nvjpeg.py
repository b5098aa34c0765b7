"""A small ctypes binding to nvJPEG: hardware batched decode with a region of interest per image,
and the decoupled hybrid decoder (CPU Huffman, GPU IDCT) for what the engines cannot take.

Loads libnvjpeg.so.13 or .so.12 — whichever matches the CUDA major version of the installed
CuPy — from the nvidia-nvjpeg wheels or the CUDA toolkit (_bundled.nvjpeg_candidates). Only what
recordtool uses is bound.

Not split: it is one library's ABI in one place — the loading, enums, structs, `check` and
every ctypes declaration are shared by the hardware and the hybrid decoder; split, each part
would declare its half of nvjpeg.h again and the two could drift.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..._bundled import nvjpeg_candidates
from ...errors import RecordtoolError

try:  # the GIL-free batch submission (native/nvjpeg_submit.cpp); optional like the decoder
    from ... import _nvsubmit
except ImportError:
    _nvsubmit = None
if _nvsubmit is not None and not hasattr(_nvsubmit, "infos"):  # a build older than its source: unused
    _nvsubmit = None

# enums (nvjpeg.h)
BACKEND_DEFAULT, BACKEND_HYBRID, BACKEND_GPU_HYBRID, BACKEND_HARDWARE = 0, 1, 2, 3
OUTPUT_YUV, OUTPUT_Y, OUTPUT_RGBI = 1, 2, 5
# nvjpegCreateEx flags: the hardware backend's batched decode without its buffering of images
# across calls; (nvJPEG ≥ 12.1) interpolated chroma upsampling in nvJPEG's own colour conversion
FLAGS_HW_DECODE_NO_PIPELINE = 1
FLAGS_UPSAMPLING_WITH_INTERPOLATION = 32
CSS_GRAY = 6
STATUS = {0: "SUCCESS", 1: "NOT_INITIALIZED", 2: "INVALID_PARAMETER", 3: "BAD_JPEG", 4: "JPEG_NOT_SUPPORTED",
          5: "ALLOCATOR_FAILURE", 6: "EXECUTION_FAILED", 7: "ARCH_MISMATCH", 8: "INTERNAL_ERROR",
          9: "IMPLEMENTATION_NOT_SUPPORTED", 10: "INCOMPLETE_BITSTREAM"}


class NvjpegError(RecordtoolError, RuntimeError):
    def __init__(self, call: str, status: int):
        self.status = status
        super().__init__(f"{call} failed: NVJPEG_STATUS_{STATUS.get(status, status)}")


class Image(ctypes.Structure):
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def _cuda_major() -> int:
    import cupy

    return cupy.cuda.runtime.runtimeGetVersion() // 1000


_lib = None


def lib():
    global _lib, _path
    if _lib is None:
        major = _cuda_major()
        errors = []
        for path in nvjpeg_candidates(major):
            try:
                _lib = ctypes.CDLL(path)
                _path = path
                break
            except OSError as e:
                errors.append(str(e))
        if _lib is None:
            raise OSError(f"libnvjpeg.so.{major} not found (install nvidia-nvjpeg"
                          f"{'-cu12' if major == 12 else ''}); tried: {errors[-3:]}")
        _declare(_lib)
    return _lib


_path = _quick = None


def quick():
    """The same library through ctypes.PyDLL: its calls keep the GIL. For nvJPEG's short calls
    (parse a header, set an ROI or a buffer, queue device work) a call through CDLL releases the
    GIL and must take it back — a hand-off with the training loop's thread every time, which
    costs that thread more than the call itself. Long calls (Huffman decoding) go through lib()."""
    global _quick
    if _quick is None:
        lib()
        _quick = ctypes.PyDLL(_path)
        _declare(_quick)
    return _quick


def _declare(L):
    p, i, u, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
    sigs = {
        "nvjpegCreateEx": [i, p, p, u, ctypes.POINTER(p)],
        "nvjpegDestroy": [p],
        "nvjpegGetHardwareDecoderInfo": [p, ctypes.POINTER(u), ctypes.POINTER(u)],
        "nvjpegGetImageInfo": [p, p, sz, ctypes.POINTER(i), ctypes.POINTER(i), ctypes.POINTER(i), ctypes.POINTER(i)],
        "nvjpegJpegStateCreate": [p, ctypes.POINTER(p)],
        "nvjpegJpegStateDestroy": [p],
        "nvjpegDecodeBatchedInitialize": [p, p, i, i, i],
        "nvjpegDecodeBatchedEx": [p, p, ctypes.POINTER(p), ctypes.POINTER(sz), ctypes.POINTER(Image),
                                  ctypes.POINTER(p), p],
        "nvjpegDecodeParamsCreate": [p, ctypes.POINTER(p)],
        "nvjpegDecodeParamsDestroy": [p],
        "nvjpegDecodeParamsSetROI": [p, i, i, i, i],
        "nvjpegDecodeParamsSetOutputFormat": [p, i],
        "nvjpegSetDeviceMemoryPadding": [sz, p],
        "nvjpegSetPinnedMemoryPadding": [sz, p],
        "nvjpegDecodeBatchedPreAllocate": [p, p, i, i, i, i, i],
        # decoupled API
        "nvjpegDecoderCreate": [p, i, ctypes.POINTER(p)],
        "nvjpegDecoderDestroy": [p],
        "nvjpegDecoderStateCreate": [p, p, ctypes.POINTER(p)],
        "nvjpegBufferPinnedCreate": [p, p, ctypes.POINTER(p)],
        "nvjpegBufferPinnedDestroy": [p],
        "nvjpegBufferDeviceCreate": [p, p, ctypes.POINTER(p)],
        "nvjpegBufferDeviceDestroy": [p],
        "nvjpegStateAttachPinnedBuffer": [p, p],
        "nvjpegStateAttachDeviceBuffer": [p, p],
        "nvjpegJpegStreamCreate": [p, ctypes.POINTER(p)],
        "nvjpegJpegStreamDestroy": [p],
        "nvjpegJpegStreamParse": [p, p, sz, i, i, p],
        "nvjpegDecodeJpegHost": [p, p, p, p, p],
        "nvjpegDecodeJpegTransferToDevice": [p, p, p, p, p],
        "nvjpegDecodeJpegDevice": [p, p, p, ctypes.POINTER(Image), p],
    }
    for name, args in sigs.items():
        fn = getattr(L, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int


# decode_batch's call codes (native/nvjpeg_submit.cpp hybrid)
_HYBRID_CALLS = {1: "cuEventSynchronize", 2: "nvjpegJpegStreamParse", 3: "nvjpegDecodeParamsSetOutputFormat",
                 4: "nvjpegDecodeParamsSetROI", 5: "nvjpegStateAttachPinnedBuffer", 6: "nvjpegDecodeJpegHost",
                 7: "nvjpegDecodeJpegTransferToDevice", 8: "cuEventRecord", 9: "nvjpegDecodeJpegDevice"}
_cuda = None
_thread = threading.local()  # per thread: the devices whose primary context context_current made current here


def _driver():
    """The CUDA driver library (its event record and wait, by address for _nvsubmit.hybrid: a
    CUDA runtime event is the driver's CUevent)."""
    global _cuda
    if _cuda is None:
        _cuda = ctypes.CDLL("libcuda.so.1")
    return _cuda


def context_current() -> None:
    """Make the current device's primary context current on this thread, once per thread and
    device: the driver's calls (by address in _nvsubmit) need one, and a runtime call alone may
    leave none; cudaSetDevice makes it current."""
    import cupy

    rt = cupy.cuda.runtime
    dev = rt.getDevice()
    seen = getattr(_thread, "devices", None)
    if seen is None:
        seen = _thread.devices = set()
    if dev not in seen:
        rt.setDevice(dev)
        seen.add(dev)


def _addr(fn) -> int:
    """The address of a ctypes-loaded C function (for recordtool._nvsubmit)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def check(call: str, status: int) -> None:
    if status != 0:
        raise NvjpegError(call, status)


class _Handle:
    """What both decoders share: an nvJPEG library handle (`self.handle`), its buffer growth
    padding, and release on close / garbage collection."""

    L = None
    handle = None
    _info = None

    def image_info(self, ptr: int, length: int):
        """(components, chroma code, widths[3], heights[3]) of the JPEG at host `ptr` (its header
        only, nvjpegGetImageInfo): the plane sizes planar output writes. Not thread-safe per
        instance (its result arrays are reused)."""
        if self._info is None:
            self._info = (ctypes.c_int(), ctypes.c_int(), (ctypes.c_int * 4)(), (ctypes.c_int * 4)())
        nc, css, w, h = self._info
        check("nvjpegGetImageInfo", self.L.nvjpegGetImageInfo(self.handle, ptr, length, ctypes.byref(nc),
                                                              ctypes.byref(css), w, h))
        return nc.value, css.value, (w[0], w[1], w[2]), (h[0], h[1], h[2])

    def image_infos(self, host_ptrs, lengths) -> np.ndarray:
        """image_info of many JPEGs: int64 (n, 7) rows (status, components, chroma code, width,
        height, chroma plane width, chroma plane height), status nvJPEG's (0 = read; the rest 0
        where it is not). One GIL-free call (recordtool._nvsubmit) where it is built, else
        image_info per image."""
        n = len(host_ptrs)
        if _nvsubmit is not None:
            return _nvsubmit.infos(_addr(self.L.nvjpegGetImageInfo), self.handle.value,
                                   np.asarray(host_ptrs, np.int64).reshape(n), np.asarray(lengths, np.int64).reshape(n))
        out = np.zeros((n, 7), np.int64)
        for k in range(n):
            try:
                nc, css, ws, hs = self.image_info(int(host_ptrs[k]), int(lengths[k]))
                out[k] = (0, nc, css, ws[0], hs[0], ws[1], hs[1])
            except NvjpegError as e:
                out[k, 0] = e.status
        return out

    def set_padding(self, padding: int) -> None:
        """Grow nvJPEG's buffers in steps of `padding` bytes rather than to each new image's size."""
        check("nvjpegSetDeviceMemoryPadding", self.L.nvjpegSetDeviceMemoryPadding(padding, self.handle))
        check("nvjpegSetPinnedMemoryPadding", self.L.nvjpegSetPinnedMemoryPadding(padding, self.handle))

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def hardware_flags(interpolate: bool, pipeline: bool) -> int:
    """nvjpegCreateEx's flags for a HardwareDecoder (see its `interpolate` and `pipeline`)."""
    interp = FLAGS_UPSAMPLING_WITH_INTERPOLATION if interpolate else 0
    return interp | (0 if pipeline else FLAGS_HW_DECODE_NO_PIPELINE)


class HardwareDecoder(_Handle):
    """nvjpegDecodeBatchedEx on the NVJPG engines: RGBI output with one ROI per image, or
    (planar=True) planar YUV (Y, Cb, Cr at their own sizes: `decode_planes`) of whole images
    or of one region per image.

    One instance per thread (nvJPEG states are not shared). Raises NvjpegError with
    ARCH_MISMATCH where the GPU has no hardware JPEG engine.

    Args:
        max_batch: images per call at most.
        planar: YUV output (decode_planes: whole images or regions) instead of RGBI with an
            ROI (decode).
        interpolate: NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION on the handle (RGBI output).
        pipeline: nvJPEG's own pipelining of batched calls (it buffers images across calls), its
            default; False (here the default) sets NVJPEG_FLAGS_HW_DECODE_NO_PIPELINE. Beside
            other streams' queued work — a training model's — a pipelined call waits behind that
            work, an unpipelined one does not; alone both take about the same time
            (BENCHMARKS.md, "Where the engines' rate goes beside a model").
    """

    def __init__(self, max_batch: int, planar: bool = False, interpolate: bool = False, pipeline: bool = False):
        L = lib()
        self.L = L
        self.handle = ctypes.c_void_p()
        self.fmt = OUTPUT_YUV if planar else OUTPUT_RGBI
        self.pipeline = bool(pipeline)
        flags = hardware_flags(interpolate, self.pipeline)
        check("nvjpegCreateEx(HARDWARE)", L.nvjpegCreateEx(BACKEND_HARDWARE, None, None, flags,
                                                           ctypes.byref(self.handle)))
        e, c = ctypes.c_uint(), ctypes.c_uint()
        check("nvjpegGetHardwareDecoderInfo", L.nvjpegGetHardwareDecoderInfo(self.handle, ctypes.byref(e),
                                                                            ctypes.byref(c)))
        self.engines, self.cores = e.value, c.value
        self.state = ctypes.c_void_p()
        check("nvjpegJpegStateCreate", L.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)))
        self.max_batch = max_batch
        self.last_native_seconds = None  # the last native submission's time without the GIL
        self.params = (ctypes.c_void_p * max_batch)()
        for k in range(max_batch):
            prm = ctypes.c_void_p()
            check("nvjpegDecodeParamsCreate", L.nvjpegDecodeParamsCreate(self.handle, ctypes.byref(prm)))
            check("nvjpegDecodeParamsSetOutputFormat", L.nvjpegDecodeParamsSetOutputFormat(prm, self.fmt))
            self.params[k] = prm
        self._ptrs = (ctypes.c_void_p * max_batch)()
        self._lens = (ctypes.c_size_t * max_batch)()
        self._imgs = (Image * max_batch)()
        self._batch = None
        self._fns = None  # (SetROI, DecodeBatchedEx) addresses for the GIL-free submission

    def preallocate(self, batch: int, width: int, height: int, chroma: int) -> None:
        """Size nvJPEG's internal buffers for the largest expected image up front, so a larger
        image later does not make the library allocate in steady state."""
        L = self.L
        check("nvjpegDecodeBatchedInitialize",
              L.nvjpegDecodeBatchedInitialize(self.handle, self.state, batch, 1, self.fmt))
        self._batch = batch
        check("nvjpegDecodeBatchedPreAllocate", L.nvjpegDecodeBatchedPreAllocate(
            self.handle, self.state, batch, width, height, chroma, self.fmt))

    def decode(self, host_ptrs, lengths, rois, dst_ptrs, dst_pitches, stream_ptr: int, native: bool = True) -> None:
        """Decode len(host_ptrs) JPEGs; ROI k = (x, y, w, h) lands at dst_ptrs[k] (RGBI, pitch).

        native: submit the batch in one GIL-free call (recordtool._nvsubmit) when it is built;
        False: the ctypes loop below, its reference (a ctypes call per image, each taking the GIL
        back — hundreds of hand-offs a batch with a training loop on the main thread)."""
        if self.fmt != OUTPUT_RGBI:
            raise ValueError("a planar HardwareDecoder decodes with decode_planes")
        native = native and _nvsubmit is not None
        n = self._begin(host_ptrs, lengths, fill=not native)
        if n == 0:
            return
        if native:
            self._submit(host_ptrs, lengths, rois, dst_ptrs, dst_pitches, stream_ptr)
            return
        L = self.L
        for k in range(n):
            x, y, w, h = (int(v) for v in rois[k])
            check("nvjpegDecodeParamsSetROI", L.nvjpegDecodeParamsSetROI(self.params[k], x, y, w, h))
            img = self._imgs[k]
            img.channel[0] = int(dst_ptrs[k])
            img.pitch[0] = int(dst_pitches[k])
        check("nvjpegDecodeBatchedEx", L.nvjpegDecodeBatchedEx(
            self.handle, self.state, self._ptrs, self._lens, self._imgs, self.params, stream_ptr))

    def decode_planes(self, host_ptrs, lengths, planes, pitches, stream_ptr: int, rois=None,
                      native: bool = True) -> None:
        """Decode len(host_ptrs) JPEGs as planar YUV: planes[k] = (Y, Cb, Cr) device pointers,
        pitches[k] their row bytes (each ≥ the plane's width: image_info for a whole image,
        gpu.roi.chroma_dims for a region). rois: (x, y, w, h) per image, the region to decode
        (x, y on chroma samples, gpu.roi.plan_rois); None: whole images. native: as `decode`."""
        if self.fmt != OUTPUT_YUV:
            raise ValueError("an RGBI HardwareDecoder decodes with decode")
        native = native and _nvsubmit is not None
        n = self._begin(host_ptrs, lengths, fill=not native)
        if n == 0:
            return
        rois = np.tile(np.array([0, 0, -1, -1], np.int64), (n, 1)) if rois is None else \
            np.asarray(rois, np.int64).reshape(n, 4)  # (0, 0, -1, -1): the params' ROI off
        if native:
            self._submit(host_ptrs, lengths, rois, np.asarray(planes, np.int64).reshape(n, 3),
                         np.asarray(pitches, np.int64).reshape(n, 3), stream_ptr)
            return
        L = self.L
        for k in range(n):
            x, y, w, h = (int(v) for v in rois[k])
            check("nvjpegDecodeParamsSetROI", L.nvjpegDecodeParamsSetROI(self.params[k], x, y, w, h))
            img = self._imgs[k]
            for c in range(3):
                img.channel[c] = int(planes[k][c])
                img.pitch[c] = int(pitches[k][c])
        check("nvjpegDecodeBatchedEx", L.nvjpegDecodeBatchedEx(
            self.handle, self.state, self._ptrs, self._lens, self._imgs, self.params, stream_ptr))

    def _submit(self, host_ptrs, lengths, rois, dst_ptrs, dst_pitches, stream_ptr: int) -> None:
        """The batch through recordtool._nvsubmit (after `_begin`): ROIs, destinations ((n,)
        RGBI or (n, 3) planes), pointers and lengths, and the batched decode in one GIL-free call."""
        L, n = self.L, len(host_ptrs)
        if self._fns is None:
            self._fns = (_addr(L.nvjpegDecodeParamsSetROI), _addr(L.nvjpegDecodeBatchedEx))
        status, call, at, self.last_native_seconds = _nvsubmit.submit(
            *self._fns, self.handle.value, self.state.value, ctypes.addressof(self.params),
            ctypes.addressof(self._ptrs), ctypes.addressof(self._lens), ctypes.addressof(self._imgs),
            np.asarray(host_ptrs, np.int64), np.asarray(lengths, np.int64),
            np.asarray(rois, np.int64).reshape(n, 4), np.asarray(dst_ptrs, np.int64),
            np.asarray(dst_pitches, np.int64), int(stream_ptr or 0), self.max_batch)
        if status:
            check("nvjpegDecodeParamsSetROI" if call == 1 else "nvjpegDecodeBatchedEx", status)

    def _begin(self, host_ptrs, lengths, fill: bool = True) -> int:
        """Check the batch size, (re)initialise the batched state when n changed, and (fill, the
        ctypes path) put the JPEGs' pointers and lengths into the call's arrays; returns n."""
        n = len(host_ptrs)
        if n > self.max_batch:
            raise ValueError(f"batch {n} > max_batch {self.max_batch}")
        if n and self._batch != n:
            check("nvjpegDecodeBatchedInitialize",
                  self.L.nvjpegDecodeBatchedInitialize(self.handle, self.state, n, 1, self.fmt))
            self._batch = n
        if fill:
            for k in range(n):
                self._ptrs[k] = int(host_ptrs[k])
                self._lens[k] = int(lengths[k])
        return n

    def close(self):
        if getattr(self, "handle", None):
            for k in range(self.max_batch):
                if self.params[k]:
                    self.L.nvjpegDecodeParamsDestroy(self.params[k])
            self.L.nvjpegJpegStateDestroy(self.state)
            self.L.nvjpegDestroy(self.handle)
            self.handle = None


class HybridDecoder(_Handle):
    """Decoupled nvJPEG with the HYBRID backend: Huffman decoding on the calling CPU thread, the
    rest (IDCT, upsampling, colour) on the GPU, one ROI per image, RGBI output (`decode`), or the
    whole image's planes, YUV or Y for grayscale (`decode_planes`).

    For what the engines refuse but the GPU can still help with — progressive and grayscale
    JPEGs. Two pinned buffers alternate so that the host phase of one image overlaps the copy of
    the previous one; a pinned buffer is reused only after its copy's event has completed.
    One instance per thread.
    """

    def __init__(self, stream_ptr: int, interpolate: bool = False, block: bool = True):
        """interpolate: NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION on the handle (RGBI output);
        block: blocking-sync events, so that waiting for a pinned buffer's copy sleeps instead
        of spinning a core (False: CUDA's default wait, which spins)."""
        import cupy

        L = lib()
        self.L, self.Q = L, quick()
        self.stream_ptr = stream_ptr
        self.handle = ctypes.c_void_p()
        flags = FLAGS_UPSAMPLING_WITH_INTERPOLATION if interpolate else 0
        check("nvjpegCreateEx(DEFAULT)", L.nvjpegCreateEx(BACKEND_DEFAULT, None, None, flags,
                                                          ctypes.byref(self.handle)))
        self.decoder, self.state = ctypes.c_void_p(), ctypes.c_void_p()
        check("nvjpegDecoderCreate(HYBRID)", L.nvjpegDecoderCreate(self.handle, BACKEND_HYBRID,
                                                                  ctypes.byref(self.decoder)))
        check("nvjpegDecoderStateCreate", L.nvjpegDecoderStateCreate(self.handle, self.decoder,
                                                                     ctypes.byref(self.state)))
        self.pinned = [ctypes.c_void_p(), ctypes.c_void_p()]
        self.jstreams = [ctypes.c_void_p(), ctypes.c_void_p()]
        for k in range(2):
            check("nvjpegBufferPinnedCreate", L.nvjpegBufferPinnedCreate(self.handle, None,
                                                                         ctypes.byref(self.pinned[k])))
            check("nvjpegJpegStreamCreate", L.nvjpegJpegStreamCreate(self.handle, ctypes.byref(self.jstreams[k])))
        self.device_buf = ctypes.c_void_p()
        check("nvjpegBufferDeviceCreate", L.nvjpegBufferDeviceCreate(self.handle, None, ctypes.byref(self.device_buf)))
        check("nvjpegStateAttachDeviceBuffer", L.nvjpegStateAttachDeviceBuffer(self.state, self.device_buf))
        self.params = ctypes.c_void_p()
        check("nvjpegDecodeParamsCreate", L.nvjpegDecodeParamsCreate(self.handle, ctypes.byref(self.params)))
        check("nvjpegDecodeParamsSetOutputFormat", L.nvjpegDecodeParamsSetOutputFormat(self.params, OUTPUT_RGBI))
        self._fmt, self._roi = OUTPUT_RGBI, None
        self._record = cupy.cuda.runtime.eventRecord
        self.events = [cupy.cuda.Event(block=block, disable_timing=True) for _ in range(2)]
        self.set_padding(16 << 20)
        self._used = [False, False]
        self._k = 0
        self._img = Image()
        self._fns = None  # decode_batch's function addresses (made on first use)

    def decode(self, ptr: int, length: int, roi, dst: int, pitch: int) -> None:
        """Decode one JPEG's ROI (x, y, w, h) to dst (RGBI, pitch) on this decoder's stream."""
        self._img.channel[0] = dst
        self._img.pitch[0] = pitch
        self._decode(ptr, length, tuple(roi), OUTPUT_RGBI)

    def decode_planes(self, ptr: int, length: int, planes, pitches, gray: bool, roi=None) -> None:
        """Decode one JPEG to its planes on this decoder's stream: Y only (gray, planes[0]) or
        Y, Cb, Cr (planes[0..2], pitches ≥ each plane's width: image_info, or
        gpu.roi.chroma_dims for a region). roi: (x, y, w, h) to decode (x, y on chroma samples,
        gpu.roi.plan_rois); None: the whole image."""
        for c in range(1 if gray else 3):
            self._img.channel[c] = planes[c]
            self._img.pitch[c] = pitches[c]
        roi = (0, 0, -1, -1) if roi is None else tuple(int(v) for v in roi)
        self._decode(ptr, length, roi, OUTPUT_Y if gray else OUTPUT_YUV)

    def decode_batch(self, ptrs, lengths, formats, rois, planes, pitches, native: bool = True) -> list:
        """Decode n JPEGs one after another on this decoder's stream, each as `_decode` does:
        formats (n,) OUTPUT_RGBI / OUTPUT_Y / OUTPUT_YUV; rois (n, 4) (x, y, w, h), (0, 0, -1, -1)
        for the whole image; planes, pitches (n, 3): channels 0..2 (0 where unused). native: in
        one GIL-free call (recordtool._nvsubmit.hybrid) when it is built — a Python loop gives the
        GIL up in each long call and must take it back from a busy training thread each time.
        Returns [(position, reason)] of the images that failed; the others are queued."""
        n = len(ptrs)
        ptrs, lengths, formats = (np.asarray(a, np.int64).reshape(n) for a in (ptrs, lengths, formats))
        rois = np.asarray(rois, np.int64).reshape(n, 4)
        planes, pitches = np.asarray(planes, np.int64).reshape(n, 3), np.asarray(pitches, np.int64).reshape(n, 3)
        if native and _nvsubmit is not None and hasattr(_nvsubmit, "hybrid") and n:
            context_current()  # the driver's event calls need the device's context here
            if self._fns is None:
                L, cu = self.L, _driver()
                self._fns = np.array([_addr(f) for f in (
                    L.nvjpegJpegStreamParse, L.nvjpegDecodeParamsSetOutputFormat, L.nvjpegDecodeParamsSetROI,
                    L.nvjpegStateAttachPinnedBuffer, L.nvjpegDecodeJpegHost, L.nvjpegDecodeJpegTransferToDevice,
                    L.nvjpegDecodeJpegDevice, cu.cuEventRecord, cu.cuEventSynchronize)], np.int64)
            objs = np.array([self.handle.value, self.decoder.value, self.state.value, self.params.value,
                             self.stream_ptr or 0], np.int64)
            sets = np.array([self.jstreams[0].value, self.jstreams[1].value, self.pinned[0].value,
                             self.pinned[1].value, self.events[0].ptr, self.events[1].ptr], np.int64)
            st = np.array([self._k, *self._used, self._fmt, *(self._roi or (-2, -2, -2, -2))], np.int64)
            failed = _nvsubmit.hybrid(self._fns, objs, sets, st, ptrs, lengths, formats, rois, planes, pitches)
            self._k, self._used, self._fmt = int(st[0]), [bool(st[1]), bool(st[2])], int(st[3])
            self._roi = None if st[4] == -2 else tuple(int(v) for v in st[4:8])
            return [(int(i), f"{_HYBRID_CALLS[int(c)]} returned {int(v)}") for i, c, v in failed]
        out = []
        for i in range(n):  # the reference: the same calls from Python
            try:
                for c in range(3):
                    self._img.channel[c], self._img.pitch[c] = int(planes[i, c]), int(pitches[i, c])
                self._decode(int(ptrs[i]), int(lengths[i]), tuple(int(v) for v in rois[i]), int(formats[i]))
            except Exception as e:  # the image is the CPU path's (the caller decides)
                out.append((i, str(e)))
        return out

    def _decode(self, ptr: int, length: int, roi, fmt: int) -> None:
        # Q: short calls that keep the GIL; L: Huffman decoding and the copy, which release it
        L, Q, h, k = self.L, self.Q, self.handle, self._k
        self._k ^= 1
        if self._used[k]:  # the copy out of this pinned buffer two images ago must be done
            self.events[k].synchronize()
        js = self.jstreams[k]
        check("nvjpegJpegStreamParse", Q.nvjpegJpegStreamParse(h, ptr, length, 0, 0, js))
        if fmt != self._fmt:
            check("nvjpegDecodeParamsSetOutputFormat", Q.nvjpegDecodeParamsSetOutputFormat(self.params, fmt))
            self._fmt = fmt
        if roi != self._roi:  # (0, 0, -1, -1): no ROI, the whole image
            check("nvjpegDecodeParamsSetROI", Q.nvjpegDecodeParamsSetROI(self.params, *roi))
            self._roi = roi
        check("nvjpegStateAttachPinnedBuffer", Q.nvjpegStateAttachPinnedBuffer(self.state, self.pinned[k]))
        check("nvjpegDecodeJpegHost", L.nvjpegDecodeJpegHost(h, self.decoder, self.state, self.params, js))
        check("nvjpegDecodeJpegTransferToDevice", L.nvjpegDecodeJpegTransferToDevice(
            h, self.decoder, self.state, js, self.stream_ptr))
        self._record(self.events[k].ptr, self.stream_ptr)
        self._used[k] = True
        check("nvjpegDecodeJpegDevice", Q.nvjpegDecodeJpegDevice(h, self.decoder, self.state,
                                                                 ctypes.byref(self._img), self.stream_ptr))

    def close(self):
        if getattr(self, "handle", None):
            L = self.L
            L.nvjpegDecodeParamsDestroy(self.params)
            for k in range(2):
                L.nvjpegJpegStreamDestroy(self.jstreams[k])
            L.nvjpegJpegStateDestroy(self.state)
            for k in range(2):
                L.nvjpegBufferPinnedDestroy(self.pinned[k])
            L.nvjpegBufferDeviceDestroy(self.device_buf)
            L.nvjpegDecoderDestroy(self.decoder)
            L.nvjpegDestroy(self.handle)
            self.handle = None
