"""GPUDecoder: decode → crop → resize → mirror → normalize a batch onto the GPU.

NVJPG hardware batched decode with one ROI per image (the crop window), nvJPEG's hybrid
decoder (CPU Huffman, GPU IDCT) for progressive and grayscale files, the CPU native path for
what neither takes and for a share of the rest (plan.py decides), then one CUDA kernel
(kernel.py) into a batch of the output ring (buffers.py).

Not split: `__call__` is one batch's transaction across three decoders and one stream (the
engines' submission, the CPU share and the hybrid decoder overlapped, their failures moved to
the CPU path, one kernel, one wait); what stands apart already lives beside it (plan, roi,
roi_check, buffers, kernel).
"""
from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ...format.jpeg import (CHROMA_420, CHROMA_422, CHROMA_440, CHROMA_444, DEFAULT_MAX_PIXELS, BadJPEG, NotJPEG,
                            decode_refusal, probe)
from .. import cpu
from ...checks import bounded_int
from ...errors import ConfigError
from ..options import GPUOptions
from ..spec import Output
from . import kernel as K
from .buffers import DecodeBuffers, OutputRing
from .room import ALIGN, PlaneLayout, batch_room, crop_room, planar_need, planar_subsampling, staging_each
from .plan import (CPU, ENGINE, GPU_MAX_PIXELS, HYBRID, LARGE, Demand, SplitPlanner, buffer_spans, ends_with_eoi,
                   hybrid_lanes, lane_parts)
from .roi import dct_reduction, plan_rois, window_need

@dataclass
class BatchReport:
    """How the last batch was split and how fast each side went (`GPUDecoder.last`)."""

    n: int = 0
    gpu: int = 0  # images the engines decoded
    hybrid: int = 0  # images the hybrid decoder decoded
    cpu: int = 0  # images the CPU decoded (forced + moved + what a GPU decoder refused)
    cpu_forced: int = 0  # of those, images no GPU decoder takes
    cpu_fraction: float = 0.0  # the CPU share the planner's rates balance, after this batch (a Demand may move it)
    gpu_rate: float | None = None
    cpu_rate: float | None = None
    hybrid_rate: float | None = None  # one hybrid lane's (plan.Rates.hybrid)
    hybrid_lanes: int = 0  # hybrid decoders this batch's hybrid images were spread over
    overflow: int = 0  # of the CPU's, GPU-bound images past the arena's or staging's room (room.batch_room)
    large_failed: int = 0  # of the CPU's, Route.LARGE images their decoder refused (warned once per decoder)
    ahead: int = 0  # of the CPU's, images decoded before the call (the caller's `decoded`: decode.gpu.ahead)
    begun_ahead: bool = False  # its engines' call was submitted during the previous call (`ahead`)
    errors: list = field(default_factory=list)  # (batch index, reason) of images nothing decoded
    seconds: float = 0.0
    stages: dict = field(default_factory=dict)  # seconds per stage of this call

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "errors"}


class Phase:
    """What one batch holds from its engines' submission to the end of its kernel: the engines'
    states (lane 0 and lanes 1..), the stream its work is queued on, its buffers (staging,
    arena, CPU share's pixels, sample table) and the events around its engines' call.

    Why two: with engines ahead (GPUDecoder's `engines_ahead`) a producer submits its next
    batch's engines' call on the other phase while this batch's CPU share, hybrid images and
    kernel are finished, so the engines get that call back to back with this one instead of
    after the producer's host work. Invariant: a phase holds at most one batch, from `_plan`
    to the wait after its kernel (or the drain of a batch queued and never claimed); the
    producer thread that owns the decoder touches it, but for the engines' call of a queued
    batch, which the decoder's submitting thread makes."""

    __slots__ = ("hw", "lanes", "stream", "buf", "ev_start", "ev_decoded", "done")

    def __init__(self, hw, lanes: list, stream, buf, cupy, done=None):
        self.hw, self.lanes, self.stream, self.buf = hw, lanes, stream, buf
        # made once and recorded again each batch (an event made per call costs a CUDA call
        # more, and each CUDA call gives up the GIL that the producer must then take back)
        self.ev_start, self.ev_decoded = cupy.cuda.Event(), cupy.cuda.Event()
        self.done = done or _Waiter(cupy)  # waits sleep on a blocking-sync event

    def wait(self) -> None:
        """Until the work queued on this phase's stream is done."""
        self.done(self.stream)


@dataclass(eq=False)
class Begun:
    """A planned batch (GPUDecoder._plan): its phase, plan, places and staged engine bytes; then
    its engines' call (`_submit`: what the engines refused, the call's seconds), made on the
    producer's thread or — queued ahead under `key` — on the submitting thread (`future`). The
    CPU share, the hybrid images and the kernel are the batch's own call's."""

    phase: Phase
    plan: object
    places: object
    routes: np.ndarray
    pre_failed: list
    overflow: int
    staged: tuple | None  # (pointers, lengths) in the phase's staging; None: no engine images
    t_plan: float
    hw_failed: list = field(default_factory=list)
    large_failed: list = field(default_factory=list)
    t_native: float | None = None
    t_submit: float = 0.0
    key: object = None
    future: object = None


def cpu_share_decode(buffers, windows, size, out, errors: list, *, threads: int = 1, pool: int = -1) -> None:
    """The CPU share's decode of these images into `out` (the CPU path, Pillow's retry of a file
    libjpeg refuses, no op; a failed one's slot left zero and (index, reason) appended to
    `errors`): what a batch's CPU share gives a CPU-routed image and what a producer's
    look-ahead lane (ahead.py) gives it ahead — one call, so both give the same pixels.
    pool=-1: on the calling thread (threads unused)."""
    cpu.decode_crop_resize(buffers, windows, size=size, threads=threads, out=out, on_error="skip", fallback=True,
                           errors=errors, pool=pool)


class GPUDecoder:
    """Decode → crop → resize → mirror → normalize a batch onto the GPU.

    One instance per producer thread (nvJPEG states, streams and staging are per instance).

    Args:
        spec: the output (size, normalisation, dtype — "uint8" for pixels, not normalised —,
            layout, memory format), a checked Output; default 224² float32 NCHW.
        options: the checked GPUOptions (decode.options), taken as they are: `split` (how
            the engines' images are shared with the CPU), `hybrid` (progressive and gray files
            to nvJPEG's hybrid decoder, else to the CPU) and `chroma` (how GPU-decoded 4:2:x
            chroma is upsampled: "interpolate" gives the CPU path's, libjpeg-turbo's, pixels;
            "replicate" nvJPEG's RGBI as it is), `engine_lanes` (the engines' calls of a batch
            at once) and `hybrid_lanes` (the hybrid decoders a batch's hybrid images may be
            spread over). The others are the GPU backend's.
        max_batch: images per call at most (checked here: the decoder's own argument).
        cpu_threads: native threads for the CPU share (default: cores - 1).
        gpu_id: CUDA device id.
        pool: native CPU thread-pool id (distinct per decoder so producers do not queue).
        ring: the output ring to take batches from (shared by the producers of a Loader);
            None: warmup() makes one.
        demand: the Loader's consumer-steered order of the two sides (plan.Demand: one side
            first, the engines in a Loader by default, the other's share only while the
            consumer waits), shared by its
            producers' decoders; None: the auto split follows measured rates alone.
        chunk: the engines' images in nvJPEG calls of at most this many, each after the last
            one's work (0, the default: one call).
        planar_roi: with chroma="interpolate", decode each window's region of the planes
            (roi.plan_rois: the same pixels); False decodes whole images (the tests' reference).
        native_submit: the engines' batch and the hybrid decoder's images each in one GIL-free
            call (recordtool._nvsubmit); False: the ctypes loops (their reference, for the tests).
        engines_ahead: a second Phase (engines' states, stream, buffers), so that a call given
            its next batch (`__call__`'s `ahead`) submits that batch's engines' call while it
            finishes its own (the GPU backend's producers, which know their next batch). False
            (the default here: a decoder alone is not told its next batch): one phase.
    """

    # Route.LARGE images (above plan.GPU_MAX_PIXELS): the engines, on a decoder of their own in
    # calls of at most LARGE_BATCH images, whose nvJPEG buffers grow at warm-up to what a call of
    # that many at the largest such size takes (_prime_large) — the batch's decoder stays sized
    # for the rest; the arena and staging keep room for LARGE_ROOM whole ones beyond a batch's
    # (a region, what is decoded, is a part of one: more fit nearly always; past the room the
    # image joins the batch's CPU share, counted in BatchReport.overflow)
    LARGE_BATCH = 2
    LARGE_ROOM = 2
    LANE_MIN = 32
    """Engine images a lane takes at least: a batch's engine share is split over
    min(engine_lanes, n // LANE_MIN) calls (a call's fixed cost is not worth a few images)."""

    def __init__(self, spec: Output = Output(), options: GPUOptions = GPUOptions(), max_batch: int = 256,
                 cpu_threads: int | None = None, gpu_id: int = 0, pool: int | None = None,
                 ring: OutputRing | None = None, demand: Demand | None = None,
                 chunk: int = 0, planar_roi: bool = True, native_submit: bool = True,
                 engines_ahead: bool = False):
        import cupy

        if not isinstance(spec, Output):
            raise ConfigError(f"spec must be a recordtool.Output, not {type(spec).__name__}")
        if not isinstance(options, GPUOptions):
            raise ConfigError(f"options must be a recordtool.GPUOptions, not {type(options).__name__}")
        max_batch = bounded_int("max_batch", max_batch, 1, floats=False)
        self.options = options
        self.chroma = chroma = options.chroma
        # "interpolate": planes, our kernel upsamples; each image's region of its window
        # (roi.plan_rois: the same pixels as whole planes) unless planar_roi=False. "nvjpeg":
        # nvJPEG's own interpolation flag
        self.planar = chroma == "interpolate"
        self.planar_roi = self.planar and bool(planar_roi)
        nvjpeg_interp = chroma == "nvjpeg"
        self.cupy = cupy
        self.spec, self.gpu_id = spec, int(gpu_id)
        self.device = cupy.cuda.Device(self.gpu_id)
        self.max_batch = int(max_batch)
        # what the kernel writes, from the trusted spec: its size, normalisation, element type
        # (bfloat16 bits in uint16) and memory order (NHWC for channels_last)
        self.size, self.mean, self.std = spec.size, spec.mean, spec.std
        self.layout, self.dtype = spec.buffer_layout, spec.storage_dtype
        self.cpu_threads = cpu_threads or max(1, cpu.cores() - 1)
        # the engines' batch and the hybrid decoder's images each in one GIL-free call, or
        # (native_submit=False) the ctypes loops, their reference
        self.native_submit = bool(native_submit)
        self.chunk = bounded_int("chunk", chunk, 0, floats=False)
        self.engine_lanes = options.engine_lanes
        self._lanes: list = []  # (HardwareDecoder, stream, event) of lanes 1.. (lane 0: self.hw, self.stream)
        # (HybridDecoder, stream, waiter, event) of every hybrid lane; lane 0's are also
        # self.hybrid, self.hybrid_stream (what roi_check and warm-up use)
        self._hybrids: list = []
        self._hybrid_pool = None
        self._lane_pool = None
        self._own_pool = pool is None
        self.pool = cpu.new_pool_id(background=True) if pool is None else pool  # a CPU share: at low priority
        self.planner = SplitPlanner(options.split, demand=demand)
        self.last = BatchReport()
        self.ring = ring
        self.hw = self.hybrid = self.hw_large = self.large_error = None
        self._interpolate = nvjpeg_interp
        self.hw_error = self.hybrid_error = self.prealloc_error = self.last_gpu_error = None
        self.ahead_error = None  # why the second phase (engines_ahead) could not be made
        self._pending: Begun | None = None  # the next batch, queued (`ahead`)
        self._submitter = None  # the thread that makes queued batches' engines' calls (engines_ahead)
        self._large_phase = None  # the phase whose stream last queued the large images' decoder
        self._large_warned = False  # _note_large_failed: once per decoder
        # the CPU part and the hybrid decoder run beside the engines' submission, on threads kept
        # for the decoder's life (a thread per batch would churn stacks and malloc arenas)
        self._workers = ThreadPoolExecutor(2, thread_name_prefix="recordtool-gpu")
        # records whose bytes passed the refusal rule (refuse_hybrid); this decoder's own
        self._cleared: set = set()
        with self.device:
            self.stream = _stream(cupy)
            self._done = _Waiter(cupy)  # waits sleep on a blocking-sync event
            self._large_done = _Waiter(cupy)
            self._kernel = K.kernel(spec.dtype, spec.buffer_layout)
            if self.planner.split != "cpu":
                from .nvjpeg import HardwareDecoder, HybridDecoder, NvjpegError

                try:
                    self.hw = HardwareDecoder(max_batch, planar=self.planar, interpolate=nvjpeg_interp)
                    for _ in range(self.engine_lanes - 1):
                        self._lanes.append((HardwareDecoder(max_batch, planar=self.planar, interpolate=nvjpeg_interp),
                                            _stream(cupy), cupy.cuda.Event(disable_timing=True)))
                except (NvjpegError, OSError) as e:  # no engines here: everything on the CPU path
                    self.hw_error = str(e)
                    for lane in self._lanes:
                        lane[0].close()
                    self.hw, self._lanes = None, []
                if self._lanes:
                    self._lane_pool = ThreadPoolExecutor(len(self._lanes), thread_name_prefix="recordtool-lane")
                if options.hybrid:
                    try:
                        for _ in range(options.hybrid_lanes):
                            stream = _stream(cupy)
                            self._hybrids.append((HybridDecoder(stream.ptr, interpolate=nvjpeg_interp), stream,
                                                  _Waiter(cupy), cupy.cuda.Event(disable_timing=True)))
                    except (NvjpegError, OSError) as e:
                        self.hybrid_error = str(e)
                        for lane in self._hybrids:
                            lane[0].close()
                        self._hybrids = []
                    if self._hybrids:
                        self.hybrid, self.hybrid_stream = self._hybrids[0][:2]
                    if len(self._hybrids) > 1:
                        self._hybrid_pool = ThreadPoolExecutor(len(self._hybrids) - 1,
                                                               thread_name_prefix="recordtool-hybrid")
            self.buf = DecodeBuffers(cupy, self.max_batch, self.size, self.gpu_id)
            self.phases = [Phase(self.hw, self._lanes, self.stream, self.buf, cupy, self._done)]
            if engines_ahead and self.hw is not None:
                self._second_phase(cupy, nvjpeg_interp)
        self.planner.engines = self.hw is not None
        self.planner.hybrid = self.hybrid is not None
        self.planner.hybrid_lanes = max(1, len(self._hybrids))
        # which decoders decode regions' planes right here (roi_check.py); the others whole images
        self.planar_regions = {"engines": False, "hybrid": False}
        if self.planar_roi:
            from .roi_check import check_region_decode

            with self.device:
                self.planar_regions = check_region_decode(self, cupy)

    def _second_phase(self, cupy, nvjpeg_interp: bool) -> None:
        """The phase the next batch's engines' call is submitted on (engines_ahead): states as
        many as the first's, its own stream and buffers. Where nvJPEG cannot make them, one
        phase, warned: the decoder works, with the engines idle between a producer's calls."""
        from .nvjpeg import HardwareDecoder, NvjpegError

        made: list = []
        try:
            for _ in range(self.engine_lanes):
                made.append(HardwareDecoder(self.max_batch, planar=self.planar, interpolate=nvjpeg_interp))
            lanes = [(d, _stream(cupy), cupy.cuda.Event(disable_timing=True)) for d in made[1:]]
            buf = DecodeBuffers(cupy, self.max_batch, self.size, self.gpu_id)
        except (NvjpegError, OSError, cupy.cuda.memory.OutOfMemoryError) as e:
            for d in made:
                d.close()
            self.ahead_error = str(e)
            warnings.warn(f"no second set of engine states for the next batch ({e}): this decoder submits a batch's "
                          "engines' call only after the last batch is finished", RuntimeWarning, stacklevel=3)
            return
        self.phases.append(Phase(made[0], lanes, _stream(cupy), buf, cupy))
        # one thread: queued batches' engines' calls are made in order, one at a time, each as
        # soon as the last returns (nvJPEG's call gives up the GIL while the engines decode)
        self._submitter = ThreadPoolExecutor(1, thread_name_prefix="recordtool-submit")

    @property
    def engines_ahead(self) -> bool:
        """Whether a call given its next batch submits that batch's engines' call (two phases)."""
        return len(self.phases) > 1

    def sync(self) -> None:
        """Wait for the work queued on this decoder's streams (sleeping, see _Waiter)."""
        for ph in self.phases:
            ph.wait()

    @property
    def split(self):
        return self.planner.split

    @property
    def cpu_fraction(self) -> float:
        return self.planner.cpu_fraction

    @property
    def allocations(self) -> int:
        return sum(ph.buf.allocations for ph in self.phases)

    def output_shape(self, n: int | None = None):
        """The shape of the memory a batch of n is written into (spec.buffer_shape)."""
        return self.spec.buffer_shape(self.max_batch if n is None else n)

    # ------------------------------------------------------------------ warm-up
    REGION_ROOM_MIN = 8
    """Batches' worth of GPU-bound records a dataset needs for the arena to be sized by the
    regions sample windows decode (warmup's `windows`): below it, by whole images."""

    def warmup(self, jpeg_lengths, widths, heights, outputs: int = 3, routes=None, chroma=None,
               windows=None) -> None:
        """Size every buffer from the index, so steady state allocates nothing.

        Planar (chroma="interpolate"): the arena and the staging get the room a batch of this
        dataset's GPU-bound records needs (room.batch_room; a batch past it sends its last
        images to the CPU share, counted in BatchReport.overflow). Otherwise: room for the
        `max_batch` largest at once.

        Args:
            jpeg_lengths, widths, heights: the index columns of every record this decoder may see.
            outputs: output batches alive at once (the ring's slots), unless a ring was given.
            routes: route codes per record; primes the hybrid decoder and the large images'
                decoder and pre-allocates nvJPEG's engine buffers for the largest image the
                batch's engines will see; None: all to the engines.
            chroma: the index's chroma codes (format.jpeg.CHROMA_*): each image's planes at its
                own layout; None: 4:4:4 (the largest).
            windows: (ids, windows (m, 4)): sample crop windows of records (ids index the
                columns; a record may come more than once, e.g. two epochs' draws). With
                chroma, routes, planar_roi and at least REGION_ROOM_MIN batches of GPU-bound records,
                the arena holds a batch of the regions such windows decode, plus the largest
                whole image (not a batch of whole images: a random crop's region is about half
                its image); a batch past it sends its last images to the CPU share, counted.
        """
        widths, heights = np.asarray(widths), np.asarray(heights)
        routes = None if routes is None else np.asarray(routes)
        self.prealloc_error = None  # this warm-up's failed sizing steps (_prealloc_failed), not an earlier one's
        engine = np.ones(len(widths), bool) if routes is None else routes == ENGINE
        large = np.zeros(len(widths), bool) if routes is None else routes == LARGE
        if self.planar:
            lengths = np.asarray(jpeg_lengths, np.int64)
            gpu = np.ones(len(widths), bool) if routes is None else (routes != CPU) & ~large
            cw = None if chroma is None else np.asarray(chroma)[gpu]
            whole = planar_need(widths[gpu], heights[gpu], cw)
            arena = batch_room(whole, self.max_batch)
            if (windows is not None and chroma is not None and routes is not None and self.planar_roi
                    and len(whole) >= self.REGION_ROOM_MIN * self.max_batch):
                arena = min(arena, self._region_room(windows, widths, heights, np.asarray(chroma), routes, gpu,
                                                     int(whole.max())))
            staging = batch_room(staging_each(lengths[engine]), self.max_batch)
            if large.any():  # room for LARGE_ROOM of the largest beyond a batch of the others
                cl = None if chroma is None else np.asarray(chroma)[large]
                arena += self.LARGE_ROOM * int(planar_need(widths[large], heights[large], cl).max())
                staging += self.LARGE_ROOM * int(staging_each(lengths[large]).max())
        else:
            staging, arena = self.buf.plan_for(jpeg_lengths, widths, heights)
        for ph in self.phases:  # each phase holds a batch in flight: the same room
            ph.buf.reserve(max(staging, 64), max(arena, 256))
            ph.buf.allocations, ph.buf.planned = 0, True
        cpu.reserve(widths, heights, self.cpu_threads, self.pool)  # the CPU share's decode buffers
        if self.ring is None and outputs > 0:
            self.ring = OutputRing(self.output_shape(), self.dtype, outputs, self.gpu_id)
        if self.hybrid is not None and routes is not None and (routes == HYBRID).any():
            sel = routes == HYBRID
            try:
                self._prime_hybrid(int(widths[sel].max()), int(heights[sel].max()))
            except Exception as e:
                self._prealloc_failed(f"hybrid: {e}")
        if self.hw is not None and len(widths):
            if engine.any():
                try:  # the largest layout the engines will see (4:4:4 > 4:2:2, 4:4:0 > 4:2:0)
                    with self.device:
                        layout = largest_layout(None if chroma is None else np.asarray(chroma)[engine])
                        wmax, hmax = int(widths[engine].max()), int(heights[engine].max())
                        # each lane's call takes its share of a batch: the lanes together hold
                        # what one call of the whole batch would
                        share = -(-self.max_batch // self.engine_lanes)
                        for dec in [d for ph in self.phases for d in [ph.hw] + [lane[0] for lane in ph.lanes]]:
                            dec.set_padding(16 << 20)
                            dec.preallocate(share, wmax, hmax, layout)
                except Exception as e:  # a sizing hint only: decoding works without it
                    self._prealloc_failed(f"engines: {e}")
            if large.any():
                cl = None if chroma is None else np.asarray(chroma)[large]
                k = int(np.argmax(planar_need(widths[large], heights[large], cl)))
                try:
                    with self.device:  # the decoder is made on this decoder's device, then primed
                        self._large_decoder()
                        self._prime_large(int(widths[large][k]), int(heights[large][k]),
                                          CHROMA_444 if cl is None else int(cl[k]))
                except Exception as e:  # a sizing step only: decoding works without it
                    self._prealloc_failed(f"large: {e}")

    def _prealloc_failed(self, what: str) -> None:
        """A warm-up sizing step that failed (decoding works without it): kept in
        prealloc_error beside the earlier ones of this warm-up, not in place of them."""
        self.prealloc_error = what if self.prealloc_error is None else f"{self.prealloc_error}; {what}"

    def _large_decoder(self):
        """The engines' decoder for Route.LARGE images (made by a warm-up that saw such images, or
        on first use: most datasets have none); called with this decoder's device current."""
        if self.large_error is not None:  # it could not be made: its images go to the CPU path
            raise RuntimeError(self.large_error)
        if self.hw_large is None:
            from .nvjpeg import HardwareDecoder

            try:
                self.hw_large = HardwareDecoder(self.LARGE_BATCH, planar=self.planar, interpolate=self._interpolate)
            except Exception as e:
                self.large_error = f"the large images' decoder: {e}"
                raise
            self.hw_large.set_padding(16 << 20)
        return self.hw_large

    def _prime_large(self, width: int, height: int, layout: int) -> None:
        """Decode LARGE_BATCH baseline images of the Route.LARGE image whose planes are largest
        (its size and layout; 4:4:0, which Pillow does not write, as 4:2:2: the same bytes) on
        their decoder, so that nvJPEG's buffers grow to what such a call takes now, not
        mid-epoch. Not nvJPEG's pre-allocation: it sizes buffers for every engine at once,
        several times what decoding such images grows a decoder by. Planar (chroma="interpolate") only: the arena has room for
        LARGE_ROOM whole such images beside a batch (warmup); on the RGBI path
        (chroma="replicate") the decoder grows at its first such images. A failure raises
        (warmup adds it to prealloc_error)."""
        import io

        from PIL import Image

        if not self.planar:
            return
        out = io.BytesIO()
        Image.new("RGB", (width, height), (120, 130, 140)).save(
            out, "JPEG", quality=90, subsampling={CHROMA_420: 2, CHROMA_422: 1, CHROMA_440: 1}.get(layout, 0))
        data = np.frombuffer(out.getbuffer(), np.uint8)
        n = min(self.LARGE_BATCH, self.LARGE_ROOM)
        stage = self.buf.staging_np
        if len(data) > stage.size:
            raise ValueError(f"no staging room to prime: {len(data)} > {stage.size} bytes")
        stage[: len(data)] = data
        dec = self._large_decoder()
        _, _, ws, hs = dec.image_info(stage.ctypes.data, len(data))
        sizes = [(ws[c] * hs[c] + ALIGN - 1) // ALIGN * ALIGN for c in range(3)]  # aligned as PlaneLayout's
        each = sum(sizes)
        if n * each > self.buf.arena.size:
            raise ValueError(f"no arena room to prime: {n} × {each} > {self.buf.arena.size} bytes")
        base = self.buf.arena.data.ptr
        planes = [[base + k * each, base + k * each + sizes[0], base + k * each + sizes[0] + sizes[1]]
                  for k in range(n)]
        with self.device:
            dec.decode_planes([stage.ctypes.data] * n, [len(data)] * n, planes, [list(ws)] * n,
                              self.phases[0].stream.ptr, native=self.native_submit)
            self.phases[0].wait()
        del data

    def _region_room(self, windows, widths, heights, chroma, routes, gpu, largest: int) -> int:
        """The arena for a batch of the regions these sample windows decode (roi.window_need,
        each image's decoder's regions as planar_regions says; room.crop_room) plus the largest
        whole image's planes: room for a heavy batch of crops with the rarest image whole on top."""
        ids, win = windows
        ids = np.asarray(ids, np.int64)
        win = np.asarray(win, np.float64).reshape(len(ids), 4)
        keep = gpu[ids]
        ids, win = ids[keep], win[keep]
        hybrid = np.zeros(len(ids), bool) if routes is None else routes[ids] == HYBRID
        regions = np.where(hybrid, self.planar_regions["hybrid"], self.planar_regions["engines"])
        return crop_room(window_need(win, widths[ids], heights[ids], chroma[ids], self.size, regions),
                         self.max_batch, largest)

    def _prime_hybrid(self, width: int, height: int) -> None:
        """Decode one progressive 4:4:4 image of the largest hybrid-bound size, so the hybrid
        decoder's device and pinned buffers reach their final size now, not mid-epoch."""
        import io

        from PIL import Image

        out = io.BytesIO()
        Image.new("RGB", (width, height), (120, 130, 140)).save(out, "JPEG", quality=90, progressive=True,
                                                                  subsampling=0)
        view = np.frombuffer(out.getbuffer(), np.uint8)
        with self.device:
            for dec, stream, done, _ in self._hybrids:  # every lane may take the largest file
                for _ in range(2):  # once per pinned buffer (they alternate)
                    dec.decode(view.ctypes.data, len(view), (0, 0, width, height), self.buf.arena.data.ptr, width * 3)
                done(stream)
        del view

    # ------------------------------------------------------------------ one batch
    def __call__(self, buffers, windows, flips, routes, ids=None, decoded=None, key=None, ahead=None):
        """Decode one batch. Returns a CuPy array of spec.buffer_shape(N) and storage_dtype
        (spec.arrange gives the handed-out view), complete when the call returns (from the ring
        when there is one).

        Args:
            buffers: JPEG bytes-likes.
            windows: (N, 4) (y, x, h, w) crop windows in source pixels.
            flips: bool (N,) horizontal mirror per image.
            routes: route codes (N,) from the index (plan.route), or bool (N,) = engine-decodable.
            ids: the records' ids: a hybrid-bound record whose bytes passed the refusal rule is
                not parsed again in later batches (refuse_hybrid); None: every batch parses.
            decoded: {batch index: uint8 (h, w, 3), or a callable giving it or None} images of
                the CPU share decoded by the CPU path with these windows elsewhere (a producer's
                look-ahead lane, ahead.py): copied in by the CPU share (calling a callable
                there, beside the engines' work), decoded here only where it gives None. Only
                images the plan gives the CPU are taken.
            key: a hashable naming this batch (the backend's (epoch, ids)): a batch begun by the
                last call's `ahead` under the same key is finished, not begun again; one under
                another key is stale (its producer's stream was discarded) and is drained first.
            ahead: (key, inputs) of the batch this decoder is given next, with engines_ahead:
                inputs() → (buffers, windows, routes, ids) of it. It is planned and staged on
                this thread, on the other phase, and its engines' call handed to the decoder's
                submitting thread, which makes it as soon as this batch's call is made: the
                engines get this decoder's calls back to back while the batches are finished
                here. Its buffers are read (staged) before this call returns; the batch's own
                call gives them again.
        """
        t0 = time.perf_counter()
        n = len(buffers)
        if n > self.max_batch:
            raise ValueError(f"batch of {n} > max_batch {self.max_batch}")
        windows = np.asarray(windows, np.float64).reshape(n, 4)
        flips = np.asarray(flips, bool).reshape(n)
        b = self._claim(key)
        if b is None:
            b = self._plan(self.phases[0], buffers, windows, routes, ids)
        ph, plan, places = b.phase, b.plan, b.places
        ahead_n = 0
        if decoded:  # the CPU share's images decoded ahead go last: the rest are decoded first
            share = np.asarray(plan.cpu, np.int64)
            have = np.fromiter((int(i) in decoded for i in share), bool, len(share))
            ahead_n = int(have.sum())
            plan.cpu = np.concatenate([share[~have], share[have]])
        t1 = time.perf_counter()
        cpu_job = self._workers.submit(self._decode_cpu, ph.buf, buffers, windows, plan.cpu, 0, decoded, ahead_n)
        rg = self.planner.rates.gpu  # the engines' predicted time: what the hybrid lanes should finish within
        t_eng = len(plan.engine) / rg if rg and len(plan.engine) else None
        n_lanes = hybrid_lanes(len(plan.hybrid), self.planner.rates.hybrid, t_eng, len(self._hybrids))
        hyb_job = self._workers.submit(self._decode_hybrid, buffers, plan.hybrid, places, n_lanes) \
            if len(plan.hybrid) else None
        if b.future is None:  # not queued ahead: its engines' call here
            self._submit(b)
        # the next batch planned and staged here while this one's call runs (on the submitting
        # thread), its call queued behind this one's: the engines get them back to back
        t_queue = time.perf_counter()
        self._pending = self._queue(self._other(ph), *ahead) if ahead is not None else None
        t_next = time.perf_counter()
        if b.future is not None:  # the submitting thread's call of this batch (its errors raise here)
            b.future.result()
        t_call = time.perf_counter() - t_next
        hw_failed, large_failed, hyb_failed, t_hyb, t_hyb_lanes = b.hw_failed, b.large_failed, [], None, None
        with self.device, ph.stream:
            t_cpu, errors = cpu_job.result()
            if hyb_job is not None:
                hyb_failed, t_hyb, t_hyb_lanes = hyb_job.result()
                for _, stream, _, event in self._hybrids[:n_lanes]:
                    event.record(stream)
                    ph.stream.wait_event(event)
            t_wait = time.perf_counter()
            cpu_idx = plan.cpu
            refused = np.asarray(hw_failed + large_failed + hyb_failed + b.pre_failed, np.int64)
            if len(refused):  # what a GPU decoder refused: the CPU path decodes it (or names the error)
                _, errs = self._decode_cpu(ph.buf, buffers, windows, refused, len(cpu_idx))
                errors += errs
                cpu_idx = np.concatenate([cpu_idx, refused])
            if len(cpu_idx):  # the kernel reads them in the pinned buffer (DecodeBuffers.cpu_src)
                ph.buf.place_whole(cpu_idx, self.size, ph.buf.cpu_src)
            samples = ph.buf.samples[:n]
            samples["mirror"] = flips
            ph.buf.samples_dev[: samples.nbytes].set(samples.view(np.uint8), stream=ph.stream)
            out = self.ring.acquire(n, ph.stream) if self.ring is not None else \
                self.cupy.empty(self.output_shape(n), self.dtype)
            K.launch(self._kernel, ph.buf.samples_dev, n, out, self.size, self.mean, self.std, ph.stream)
            ph.wait()
            t_gpu = None
            if len(plan.engine) and not hw_failed:  # engine time: host submission or device work, the longer
                t_gpu = max(b.t_submit, self.cupy.cuda.get_elapsed_time(ph.ev_start, ph.ev_decoded) / 1e3)
        # work a caller queues after this call (a user op's pass) runs after this batch, and not
        # behind the next batch's engines' call on the other phase
        self.stream = ph.stream
        if large_failed:
            self._note_large_failed(len(large_failed))
        n_gpu = len(plan.engine) - len(hw_failed) - len(large_failed)
        n_hyb = len(plan.hybrid) - len(hyb_failed)
        if self.planner.observe(n, n_gpu, t_gpu, len(plan.cpu) - ahead_n, t_cpu, n_hyb,
                                t_hyb_lanes if not hyb_failed else None, engines_failed=bool(hw_failed)):
            warnings.warn(f"nvJPEG's hardware decoder refused {self.planner.ENGINES_OFF_AFTER} batches in a row "
                          f"({self.last_gpu_error}); this decoder sends their images to the CPU for the next "
                          f"{self.planner.paused} batches, then tries the engines again (less often while they "
                          "keep refusing)", RuntimeWarning, stacklevel=2)
        r = self.planner.rates
        t_end = time.perf_counter()
        self.last = BatchReport(n=n, gpu=n_gpu, hybrid=n_hyb, cpu=len(cpu_idx), cpu_forced=plan.forced,
                                overflow=b.overflow, large_failed=len(large_failed), ahead=ahead_n,
                                begun_ahead=b.future is not None, cpu_fraction=self.planner.cpu_fraction,
                                gpu_rate=r.gpu, cpu_rate=r.cpu, hybrid_rate=r.hybrid,
                                hybrid_lanes=n_lanes if len(plan.hybrid) else 0, errors=errors, seconds=t_end - t0,
                                stages={"plan": b.t_plan, "engines_submit": b.t_submit,
                                        "engines_native": b.t_native or 0.0, "next_plan": t_next - t_queue,
                                        "engines_call_wait": t_call, "cpu_decode": t_cpu,
                                        "hybrid_decode": t_hyb or 0.0, "wait": t_wait - t_next - t_call,
                                        "finish": t_end - t_wait})
        return out

    def _other(self, ph: Phase) -> Phase:
        return self.phases[1 - self.phases.index(ph)]

    def _claim(self, key):
        """The batch the last call queued under `key` (its engines' call made or being made on
        the submitting thread), or None: none, or one queued under another key — stale, drained
        here so both phases are free."""
        b, self._pending = self._pending, None
        if b is None:
            return None
        if key is not None and b.key == key:
            return b
        self._drain(b)
        return None

    def _drain(self, b: Begun) -> None:
        """A queued batch nobody will finish: its engines' call is let end (the submitting
        thread's, its failure dropped: no batch is made of it) and its phase's work waited for
        (the engines write into its arena until then); the phase is then free."""
        try:
            b.future.result()
        except Exception:
            pass
        with self.device:
            b.phase.wait()

    def _queue(self, ph: Phase, key, inputs):
        """Plan and stage the next batch (`ahead`) on phase `ph` here, and hand its engines' call
        to the submitting thread: the queued Begun (its `future`), or None where there is no
        second phase or its inputs or plan failed — its own call then makes it from the start,
        and raises or reports there, against that batch."""
        if not self.engines_ahead:
            return None
        try:
            buffers, windows, routes, ids = inputs()
            windows = np.asarray(windows, np.float64).reshape(len(buffers), 4)
            b = self._plan(ph, buffers, windows, routes, ids)
        except Exception:
            return None
        b.key = key
        b.future = self._submitter.submit(self._submit, b)
        return b

    def _plan(self, ph: Phase, buffers, windows, routes, ids) -> Begun:
        """Plan a batch, place it in `ph`'s buffers and stage its engines' JPEG bytes there (on
        the producer's thread: the planner and the refusal rule's memory are that thread's)."""
        t0 = time.perf_counter()
        n = len(buffers)
        routes = np.asarray(routes).reshape(n)
        routes = np.where(routes, ENGINE, CPU) if routes.dtype == bool else routes.copy()
        refuse_hybrid(routes, buffers, ids, self._cleared)  # multi-scan files: the decoders' refusal rule first
        plan = self.planner.plan(routes, ends_with_eoi(buffers))
        if not (self.planar and ph.buf.planned):  # planar: the batch fits the room (_place_planar)
            ph.buf.ensure(buffers, windows)
        pre_failed = []  # planar: headers nvJPEG refused or layouts the kernel does not take
        overflow = 0
        if self.planar:
            places, pre_failed, overflow = self._place_planar(ph.buf, buffers, windows, plan)
        else:
            places = ph.buf.place(windows, np.concatenate([plan.engine, plan.hybrid]).astype(np.int64))
        staged = self._stage(ph, buffers, plan.engine) if len(plan.engine) else None
        return Begun(ph, plan, places, routes, pre_failed, overflow, staged, time.perf_counter() - t0)

    def _submit(self, b: Begun) -> None:
        """The engines' call(s) of a planned batch on its phase's stream, between its events; a
        refusal of the batch's call gives the CPU all its engine images (b.hw_failed). On the
        producer's thread or the submitting one, never both at once (`_claim` waits)."""
        ph, plan = b.phase, b.plan
        with self.device, ph.stream:
            ph.ev_start.record(ph.stream)
            tg = time.perf_counter()
            if len(plan.engine):
                try:
                    b.t_native, b.large_failed = self._decode_engines(ph, b.staged, plan.engine, b.places,
                                                                      b.routes[plan.engine] == LARGE)
                except Exception as e:  # the engines refused the batch: the CPU takes it
                    b.hw_failed = plan.engine.tolist()
                    self.last_gpu_error = str(e)
            b.t_submit = time.perf_counter() - tg
            ph.ev_decoded.record(ph.stream)

    def _place_planar(self, buf, buffers, windows, plan):
        """Planar mode: each GPU-bound image's header (nvjpegGetImageInfo, the batch in one
        call) gives its planes' sizes; plan its region (roi.plan_rois) unless whole images are
        wanted, place the planes and fill the sample rows. Images whose header nvJPEG refuses,
        whose layout the kernel does not take (or gray on the engines), or whose header does not
        hold the window or declares more than DEFAULT_MAX_PIXELS (a file damaged after packing:
        the planes would be sized by it) leave the plan for the CPU path, which names them.
        Images past the arena's or the staging's room (DecodeBuffers.room_for of `buf`, the
        phase's: in the batch's order, each that fits beside the ones before it) join the CPU share.
        Returns (places, refused indices, images moved to the CPU share for room)."""
        idx = np.concatenate([plan.engine, plan.hybrid]).astype(np.int64)
        if not len(idx):
            return {}, [], 0
        ptrs, lengths = buffer_spans([buffers[i] for i in idx.tolist()])
        info = (self.hw or self.hybrid).image_infos(ptrs, lengths)
        status, nc, css, w0, h0, w1, h1 = info.T
        hs, vs = planar_subsampling(css).T
        gray = hs == 0
        win = windows[idx]
        ok = ((status == 0) & (hs >= 0) & (nc == np.where(gray, 1, 3)) & (w0 * h0 > 0) & (w0 * h0 <= DEFAULT_MAX_PIXELS)
              & (win[:, 1] + win[:, 3] <= w0 + 0.5) & (win[:, 0] + win[:, 2] <= h0 + 0.5)
              & (gray | ((0 < w1) & (w1 <= w0) & (0 < h1) & (h1 <= h0))))
        ne = len(plan.engine)
        ok[:ne] &= ~gray[:ne]  # gray does not go to the engines
        refused = idx[~ok].tolist()
        plan.engine, plan.hybrid = plan.engine[ok[:ne]], plan.hybrid[ok[ne:]]
        keep = ok.nonzero()[0]
        idx = idx[keep]
        if not len(idx):
            return {}, refused, 0
        dims = np.stack([w0, h0, hs, vs, w0, h0, w1, h1], 1)[keep]
        rois = regions = None
        # the CPU path decodes a window much larger than the output DCT-scaled (1/2, 1/4): the
        # kernel reproduces that reduction, so both devices give the same pixels (roi.dct_reduction)
        red = dct_reduction(windows[idx], css[keep], self.size)
        if self.planar_roi:  # regions where the image's decoder decodes them right (roi_check.py)
            rois = plan_rois(windows[idx], w0[keep], h0[keep], css[keep], self.size, red=red)
            regions = np.where(keep < ne, self.planar_regions["engines"], self.planar_regions["hybrid"])
        # the room: the engines' JPEGs are staged, every image's planes take arena
        layout = PlaneLayout(dims, rois, regions)
        fit = buf.room_for(layout.total, np.where(keep < ne, staging_each(lengths[keep]), 0))
        over = idx[~fit]
        if len(over):  # the images past the room to the CPU share; the rest laid out again (rare)
            plan.engine = plan.engine[~np.isin(plan.engine, over)]
            plan.hybrid = plan.hybrid[~np.isin(plan.hybrid, over)]
            plan.cpu = np.concatenate([np.asarray(plan.cpu, np.int64), over])
            idx, dims, red = idx[fit], dims[fit], red[fit]
            if rois is not None:
                rois, regions = rois[fit], regions[fit]
            if not len(idx):
                return {}, refused, len(over)
            layout = PlaneLayout(dims, rois, regions)
        places = buf.place_planar(windows, idx, dims, rois, regions, red=red, layout=layout)
        return places, refused, len(over)

    def _decode_cpu(self, buf, buffers, windows, idx, at: int, decoded=None, ahead: int = 0):
        """CPU-decode `idx` into buf.cpu_out[at:at+len(idx)] (the phase's): its last `ahead` images come from
        `decoded` (decoded ahead; one that gives None is decoded here), the others are decoded;
        (seconds, [(batch index, reason)])."""
        t = time.perf_counter()
        h, w = self.size
        out, errors = buf.cpu_out, []

        def decode(k0, k1):  # CPU-decode idx[k0:k1] into their rows
            errs: list = []
            cpu_share_decode([buffers[i] for i in idx[k0:k1]], windows[idx[k0:k1]], (h, w), out[at + k0:at + k1],
                             errs, threads=self.cpu_threads, pool=self.pool)
            errors.extend((int(idx[k0 + i]), r) for i, r in errs)

        m = len(idx) - ahead
        if m:
            decode(0, m)
        for k in range(m, len(idx)):
            img = decoded[int(idx[k])]
            img = img() if callable(img) else img
            if img is None:  # the lane could not: decoded here, which names the error
                decode(k, k + 1)
            else:
                out[at + k] = img
        return time.perf_counter() - t, errors

    @staticmethod
    def _stage(ph, buffers, idx) -> tuple:
        """The JPEG bytes of `idx` in phase `ph`'s pinned staging, 64-byte aligned: (pointers,
        lengths) for the engines' calls."""
        bufs = [buffers[i] for i in idx]
        stage = ph.buf.staging_np
        base = stage.ctypes.data
        if cpu.native_available():  # one GIL-free memcpy pass
            offs = cpu._native.gather(bufs, base, stage.size, 64)
        else:
            offs = np.cumsum([0] + [(len(b) + 63) // 64 * 64 for b in bufs[:-1]])
            for o, b in zip(offs, bufs):
                stage[o:o + len(b)] = np.frombuffer(b, np.uint8)
        return base + np.asarray(offs, np.int64), buffer_spans(bufs)[1]

    def _decode_engines(self, ph, staged, idx, places, large=None):
        """Decode each window of `idx` as an ROI into phase `ph`'s arena, on its states and
        stream, from its staging (`staged`: the (pointers, lengths) `_stage` gave): in one nvJPEG call, or (self.chunk) in calls of at most that many images, each
        after the previous one's work is done (the state is re-initialised for a new call
        size); the `large` ones (bool per idx: Route.LARGE) after them on their own decoder, in
        calls of at most LARGE_BATCH. Returns (the seconds the native submissions spent without
        the GIL (None: the ctypes loop), the large ones their decoder refused: for the CPU path,
        while the batch's engines' images stand)."""
        ptrs, lengths = staged
        large = np.zeros(len(idx), bool) if large is None else np.asarray(large, bool)
        small, big = np.nonzero(~large)[0], np.nonzero(large)[0]
        n = len(small)
        calls = [(ph.hw, p) for p in (np.array_split(small, -(-n // self.chunk)) if self.chunk and n > self.chunk
                                        else [small] if n else [])]
        large_failed: list = []
        if len(big):
            try:
                calls += [(self._large_decoder(), p) for p in np.array_split(big, -(-len(big) // self.LARGE_BATCH))]
            except Exception as e:
                large_failed, self.last_gpu_error = idx[big].tolist(), str(e)
        native = None  # stays None where the native submission is not built (the ctypes loop)
        lanes = min(1 + len(ph.lanes), n // self.LANE_MIN) if n and not self.chunk else 1
        if lanes > 1:  # the batch's engines' images over the lanes, at once
            native = self._decode_lanes(ph, ptrs, lengths, idx, small, places, lanes)
            calls = calls[1:]  # the large ones' calls remain, after
        last = None
        for dec, part in calls:
            if dec is last:  # the state is re-initialised for this call's size: the last call's work first
                ph.wait()
            elif dec is self.hw_large and self._large_phase not in (None, ph):
                # the large images' decoder is shared by the phases: the other's call on it first
                self._large_done.event.synchronize()
            last = dec
            try:
                if self.planar:
                    planes, pitches, _, rois = places.take(idx[part])
                    dec.decode_planes(ptrs[part], lengths[part], planes, pitches, ph.stream.ptr, rois,
                                      native=self.native_submit)
                else:
                    rois, dst, pitch = places.take(idx[part])
                    dec.decode(ptrs[part], lengths[part], rois, dst, pitch, ph.stream.ptr,
                               native=self.native_submit)
            except Exception as e:
                if dec is ph.hw:  # the batch's engines refused it: the caller gives the CPU all of them
                    raise
                large_failed += idx[part].tolist()  # these few to the CPU path; the engines go on
                self.last_gpu_error = f"large: {e}"
                continue
            t = dec.last_native_seconds
            native = None if t is None else (native or 0.0) + t
        if last is not None and last is self.hw_large:  # the other phase's next call on it waits for this
            self._large_done.event.record(ph.stream)
            self._large_phase = ph
        return (native if self.native_submit else None), large_failed

    def _engine_args(self, idx, part, places):
        """A call's destinations: (rois, planes, pitches) planar, or (rois, dst, pitch)."""
        if self.planar:
            planes, pitches, _, rois = places.take(idx[part])
            return rois, planes, pitches
        return places.take(idx[part])

    def _engine_call(self, dec, ptrs, lengths, args, stream_ptr: int) -> None:
        if self.planar:
            rois, planes, pitches = args
            dec.decode_planes(ptrs, lengths, planes, pitches, stream_ptr, rois, native=self.native_submit)
        else:
            rois, dst, pitch = args
            dec.decode(ptrs, lengths, rois, dst, pitch, stream_ptr, native=self.native_submit)

    def _decode_lanes(self, ph, ptrs, lengths, idx, small, places, lanes: int):
        """The engines' images `small` (positions in idx) in `lanes` calls at once: parts of about
        equal bytes, part 0 on this thread (phase `ph`'s first state and stream), part k on lane
        k's thread, state and stream; the phase's stream then waits for the lanes' work. Every call has returned when this
        returns (a refusal is raised after all of them, so no lane still writes into the arena).
        Returns the longest call's GIL-free seconds (None: the ctypes loop)."""
        cum = np.cumsum(lengths[small])
        cuts = np.searchsorted(cum, cum[-1] * np.arange(1, lanes) / lanes)
        parts = [p for p in np.split(small, cuts) if len(p)]  # (a part is empty only past a huge image)
        lanes = len(parts)
        args = [self._engine_args(idx, p, places) for p in parts]  # the places taken on this thread
        device = self.gpu_id

        def lane_call(k: int):
            dec, stream, event = ph.lanes[k - 1]
            with self.cupy.cuda.Device(device):
                stream.wait_event(ph.ev_start)  # after what this decoder's stream queued before the batch
                self._engine_call(dec, ptrs[parts[k]], lengths[parts[k]], args[k], stream.ptr)
                event.record(stream)
            return dec.last_native_seconds

        jobs = [self._lane_pool.submit(lane_call, k) for k in range(1, lanes)]
        error = None
        try:
            self._engine_call(ph.hw, ptrs[parts[0]], lengths[parts[0]], args[0], ph.stream.ptr)
        except Exception as e:
            error = e
        times = [ph.hw.last_native_seconds]
        for k, job in enumerate(jobs, 1):
            try:
                times.append(job.result())
                ph.stream.wait_event(ph.lanes[k - 1][2])
            except Exception as e:
                error = error or e
        if error is not None:
            raise error
        return None if any(t is None for t in times) else max(times)

    def _note_large_failed(self, n: int) -> None:
        """The large images' decoder refused `n` images of this batch: the CPU path decodes them
        (BatchReport.large_failed counts them). Warned once per decoder, not per batch: the
        batch is right, but each such image costs a core a whole-file Huffman decode, which a
        user should know of rather than find as a slower epoch."""
        if not self._large_warned:
            self._large_warned = True
            warnings.warn(f"nvJPEG's decoder of large images (above {GPU_MAX_PIXELS:,} pixels) refused {n} of them "
                          f"({self.last_gpu_error}); the CPU path decodes them, and such images in later batches "
                          "(BatchReport.large_failed counts them; this warning is not repeated)",
                          RuntimeWarning, stacklevel=3)

    def _decode_hybrid(self, buffers, idx, places, lanes: int = 1):
        """Hybrid-decode each window (Huffman on a lane's thread, the rest on its stream), the
        images spread over `lanes` hybrid decoders (plan.lane_parts: about equal bytes; part 0 on
        this thread); every lane's device work is done when this returns. Returns the indices
        they refused, for the CPU path, the seconds it took and the lanes' seconds added up."""
        from .nvjpeg import OUTPUT_RGBI, OUTPUT_Y, OUTPUT_YUV

        t = time.perf_counter()
        idx = np.asarray(idx, np.int64)
        ptrs, lengths = buffer_spans([buffers[i] for i in idx.tolist()])  # `buffers` holds them until we return
        n = len(idx)
        if self.planar:
            planes, pitches, gray, rois = places.take(idx)
            fmts = np.where(gray, OUTPUT_Y, OUTPUT_YUV).astype(np.int64)
        else:
            rois, dst, pitch = places.take(idx)
            fmts = np.full(n, OUTPUT_RGBI, np.int64)
            planes, pitches = np.zeros((n, 3), np.int64), np.zeros((n, 3), np.int64)
            planes[:, 0], pitches[:, 0] = dst, pitch
        device = self.gpu_id

        def lane(k: int, part) -> tuple:
            dec, stream, done, _ = self._hybrids[k]
            t0 = time.perf_counter()
            with self.cupy.cuda.Device(device):
                bad = dec.decode_batch(ptrs[part], lengths[part], fmts[part], rois[part], planes[part], pitches[part],
                                       native=self.native_submit)
                done(stream)
            return [int(idx[part[j]]) for j, _ in bad], time.perf_counter() - t0

        parts = lane_parts(lengths, max(1, lanes))
        jobs = [self._hybrid_pool.submit(lane, k, p) for k, p in enumerate(parts[1:], 1)]
        results, error = [], None
        try:
            results.append(lane(0, parts[0]))
        except Exception as e:
            error = e
        for job in jobs:  # every lane has returned before a failure is raised (none writes on)
            try:
                results.append(job.result())
            except Exception as e:
                error = error or e
        if error is not None:
            raise error
        return [i for bad, _ in results for i in bad], time.perf_counter() - t, sum(s for _, s in results)

    def close(self):
        """Stop the helper threads and release nvJPEG's handles (also on garbage collection);
        a batch begun for a next call that never came is waited for first."""
        self._workers.shutdown(wait=True)
        if getattr(self, "_pending", None) is not None:
            b, self._pending = self._pending, None
            self._drain(b)
        if getattr(self, "_submitter", None) is not None:
            self._submitter.shutdown(wait=True)
            self._submitter = None
        if self._lane_pool is not None:
            self._lane_pool.shutdown(wait=True)
            self._lane_pool = None
        for ph in getattr(self, "phases", [])[1:]:  # phase 0's states are self.hw and self._lanes, below
            for d in [ph.hw] + [lane[0] for lane in ph.lanes]:
                d.close()
        self.phases = self.phases[:1] if hasattr(self, "phases") else []
        for lane in self._lanes:
            lane[0].close()
        self._lanes = []
        if self._hybrid_pool is not None:
            self._hybrid_pool.shutdown(wait=True)
            self._hybrid_pool = None
        for lane in self._hybrids[1:]:  # lane 0 is self.hybrid, closed below
            lane[0].close()
        self._hybrids = self._hybrids[:1]
        if self._own_pool:
            cpu.release_pool_id(self.pool)
            self._own_pool = False
        for name in ("hw", "hw_large", "hybrid"):
            d = getattr(self, name, None)
            if d is not None:
                d.close()
                setattr(self, name, None)
        self._hybrids = []


def largest_layout(chroma) -> int:
    """The chroma layout (format.jpeg.CHROMA_*, nvJPEG's codes) of these whose planes take the
    most bytes per pixel — what the engines' buffers are pre-allocated for; None or a code
    outside the engines' layouts: 4:4:4, the largest."""
    if chroma is None:
        return CHROMA_444
    present = set(np.unique(np.asarray(chroma)).tolist())
    for layout in (CHROMA_444, CHROMA_422, CHROMA_440, CHROMA_420):
        if layout in present:
            return layout
    return CHROMA_444


def _stream(cupy):
    """A non-blocking stream at the device's highest priority: the decoders' few small kernels
    are scheduled ahead of the training step's queued ones instead of waiting behind them."""
    for priority in (-5, -1):  # CUDA's greatest priority on current GPUs; -1 where CuPy checks the range
        try:
            return cupy.cuda.Stream(non_blocking=True, priority=priority)
        except Exception:  # an older CuPy without stream priorities, or a range check
            continue
    return cupy.cuda.Stream(non_blocking=True)


class _Waiter:
    """Waits for a stream's work so far by sleeping on a blocking-sync event
    (cudaEventBlockingSync): with one CUDA context and many cores, CUDA's default wait spins a
    core at 100 % for the whole decode — a core the training loop's own thread needs."""

    def __init__(self, cupy):
        self.event = cupy.cuda.Event(block=True, disable_timing=True)

    def __call__(self, stream) -> None:
        self.event.record(stream)
        self.event.synchronize()


def refuse_hybrid(routes, buffers, ids=None, cleared: set | None = None) -> None:
    """Route to the CPU (in place) each HYBRID image the decoders' refusal rule refuses (the
    CPU path then names the record and the reason). With `ids` and `cleared` (a decoder's
    own set), a record whose bytes passed is remembered by (id, byte length) and not parsed
    again: the Python parse of a progressive file's markers is most of a batch's planning,
    done while holding the GIL. The set holds at most one entry per hybrid-bound record.
    Reference: the same loop without the set."""
    for i in np.nonzero(routes == HYBRID)[0].tolist():
        key = None if ids is None or cleared is None else (int(ids[i]), len(buffers[i]))
        if key is not None and key in cleared:
            continue
        if _refused(buffers[i]):
            routes[i] = CPU
        elif key is not None:
            cleared.add(key)


def _refused(data) -> bool:
    """True when the native decoder would refuse this JPEG before decoding (too many scans, a
    coefficient buffer out of proportion to the file: format.jpeg.decode_refusal) or it does not
    parse: nvJPEG's hybrid decoder would otherwise spend memory and time on it."""
    try:
        return decode_refusal(probe(data), len(data)) is not None
    except (NotJPEG, BadJPEG):
        return True


def wait_ready(event, device: int, torch: bool = False) -> None:
    """The consumer's current stream (torch's with `torch`, else CuPy's) waits for `event` — a
    batch queued by a producer and not waited for there."""
    import cupy

    from .buffers import consumer_stream

    if torch:
        import torch as _torch

        _torch.cuda.init()  # torch's CUDA state, so that its current stream is the one waiting
    with cupy.cuda.Device(device):
        cupy.cuda.runtime.streamWaitEvent(consumer_stream(device), event.ptr, 0)

