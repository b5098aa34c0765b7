"""The training loader, by concern:

- `loader`: `Loader` (configuration, epochs, state_dict); `config`: its frozen configuration
  parts (Output, TrainCrop, EvalCrop, GPUOptions, RemoteOptions); `args`: its argument checks,
- `epoch`: `EpochIterator` (one epoch) and `LoaderSampler` (`loader.sampler`, `set_epoch`),
- `prefetch`: `Prefetcher`, ordered producer threads with failure propagation and clean exit,
- `recipe`: what a batch is — windows, flips, labels, keys — as a pure function of (seed, epoch, ids),
- `cpu`, `gpu`: the batchers that make a batch on the CPU or the GPU.
"""
from ..errors import RecordError
from .config import EvalCrop, GPUOptions, Output, RemoteOptions, TrainCrop
from .epoch import EpochIterator, LoaderSampler
from .loader import Loader
from .prefetch import Prefetcher
from .recipe import BatchKeys, Recipe

__all__ = ["Loader", "Output", "TrainCrop", "EvalCrop", "GPUOptions", "RemoteOptions",
           "EpochIterator", "LoaderSampler", "Prefetcher", "Recipe", "BatchKeys", "RecordError"]
