"""`GPUOptions`: how a cuda Loader's GPU backend shares a batch's images between the NVJPG
engines, nvJPEG's hybrid decoder and the CPU, how it upsamples chroma and how far the training
loop may run ahead — checked once here into a frozen value that the GPU backend, its decoders
and their planner (decode.gpu) take as it is.

Pure Python, no CuPy: the Loader checks a GPUOptions before any GPU is looked for, and a CPU
Loader refuses one without importing the GPU stage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np

from ..checks import bounded_int, flag
from ..errors import ConfigError

Split = Union[Literal["auto", "gpu", "cpu"], float]
"""How images the engines could take are shared with the CPU: "auto" follows measured rates so
both sides finish together, or in a Loader the consumer's need (decode.gpu.plan.Demand: one
side first, the other while the training loop waits); "gpu" sends them all to the engines
(bit-identical runs); "cpu" decodes everything on the CPU; a float in [0, 1] fixes the CPU's
share."""

First = Literal["engines", "cpu"]
"""The side that decodes first under split="auto" (GPUOptions.first says why the engines)."""
FIRSTS = ("engines", "cpu")

Chroma = Literal["replicate", "interpolate", "nvjpeg"]
"""How the GPU decoders upsample 4:2:0 / 4:2:2 / 4:4:0 chroma: "replicate" (nvJPEG's RGBI output
as it is: each chroma sample repeated), "interpolate" (nvJPEG's planar YCbCr, then libjpeg-turbo's
fancy upsampling and colour conversion in our kernel: the CPU path's pixels), "nvjpeg" (nvJPEG's
own interpolation, NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, where the library honours it)."""
CHROMA_MODES = ("replicate", "interpolate", "nvjpeg")
# interpolate: the CPU path's pixels (a model trained on one device sees the other's) at the
# engines' speed; its fidelity bound holds on photos it was not tuned on (BENCHMARKS.md, "Pixels")
DEFAULT_CHROMA: Chroma = "interpolate"


def _split(split) -> Split:
    """A Split: "auto", "gpu", "cpu", or a CPU share in [0, 1] (a float); else ConfigError."""
    if isinstance(split, str) and split in ("auto", "gpu", "cpu"):
        return split
    try:
        f = -1.0 if isinstance(split, (str, bytes, bool, np.bool_)) else float(split)
    except (TypeError, ValueError):
        f = -1.0
    if not 0.0 <= f <= 1.0:
        raise ConfigError(f"split must be 'auto', 'gpu', 'cpu' or a CPU share in [0, 1], not {split!r}")
    return f


def _one_of(value, what: str, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{what} must be one of {', '.join(choices)}, not {value!r}")
    return value


MAX_ENGINE_LANES = 8
MAX_HYBRID_LANES = 8


@dataclass(frozen=True)
class GPUOptions:
    """How a cuda Loader shares a batch's images between the NVJPG engines, nvJPEG's hybrid
    decoder and the CPU (decode.gpu.plan). Frozen and hashable; checked once here, and the GPU
    backend, its decoders (GPUDecoder) and their planner take it as it is. Given with
    device="cpu" it is a ConfigError: it would do nothing.

    Args:
        split: "auto" — "auto": one side decodes first (`first`), the other takes images
            only while the training loop waits for its batch (plan.Demand), up to the share
            where both would finish together (an image may be decoded by either: README's
            fidelity bound); "gpu": every image the engines can take goes to them
            (bit-identical runs); "cpu": everything on the CPU; or a fixed CPU share in [0, 1].
        first: "engines" — with split="auto", the side that decodes first: "engines" or "cpu".
            The engines first at any number of cores: CPU decode first takes the cores the
            training loop runs on, and where the CPU keeps up alone it keeps several times the
            cores busy for about the same rate (BENCHMARKS.md, "Training on the GPU at a node's
            share of the host"). "cpu": for a host whose spare cores cost nothing (the CPU
            share's pixels take the model no GPU time).
        hybrid: True — progressive files (and, without same_pixels, gray ones) go to nvJPEG's
            hybrid decoder, which the engines cannot take; False: to the CPU.
        chroma: "interpolate" — how GPU-decoded 4:2:0 / 4:2:2 chroma is upsampled:
            "interpolate" (libjpeg-turbo's filter in our kernel: the CPU path's pixels, so a
            model sees the same images on either device), "replicate" (nvJPEG's output as it
            is) or "nvjpeg" (nvJPEG's own interpolation); see Chroma.
        same_pixels: False — True: 4:4:4 and gray JPEGs go to the CPU share, so their images
            equal device="cpu"'s bit for bit. False: the GPU decoders take them too (≥ 51 dB
            against the CPU path, README's fidelity bound). Not the default because on a node's
            share of cores those images (a tenth of ImageNet) are what the few CPU threads
            cannot keep up with, and the batch waits for its CPU share.
        run_ahead: 1 — training steps of GPU work the consuming thread may still have queued
            when it takes a batch: before handing out batch k the Loader sleeps (GIL released)
            until the GPU has finished what that thread queued before taking batch k - run_ahead.
            An eager loop left unbounded runs ahead until CUDA's launch queue is full and then
            blocks inside a kernel launch with the GIL held — the decoders' threads then wait
            for the GIL and their nvJPEG submissions for the same queue (BENCHMARKS.md, "Where
            the engines' rate goes beside a model": the loop free-running against waiting each
            step). 1 still keeps a whole step queued ahead of the GPU; None:
            unbounded (the loop runs as far ahead as CUDA lets it).
        engine_lanes: 1 — nvJPEG calls one producer keeps at the NVJPG engines at once for a
            batch, 1..MAX_ENGINE_LANES: the batch's engine images in parts of about equal bytes,
            each on its own hardware decoder state, stream and thread (GPUDecoder). nvJPEG's
            batched call does its host work image after image on the calling thread; calls on
            several states do it side by side and keep more images at the engines.
        engines_ahead: False — True: each producer plans and stages its next batch on a second set of
            engine states, stream and buffers, and a submitting thread of its decoder makes that
            batch's engines' call as soon as this batch's call returns, while the producer
            finishes this batch (CPU share, hybrid images, kernel): the NVJPG engines get a
            producer's calls back to back instead of idle through its host work between them,
            and the producer does not sit in nvJPEG's call. Local datasets only: a
            dataset URL's shard cache fetches along the epoch's plan, and a batch is not told
            its next one there. Off by default: it costs a second arena and set of engine
            states per producer (about 220 MiB of GPU memory a producer at batch 512, 176²,
            which puts the Loader above DALI's memory in training), and with `run_ahead` the
            training loop was seen to wait for its queued GPU work outside the Loader's bound
            (BENCHMARKS.md, "The engines' ceiling"). False: one phase, a batch's engines' call
            after the last batch is finished.
        hybrid_lanes: 1 — hybrid decoders a producer may spread a batch's hybrid images
            (progressive, and gray without same_pixels) over, 1..MAX_HYBRID_LANES, each with its
            own nvJPEG state, stream and thread. The hybrid decoder's Huffman pass is one CPU
            thread's, image after image, and the batch waits for it beside the engines' call; a
            batch uses the fewest lanes that finish within the engines' measured time
            (plan.hybrid_lanes), so a lane costs a core only where it shortens the batch. More
            than one shortens the hybrid stage by a quarter but not the batch, which then waits
            for the engines' call, and in training it did not pay (BENCHMARKS.md, "The engines'
            ceiling"): 1 by default.
    """

    split: Split = "auto"
    first: First = "engines"
    hybrid: bool = True
    chroma: Chroma = DEFAULT_CHROMA
    same_pixels: bool = False
    run_ahead: int | None = 1
    engine_lanes: int = 1
    engines_ahead: bool = False
    hybrid_lanes: int = 1

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "split", _split(self.split))
        set_(self, "first", _one_of(self.first, "first", FIRSTS))
        set_(self, "hybrid", flag(self.hybrid, "hybrid"))
        set_(self, "chroma", _one_of(self.chroma, "chroma", CHROMA_MODES))
        set_(self, "same_pixels", flag(self.same_pixels, "same_pixels"))
        set_(self, "engine_lanes", bounded_int("engine_lanes", self.engine_lanes, 1, MAX_ENGINE_LANES, floats=False))
        set_(self, "engines_ahead", flag(self.engines_ahead, "engines_ahead"))
        set_(self, "hybrid_lanes", bounded_int("hybrid_lanes", self.hybrid_lanes, 1, MAX_HYBRID_LANES, floats=False))
        if self.run_ahead is not None:
            set_(self, "run_ahead", bounded_int("run_ahead", self.run_ahead, 1, 64, floats=False))
