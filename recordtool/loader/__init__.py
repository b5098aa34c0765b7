"""The training loader, by concern — the same for every device (the backend that makes the
batches, CPU or GPU, is decode.backend's protocol, chosen by decode.device):

- `loader`: `Loader` (configuration, epochs, state_dict); `config`: its frozen configuration
  parts (Output, TrainCrop, EvalCrop, GPUOptions, RemoteOptions) and the flat shorthand's
  adapter; `args`: the user op's checks,
- `epoch`: `EpochIterator` (one epoch) and `LoaderSampler` (`loader.sampler`, `set_epoch`),
- `stream`: `BatchStream`, the batches across epoch ends,
- `prefetch`: `Prefetcher`, ordered producer threads with failure propagation and clean exit.

`Recipe` and `BatchKeys` (what a batch is, what a keyed user op gets) are decode.recipe's,
named here too.
"""
from ..decode.recipe import BatchKeys, Recipe
from ..errors import RecordError
from .config import EvalCrop, GPUOptions, Output, RemoteOptions, TrainCrop
from .epoch import EpochIterator, LoaderSampler
from .loader import Loader
from .prefetch import Prefetcher

__all__ = ["Loader", "Output", "TrainCrop", "EvalCrop", "GPUOptions", "RemoteOptions",
           "EpochIterator", "LoaderSampler", "Prefetcher", "Recipe", "BatchKeys", "RecordError"]
