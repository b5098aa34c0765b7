"""`Backend`: what the Loader asks of whatever makes its batches — the CPU's (`CPUBackend`,
decode.cpu_backend) or the GPU's (`GPUBackend`, decode.gpu) — so the loader holds no
device-specific code and asks no backend whether it has a method.

Over an epoch, for the batch ids a BatchStream deals to producer `slot` (FFCV's and SPDL's
shape: the loader schedules, the backend decodes):

- producer thread: `announce(ids, epoch, slot, drawn)` — the slot's next batch, before it makes
  this one (only where `announces`); `make(ids, epoch, slot, drawn)` → `ProducedBatch`;
- consumer thread, for each batch it takes, in order: `pace(stages)` before taking it (the
  seconds it is held back, added to `stages`); `consumer_waited(wait, interval)` once it has it
  (how long the training loop waited: steering); `stats(made)` (what the Loader adds up);
  `handout(made, as_torch)` → the (images, labels) the loop gets;
- `close()` once the Loader is done with it (decoders, pools, lanes released).

Every backend has every method: where a device has nothing to do, its method does nothing by
design and says why (the CPU's pace, announce and steering). `ring` is the output ring (its
`spills`, free slots) and `recipe` what a batch is (decode.recipe).

Also here, shared by both backends: `ProducedBatch`, `BatchStats`, `CompiledOp` (what the
backends call on a compiled per-image op: the Loader hands it in, compiled for the device, so
the decode stage imports nothing of recordtool.ops), and the user op's call and checks
(`call_user_op`, `op_params`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..errors import OpError, OpResultError, RecordtoolError


@dataclass
class ProducedBatch:
    """One batch as a backend hands it to the epoch iterator."""

    images: object  # numpy / CuPy array in the Loader's layout and dtype
    labels: np.ndarray
    errors: list  # (position in the batch, reason) of images nothing could decode
    stages: dict  # producer seconds per stage
    report: object = None  # cuda: the GPU decoder's BatchReport
    ready: object = None  # cuda: an event the consumer's stream waits for (None: complete already)


@dataclass(frozen=True)
class BatchStats:
    """What the Loader adds up for a batch it took (Backend.stats): images per decoder
    (`Loader.decoded`), of the CPU's those past the GPU buffers' room (`overflow`) and those
    decoded ahead (`ahead`), and the batch's report (`Loader.last_split`; None: none)."""

    decoded: dict = field(default_factory=dict)
    overflow: int = 0
    ahead: int = 0
    report: object = None


NO_STATS = BatchStats()  # one decoder, nothing split or decoded ahead: the CPU's


class CompiledOp(Protocol):
    """A per-image user op compiled for the device that runs it (recordtool.ops.ImageOp after
    `prepare(gpu_id)`), as the backends call it."""

    name: str
    nparams: int

    def batch_params(self, n: int, keys, h: int, w: int) -> np.ndarray:
        """float64 (n, nparams): the batch's params from its keys."""

    def native(self, params: np.ndarray):
        """The op with a batch's params as the CPU decoder runs it (decode.cpu.NativeOp)."""

    def cuda_launch(self, batch, params_dev) -> tuple:
        """(kernel, grid, block, args) of its CUDA kernel over a uint8 NHWC CuPy batch."""


class Backend(ABC):
    """Makes a Loader's batches on one device (see the module's docstring for the protocol and
    which thread calls what). Subclasses set `recipe`, `ring` and `announces`."""

    recipe: object  # decode.recipe.Recipe: what a batch is, and its Output
    ring: object  # the output ring: HostRing (CPU) or OutputRing (GPU)
    announces: bool = False  # announce() does something: the stream tells each slot its next batch

    @abstractmethod
    def make(self, ids, epoch: int, slot: int, drawn: tuple | None = None) -> ProducedBatch:
        """The batch of these ids in this epoch, made by producer `slot`; drawn: its (windows,
        flips) when the stream drew them (Recipe.draws)."""

    @abstractmethod
    def announce(self, ids, epoch: int, slot: int, drawn: tuple | None = None) -> None:
        """Producer `slot`'s next batch, told before it makes its current one (BatchStream
        calls it only where `announces`)."""

    @abstractmethod
    def pace(self, stages: dict) -> None:
        """Before the consumer takes its next batch: hold it back as far as the device needs,
        adding the seconds held to `stages` (Loader.stage_seconds) under the backend's name."""

    @abstractmethod
    def consumer_waited(self, wait: float, interval: float) -> None:
        """The consumer waited `wait` s for the batch it took, `interval` s after the one before."""

    @abstractmethod
    def stats(self, made: ProducedBatch) -> BatchStats:
        """What the Loader adds up for a batch the consumer took."""

    @abstractmethod
    def handout(self, made: ProducedBatch, as_torch: bool) -> tuple:
        """(images, labels) as the consumer gets them: torch tensors (as_torch) or arrays, in
        the Output's dtype (bfloat16 as torch.bfloat16) and memory format (Output.arrange)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the backend holds (decoders, native pools, lanes); once."""


def as_bfloat16(images, output):
    """A torch batch of bfloat16 bits (uint16) as what it is, torch.bfloat16 (a view, no copy);
    any other dtype as it is."""
    if output.dtype != "bfloat16":
        return images
    import torch

    return images.view(torch.bfloat16)


def op_name(op) -> str:
    """A user op's name in messages: its qualified name, or its class's."""
    return getattr(op, "__qualname__", None) or type(op).__qualname__


def _where(keys) -> str:
    """Which batch an op failed on, for OpError: its first sample ids and epoch."""
    ids = [int(i) for i in keys.ids[:5]]
    more = f" (+{len(keys.ids) - 5} more)" if len(keys.ids) > 5 else ""
    return f" on the batch of sample ids {ids}{more}, epoch {keys.epoch}"


def op_params(op: CompiledOp, n: int, keys, h: int, w: int):
    """A compiled op's params for a batch (ImageOp.batch_params): its `params` is the op's own
    Python code, so an exception there is an OpError naming the op and the batch (the original
    as its cause), not a bare error out of a producer thread."""
    try:
        return op.batch_params(n, keys, h, w)
    except RecordtoolError:
        raise
    except Exception as e:
        raise OpError([], f"{op.name}.params", _where(keys), raised=e) from e


def call_user_op(op, batch, keys):
    """op(batch, keys) for keyed ops (ops.batch.KeyedOp or `keyed = True`), else op(batch);
    what it returned, checked against the contract (OpResultError): an array of the batch's
    own kind (NumPy, or CuPy on the GPU), uint8, of the batch's shape — usually the batch itself,
    edited in place. Anything else would be normalised into a wrong batch, or fail later with a
    message about something else. An exception the op raises is an OpError naming the op and
    the batch, with the original as its cause (recordtool's own errors pass as they are)."""
    try:
        out = op(batch, keys) if getattr(op, "keyed", False) else op(batch)
    except RecordtoolError:
        raise
    except Exception as e:
        raise OpError([], f"user_op {op_name(op)}", _where(keys), raised=e) from e
    if out is batch:
        return out
    name = op_name(op)
    if out is None:
        raise OpResultError(f"user_op {name} returned None: a user op returns the batch it was given (edited in "
                            "place) or a new uint8 array of its shape")
    if not isinstance(out, type(batch)) or out.dtype != np.uint8 or tuple(out.shape) != tuple(batch.shape):
        got = f"{type(out).__module__}.{type(out).__qualname__}"
        if hasattr(out, "shape") and hasattr(out, "dtype"):
            got += f" of {out.dtype} {tuple(out.shape)}"
        raise OpResultError(f"user_op {name} returned a {got}; a user op returns the uint8 NHWC batch it was given "
                            f"({type(batch).__module__}.{type(batch).__qualname__} of uint8 {tuple(batch.shape)}), "
                            "edited in place, or a new array of that type, dtype and shape")
    return out
