"""What a batch is, as a pure function of (seed, epoch, sample ids): its JPEG bytes, crop
windows, flips and labels — shared by the CPU and GPU backends, so both make the same batch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..reader import Dataset
from .spec import EvalCrop, Output, TrainCrop
from .windows import center_windows, random_flips, random_windows


@dataclass(frozen=True)
class BatchKeys:
    """What a batch's keyed randomness depends on; passed with every call to a keyed user op,
    never stored on a shared object (producer threads run batches concurrently)."""

    ids: np.ndarray  # the batch's sample ids, in batch order
    epoch: int
    seed: int


@dataclass
class BatchInputs:
    buffers: list  # zero-copy memoryviews of the JPEG bytes
    windows: np.ndarray  # (n, 4) y, x, h, w in source pixels
    flips: np.ndarray  # bool (n,)
    labels: np.ndarray  # int64 (n,)
    keys: BatchKeys


@dataclass(frozen=True)
class Recipe:
    """Args:
        ds: the dataset.
        output: the output (size (h, w), normalisation, ...), checked; the backends write what it says.
        seed: keys the windows, flips and keyed user ops (with epoch and sample id).
        augment: TrainCrop (RandomResizedCrop windows + random flips) or EvalCrop (resize +
            centre crop), checked.
    """

    ds: Dataset
    output: Output
    seed: int
    augment: TrainCrop | EvalCrop = TrainCrop()

    @property
    def train(self) -> bool:
        return isinstance(self.augment, TrainCrop)

    def draws(self, ids: np.ndarray, epoch: int) -> tuple:
        """(windows, flips) of these ids in this epoch. Each row depends on its id alone, so the
        draws of many batches at once, split, are each batch's own (BatchStream draws a run of
        batches in one call: NumPy releases the GIL in each of its array operations, and a
        producer thread retaking it waits behind a busy training thread)."""
        ix = self.ds.index
        w, h = ix.width[ids], ix.height[ids]
        a = self.augment
        if isinstance(a, TrainCrop):
            return (random_windows(w, h, ids, self.seed, epoch, a.scale, a.ratio),
                    random_flips(ids, self.seed, epoch, a.hflip))
        size = self.output.size
        return center_windows(w, h, resize=a.resize(size), crop=size), np.zeros(len(ids), bool)

    def inputs(self, ids: np.ndarray, epoch: int, drawn: tuple | None = None) -> BatchInputs:
        """The batch's inputs; drawn: its (windows, flips) when already drawn (`draws`)."""
        win, flips = self.draws(ids, epoch) if drawn is None else drawn
        return BatchInputs(self.ds.jpeg_views(ids), win, flips, self.ds.index.label[ids].astype(np.int64),
                           BatchKeys(ids, epoch, self.seed))

