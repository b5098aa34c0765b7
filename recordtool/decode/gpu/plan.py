"""Which image of a batch goes where — NVJPG engines, nvJPEG's hybrid decoder or the CPU — and
how the CPU's share follows the measured rates. Pure NumPy: CI tests it without a GPU.

Routing uses the index columns (chroma, progressive, colorspace): no parsing in the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ...errors import ConfigError
from ...format.jpeg import CHROMA_420, CHROMA_422, CHROMA_440, CHROMA_444, CHROMA_GRAY, CS_GRAY, CS_YCBCR
from ..options import First, Split


class Route(IntEnum):
    """Where an image is decoded."""

    ENGINE = 0  # NVJPG hardware engines (baseline YCbCr 4:4:4 / 4:2:2 / 4:2:0 / 4:4:0)
    HYBRID = 1  # nvJPEG hybrid decoder: CPU Huffman, GPU IDCT (progressive, gray)
    CPU = 2  # the native CPU path (CMYK, RGB-coded, 4:1:1, unknown, damaged files)
    LARGE = 3  # the engines' layouts in (GPU_MAX_PIXELS, LARGE_MAX_PIXELS]: the engines, on a decoder of their own


ENGINE, HYBRID, CPU, LARGE = Route.ENGINE, Route.HYBRID, Route.CPU, Route.LARGE

# Grayscale does not go to the engines: their RGBI output for 1-component JPEGs with an ROI does
# not match the image (tests/gpu/test_nvjpeg.py compares it with libjpeg-turbo's).
HW_CHROMA = (CHROMA_444, CHROMA_422, CHROMA_420, CHROMA_440)

def hardware_decodable(chroma, progressive, colorspace) -> np.ndarray:
    """What goes to the NVJPG engines: baseline YCbCr 4:4:4/4:2:2/4:2:0/4:4:0."""
    chroma = np.asarray(chroma)
    return np.isin(chroma, HW_CHROMA) & (np.asarray(progressive) == 0) & (np.asarray(colorspace) == CS_YCBCR)


def route(chroma, progressive, colorspace, same_pixels: bool = False, pixels=None) -> np.ndarray:
    """Route codes (int8) per image: ENGINE for baseline YCbCr the engines take; HYBRID for
    progressive YCbCr (same chroma layouts) and grayscale; CPU for the rest.

    same_pixels: 4:4:4 and grayscale files go to the CPU too. Nothing is upsampled in them, so
    the GPU could only differ from the CPU path by its IDCT and resampling; decoded by the CPU
    path itself, they are the CPU path's pixels bit for bit (SAME_PIXELS_CHROMA).
    pixels: width × height per image (the index's); above GPU_MAX_PIXELS an ENGINE image is
    LARGE (the engines, on a decoder sized for a few such images: GPUDecoder) and a HYBRID one
    goes to the CPU (the hybrid decoder's Huffman pass is a CPU thread's too, and its buffers
    would grow to the largest image); above LARGE_MAX_PIXELS every image goes to the CPU."""
    chroma, progressive, colorspace = np.asarray(chroma), np.asarray(progressive), np.asarray(colorspace)
    hw = hardware_decodable(chroma, progressive, colorspace)
    hybrid = ((np.isin(chroma, HW_CHROMA) & (colorspace == CS_YCBCR))
              | ((chroma == CHROMA_GRAY) & (colorspace == CS_GRAY))) & ~hw
    codes = np.where(hw, ENGINE, np.where(hybrid, HYBRID, CPU)).astype(np.int8)
    if same_pixels:
        codes[np.isin(chroma, SAME_PIXELS_CHROMA)] = CPU
    if pixels is not None:
        pixels = np.asarray(pixels, np.int64)
        big = pixels > GPU_MAX_PIXELS
        codes[big & (codes == ENGINE)] = LARGE
        codes[big & (codes == HYBRID)] = CPU
        codes[pixels > LARGE_MAX_PIXELS] = CPU
    return codes


GPU_MAX_PIXELS = 4_000_000
"""The largest image (width × height) the batch's GPU decoders take. nvJPEG's engine buffers are
sized at warm-up for the largest image they will see, growing with its pixels, and a dataset's
few images above 4 MP (ImageNet's tail) would set that size for all. Larger baseline images
(Route.LARGE) go to the engines on a second decoder of a few images' size
(GPUDecoder.LARGE_BATCH): on the CPU each costs a core its whole entropy-coded data
Huffman-decoded whatever the window, on the engines only the submitting thread's call."""

LARGE_MAX_PIXELS = 16_000_000
"""The largest image the engines take at all (Route.LARGE's bound); larger ones go to the CPU
path. The large images' decoder, its arena and its staging are sized at warm-up for the largest
Route.LARGE image (LARGE_ROOM of them whole, GPUDecoder): one index row claiming a 65,500-pixel
square would make every producer hold gigabytes of GPU memory for it and decode such an image
to prime the decoder. At 16 MP (four times GPU_MAX_PIXELS) the bound stays past all but full
camera frames, rare in training sets; the CPU path decodes larger ones from their crop windows
and, in a Loader, ahead of their batch (its look-ahead lanes take the CPU-routed images)."""


# the layouts `route(same_pixels=True)` sends to the CPU: with no chroma to upsample, the GPU's
# IDCT and resampling are all that differ from the CPU path, and only its own decode removes them
SAME_PIXELS_CHROMA = (CHROMA_444, CHROMA_GRAY)


def ends_with_eoi(buffers) -> np.ndarray:
    """bool per buffer: does it end in the EOI marker FF D9? Neither GPU decoder reports a
    truncated stream, so a file that does not goes to libjpeg, which names it.
    Natively when built (one C pass: no per-buffer Python on the producer thread); this
    function's Python form is its reference (ends_with_eoi_py)."""
    from ..cpu import _native

    if _native is not None and hasattr(_native, "ends_with_eoi"):
        return _native.ends_with_eoi(buffers)
    return ends_with_eoi_py(buffers)


def ends_with_eoi_py(buffers) -> np.ndarray:
    flat = [memoryview(b).cast("B") for b in _contiguous(buffers)]  # the bytes, whatever the buffer's shape
    return np.fromiter((len(b) >= 2 and b[-2] == 0xFF and b[-1] == 0xD9 for b in flat), bool, len(flat))


def _contiguous(buffers):
    """The buffers, each checked to be one C-contiguous block of bytes (as the native passes
    check: they read ptr .. ptr + length)."""
    for i, b in enumerate(buffers):
        if not memoryview(b).c_contiguous:
            raise ValueError(f"buffer {i} is not C-contiguous (a strided view of bytes)")
    return buffers


def buffer_spans(buffers) -> tuple:
    """(addresses, lengths), int64 (n,) each, of the buffers' bytes: what nvJPEG's host-pointer
    calls take (valid while the caller keeps the buffers). Natively when built (one C pass);
    buffer_spans_py is its reference."""
    from ..cpu import _native

    if _native is not None and hasattr(_native, "buffer_spans"):
        return _native.buffer_spans(buffers)
    return buffer_spans_py(buffers)


def buffer_spans_py(buffers) -> tuple:
    views = [np.frombuffer(b, np.uint8) for b in _contiguous(buffers)]
    return (np.fromiter((v.ctypes.data for v in views), np.int64, len(views)),
            np.fromiter((v.nbytes for v in views), np.int64, len(views)))


@dataclass
class Assignment:
    """One batch's assignment: batch positions per decoder."""

    engine: np.ndarray  # the LARGE-routed ones first (GPUDecoder decodes them on a decoder of their own)
    hybrid: np.ndarray
    cpu: np.ndarray  # the `forced` ones first, then the share moved from the engines (then GPUDecoder's past its room)
    forced: int  # CPU images no GPU decoder takes here (route, missing EOI, decoder unavailable)

    @property
    def n(self) -> int:
        return len(self.engine) + len(self.hybrid) + len(self.cpu)


@dataclass
class Rates:
    """Exponentially smoothed decode rates (images/s) per side, from each batch's timings."""

    alpha: float = 0.3
    gpu: float | None = None
    cpu: float | None = None
    hybrid: float | None = None  # one hybrid decoder's (a lane's): images over its own seconds

    def update(self, side: str, images: int, seconds: float | None, least: int) -> None:
        if images >= least and seconds:
            r = images / seconds
            old = getattr(self, side)
            setattr(self, side, r if old is None else (1 - self.alpha) * old + self.alpha * r)


# Engines first: engine-bound images moved to the CPU share must
# shorten the batch's predicted decode time (the slower side's, from the measured rates) by at
# least this fraction. The balanced share assumes the CPU threads are free; at a node's share
# they are also the training loop's and the engines' submitting thread's, and the rates are
# estimates: a share that saves a few milliseconds costs more than it gives. Where a producer's
# few CPU threads decode a small fraction of the engines' rate, the balanced share is a handful
# of images that shorten the batch by a few per cent on paper, and beside the training loop the
# CPU share then runs longer than the engines.
MIN_GAIN = 0.05


def paying_share(engine: int, forced: int, extra: int, rates: Rates) -> int:
    """`extra` of a batch's `engine` engine-bound images for the CPU share beside its `forced`
    ones, or 0 where that shortens the predicted decode time by less than MIN_GAIN of it;
    `extra` while a rate is unmeasured (the CPU's is measured on its forced images first)."""
    rg, rc = rates.gpu, rates.cpu
    if not (extra and rg and rc):
        return extra
    before = max(engine / rg, forced / rc)
    after = max((engine - extra) / rg, (forced + extra) / rc)
    return extra if before - after >= MIN_GAIN * before else 0


def lane_parts(sizes, lanes: int) -> list:
    """Positions 0..n-1 of `sizes` (JPEG bytes) in at most `lanes` parts of about equal bytes:
    the largest first, each to the part with the fewest bytes so far (a decoder's time follows
    its bytes, and one large file alone can outlast a lane of small ones: cutting the batch's
    order into runs would put it beside others). Each part ascending; no part is empty. The
    largest file is in the first part, so a lane-0 decoder sized for the largest file takes it."""
    sizes = np.asarray(sizes, np.int64).reshape(-1)
    k = max(1, min(int(lanes), len(sizes)))
    load = [0] * k
    parts: list = [[] for _ in range(k)]
    for i in np.argsort(-sizes, kind="stable").tolist():
        j = min(range(k), key=load.__getitem__)
        parts[j].append(i)
        load[j] += int(sizes[i])
    return [np.array(sorted(p), np.int64) for p in parts if p]


HYBRID_SLACK = 0.75
"""The part of the engines' predicted time the hybrid lanes are given: rates are estimates and
a batch's files vary, and a lane that just fits the engines' time outlasts them every other
batch, which the whole batch then waits for."""


def hybrid_lanes(n: int, lane_rate: float | None, t_engines: float | None, most: int) -> int:
    """Hybrid decoders a batch's `n` hybrid images are spread over: the fewest that finish them
    within HYBRID_SLACK of the engines' predicted time `t_engines` at the measured `lane_rate`
    (images a second one hybrid decoder decodes, Rates.hybrid), up to `most` and n; all `most`
    while either is unmeasured. The hybrid decoder's Huffman pass is a CPU thread's: a lane more
    than the engines' time needs takes a core from the training loop and the CPU share for nothing."""
    if n <= 0:
        return 0
    k = most if not (lane_rate and t_engines) else -(-n // max(1, int(lane_rate * t_engines * HYBRID_SLACK)))
    return max(1, min(int(most), n, k))


@dataclass
class Demand:
    """How split="auto" shares the engines' images with the CPU, steered by the consumer: one
    side decodes what it can, the other takes a share only while the training loop waits for
    batches, up to the share where both sides would finish together (the measured rates), and
    gives it back while the loop does not wait. Measured rates alone cannot say whether the
    second side is needed: a loader that keeps ahead of the model should leave the model what it
    uses, not balance two sides for a speed nobody consumes.

    first="engines" (the Loader's default, GPUOptions.first): the engines first, the CPU for
    what they cannot give — the cores the CPU share would take are the training loop's; and of
    the engines' images only a share that shortens the batch by MIN_GAIN (paying_share).
    first="cpu": the CPU first, the engines for what it cannot give — where spare cores cost
    nothing: the engines' images cost the model GPU time the CPU share's pixels, read by the
    batch's one kernel in pinned memory, do not (BENCHMARKS.md), and the decode threads run at
    low priority and yield the cores.

    One per Loader, shared by its producers' planners; written only by the consumer's thread
    (`observe`), read by the producers (a float: atomic under the GIL).

    The share follows the time the consumer waits, not the number of batches it waited for:
    each batch moves `allowed` by gain × (the fraction of the interval waited − threshold), so it
    settles where the consumer waits `threshold` of its time. Waits come in bursts — a training
    loop on a node's share of the cores waits a few per cent of its time on average, all of it in
    a few batches — and a rule that counts batches (up a step for each batch waited for, down a
    smaller one for each not) would give such a loop nothing.

    Args:
        first: the side that decodes first, a checked GPUOptions.first (decode.options: the
            GPU backend hands its options' own); its default here too, so a Demand made
            outside a Loader orders the two sides as a Loader's does (a SplitPlanner given no
            Demand follows the measured rates alone).
        allowed: the other side's largest share now (0..ceiling).
        gain: the share one batch's wait moves, per unit of the interval waited beyond threshold.
        ceiling: the share it never passes.
        threshold: the fraction of the time between two batches the consumer may wait: above
            it the other side's share grows, below it the share shrinks.
    """

    first: First = "engines"
    allowed: float = 0.0
    gain: float = 1.0
    ceiling: float = 1.0
    threshold: float = 0.02

    def __post_init__(self):
        for name in ("allowed", "gain", "ceiling", "threshold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                raise ConfigError(f"Demand.{name} must be a number in [0, 1], not {v!r}")

    def observe(self, wait: float, interval: float) -> None:
        """The consumer waited `wait` s for its batch, `interval` s after the previous one."""
        waited = min(1.0, max(0.0, wait) / interval) if interval > 0 else 0.0
        self.allowed = min(self.ceiling, max(0.0, self.allowed + self.gain * (waited - self.threshold)))

    def cpu_share(self, balanced: float) -> float:
        """The CPU's share of a batch, given the share that balances the measured rates."""
        if self.first == "cpu":
            return max(balanced, 1.0 - self.allowed)
        return min(balanced, self.allowed)


@dataclass
class SplitPlanner:
    """Plans each batch and adapts the CPU share from the measured rates (`observe`).

    Args:
        split: a checked GPUOptions.split (decode.options.Split), taken as it is.
        engines: the NVJPG engines are usable here.
        hybrid: the hybrid decoder is usable (else progressive / gray go to the CPU).
        hybrid_lanes: hybrid decoders the batch's hybrid images may be spread over
            (GPUOptions.hybrid_lanes; the decoder sets it to those it made).
        demand: with split="auto", which side decodes first and how much the consumer needs of
            the other (`Demand`); None: the share follows the measured rates alone.
    """

    split: Split = "auto"
    engines: bool = True
    hybrid: bool = True
    hybrid_lanes: int = 1
    rates: Rates = field(default_factory=Rates)
    cpu_fraction: float = 0.0
    demand: Demand | None = None
    refused: int = 0  # batches in a row the engines refused (observe's engines_failed)
    paused: int = 0  # batches left before the engines get images again (0: not paused)
    pause: int = 0  # the length of the last pause (0: none since they last decoded a batch)

    # the engines refused this many batches in a row: they get no images for ENGINES_RETRY_AFTER
    # batches (each refused batch is decoded twice, and a share measured on nothing may grow to
    # the whole batch), then one batch again; each retry refused doubles the pause, up to
    # ENGINES_RETRY_MAX batches (a transient failure or a run of damaged files ends)
    ENGINES_OFF_AFTER = 3
    ENGINES_RETRY_AFTER = 64
    ENGINES_RETRY_MAX = 4096

    def __post_init__(self):
        self.cpu_fraction = 0.0 if self.split in ("gpu", "auto") else (1.0 if self.split == "cpu" else float(self.split))
        if self.split == "cpu":
            self.engines = self.hybrid = False

    def plan(self, routes, eoi) -> Assignment:
        """routes: Route codes (n,); eoi: ends_with_eoi (n,)."""
        routes = np.asarray(routes)
        n = len(routes)
        routes = np.where(np.asarray(eoi, bool), routes, CPU)
        engines = self.engines and not self.paused
        eligible = np.nonzero(routes == ENGINE)[0] if engines else np.zeros(0, np.int64)
        large = np.nonzero(routes == LARGE)[0] if engines else np.zeros(0, np.int64)  # never the CPU share's
        hyb = np.nonzero(routes == HYBRID)[0] if self.hybrid else np.zeros(0, np.int64)
        share = self.cpu_fraction
        if self.split == "auto" and self.demand is not None:
            # the CPU first, the engines not measured yet: their share follows the demand alone
            # (the placeholder balance would keep them under the images a rate needs)
            unmeasured = self.demand.first == "cpu" and not self.rates.gpu
            share = self.demand.cpu_share(0.0 if unmeasured else share)
        rh, rg = self.rates.hybrid, self.rates.gpu
        if self.split == "auto" and rh and rg and len(hyb) > 2:
            # the hybrid decoder's Huffman pass is a thread per lane: give the lanes what they
            # finish while the engines do their share; the rest goes to the CPU threads
            t_engines = len(eligible) * (1 - share) / rg
            hyb = hyb[: max(2, int(rh * self.hybrid_lanes * t_engines))]
        on_gpu = np.zeros(n, bool)
        on_gpu[eligible] = True
        on_gpu[large] = True
        on_gpu[hyb] = True
        forced = np.nonzero(~on_gpu)[0]
        extra = max(0, min(len(eligible), int(round(share * n)) - len(forced)))
        if self.split == "auto" and self.demand is not None and self.demand.first == "engines":
            extra = paying_share(len(eligible), len(forced), extra, self.rates)  # only a share that pays
        moved, kept = eligible[len(eligible) - extra:], eligible[: len(eligible) - extra]
        # the large ones first: the batch's room (GPUDecoder._place_planar) is given in order
        return Assignment(engine=np.concatenate([large, kept]).astype(np.int64), hybrid=hyb,
                          cpu=np.concatenate([forced, moved]).astype(np.int64), forced=len(forced))

    def observe(self, n: int, n_gpu: int, t_gpu, n_cpu: int, t_cpu, n_hyb: int = 0, t_hyb=None,
                engines_failed: bool = False) -> bool:
        """Fold one batch's timings in, then move the CPU share so that both sides would take
        the same time on the next batch (only with split="auto" and working engines).
        t_hyb: the hybrid lanes' seconds added up (each lane's own), so Rates.hybrid is one
        lane's rate whatever the lanes a batch used. engines_failed: the engines refused this batch (the CPU decoded their images). Returns
        True when that paused the engines for the first time since they last decoded a batch
        (ENGINES_OFF_AFTER refusals in a row; see ENGINES_RETRY_AFTER)."""
        stopped = False
        if engines_failed:
            self.refused += 1
            if self.engines and not self.paused and self.refused >= self.ENGINES_OFF_AFTER:
                stopped = self.pause == 0
                self.pause = min(2 * self.pause, self.ENGINES_RETRY_MAX) if self.pause else self.ENGINES_RETRY_AFTER
                self.paused = self.pause
                self.refused = self.ENGINES_OFF_AFTER - 1  # a refused retry pauses them again
        elif self.paused:
            self.paused -= 1
        elif n_gpu:
            self.refused = self.pause = 0
        self.rates.update("gpu", n_gpu, t_gpu, 8)
        self.rates.update("cpu", n_cpu, t_cpu, 8)
        self.rates.update("hybrid", n_hyb, t_hyb, 2)
        if self.split != "auto" or not self.engines:
            return stopped
        rg, rc = self.rates.gpu, self.rates.cpu
        if rg and rc:
            self.cpu_fraction = float(np.clip(rc / (rc + rg), 0.0, 0.9))
        elif rg and not rc:
            self.cpu_fraction = max(0.05, 8.5 / max(n, 1))  # measure the CPU once (≥ 8 images)
        elif rc and not rg:
            self.cpu_fraction = 0.5
        return stopped
