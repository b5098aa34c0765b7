"""GPU decode stage. The loader imports it through the names below only (tests/test_layout.py).

Modules, by concern:

- `plan`: which image goes to the NVJPG engines, the hybrid decoder or the CPU (pure NumPy),
- `buffers`: staging, arena, CPU-share buffers and the output ring, sized at warm-up,
- `room`: how much they hold (a batch of the dataset's records, not its largest files at once),
- `kernel`: the resize + mirror + normalize CUDA kernel and its launch,
- `decoder`: `GPUDecoder`, which runs one batch through them,
- `normalize`: `NormalizePass`, with a user op the second pass of the kernel (uint8 → output),
- `work`: `StreamWork`, a stream's copies and launches queued in one GIL-free call,
- `context`: `set_host_wait_policy`, the CUDA context's scheduling flags (process-wide),
- `nvjpeg`: nvJPEG's ctypes binding; `roi`, `roi_check`: chroma="interpolate"'s regions;
  `reference`: the NumPy references of the kernel.

The names:

- `GPUDecoder`, `BatchReport`: a producer's decoder and its last batch's split and timings;
- `OutputRing`: the batches handed out, recycled once the consumer's stream is past them;
- `kernel`, `SAMPLE_DTYPE`: the compiled resize kernel for a dtype and layout, and its sample row;
- `NormalizePass`: a producer slot's second kernel pass with a user op;
- `wait_ready`: the consumer's stream waits for a batch a producer queued without waiting;
- `consumer_stream`: the stream the calling thread works on (torch's current one, else CuPy's);
- `route`, `hardware_decodable`, `Route` (`ENGINE`, `HYBRID`, `CPU`), `Split`, `SplitPlanner`,
  `Assignment`, `Demand`: where each image is decoded and how the sides share a batch;
- `set_host_wait_policy`: how host threads wait for the device (never set by default).

Importing this package imports neither CuPy nor nvJPEG: they load when a decoder is made.
"""
from .buffers import OutputRing, consumer_stream, device_memory_used
from .context import set_host_wait_policy
from .decoder import BatchReport, GPUDecoder, cpu_share_decode, wait_ready
from .kernel import SAMPLE_DTYPE, kernel
from .normalize import NormalizePass
from .plan import CPU, ENGINE, HYBRID, Assignment, Demand, Route, SplitPlanner, ends_with_eoi, hardware_decodable, route

__all__ = ["GPUDecoder", "BatchReport", "cpu_share_decode", "OutputRing", "NormalizePass", "wait_ready",
           "consumer_stream", "device_memory_used", "kernel", "SAMPLE_DTYPE", "route", "hardware_decodable", "ends_with_eoi",
           "Route", "ENGINE", "HYBRID", "CPU", "SplitPlanner", "Assignment", "Demand", "set_host_wait_policy"]
