"""The training loader, by concern:

- `loader`: `Loader` (configuration, epochs, state_dict) and `EpochIterator` (one epoch),
- `prefetch`: `Prefetcher`, ordered producer threads with failure propagation and clean exit,
- `recipe`: what a batch is — windows, flips, labels, keys — as a pure function of (seed, epoch, ids),
- `cpu`, `gpu`: the batchers that make a batch on the CPU or the GPU.
"""
from ..errors import RecordError
from .loader import EpochIterator, Loader
from .prefetch import Prefetcher
from .recipe import BatchKeys, Recipe

__all__ = ["Loader", "EpochIterator", "Prefetcher", "Recipe", "BatchKeys", "RecordError"]
