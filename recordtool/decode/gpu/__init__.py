"""GPU decode stage: the GPU backend and the decoder beneath it. Only decode.device imports
this package (for `GPUBackend`); the loader imports nothing of it (tests/test_layout.py).

Modules, along a batch's way:

- `plan`: which image goes to the NVJPG engines, the hybrid decoder or the CPU (pure NumPy),
- `backend`: `GPUBackend`, the Loader's backend: a decoder per producer, the output ring,
  the user op's pass, the consumer's pace and hand-off,
- `ahead`: `AheadLane`, a producer's next batch's CPU-routed images decoded ahead,
- `decoder`: `GPUDecoder`, which runs one batch through the decoders, buffers and kernel,
- `buffers`: staging, arena, CPU-share buffers and the output ring, sized at warm-up,
- `room`: how much they hold (a batch of the dataset's records, not its largest files at once),
- `kernel`: the resize + mirror + normalize CUDA kernel and its launch,
- `normalize`: `NormalizePass`, with a user op the second pass of the kernel (uint8 → output),
- `work`: `StreamWork`, a stream's copies and launches queued in one GIL-free call,
- `handout`: `to_torch` (DLPack) and `RunAhead`, what the consumer gets and when,
- `context`: `set_host_wait_policy`, the CUDA context's scheduling flags (process-wide),
- `nvjpeg`: nvJPEG's ctypes binding; `roi`, `roi_check`: chroma="interpolate"'s regions;
  `reference`: the NumPy references of the kernel.

The names: `GPUBackend` (the Loader's, through decode.device), and for a decoder used on its
own (README: "Read and decode") `GPUDecoder`, `route` (each image's decoder, from the index)
and `to_torch`; `set_host_wait_policy` (how host threads wait for the device; never set by
default). Everything else is imported from its module.

Importing this package imports neither CuPy nor nvJPEG: they load when a decoder is made.
"""
from .backend import GPUBackend
from .context import set_host_wait_policy
from .decoder import GPUDecoder
from .handout import to_torch
from .plan import route

__all__ = ["GPUBackend", "GPUDecoder", "route", "to_torch", "set_host_wait_policy"]
