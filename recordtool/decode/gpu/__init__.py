"""GPU decode stage, split by concern:

- `plan`: which image goes to the NVJPG engines, the hybrid decoder or the CPU (pure NumPy),
- `buffers`: staging, arena, CPU-share buffers and the output ring, sized at warm-up,
- `kernel`: the resize + mirror + normalize CUDA kernel and its launch,
- `decoder`: `GPUDecoder`, which runs one batch through them.
"""
from .buffers import OutputRing, device_memory_used
from .decoder import BatchReport, GPUDecoder, to_torch
from .kernel import SAMPLE_DTYPE, kernel
from .plan import (CPU, ENGINE, HYBRID, Demand, Plan, Route, Split, SplitPlanner, ends_with_eoi, hardware_decodable,
                   route)

__all__ = ["GPUDecoder", "BatchReport", "OutputRing", "to_torch", "device_memory_used", "kernel", "SAMPLE_DTYPE",
           "route", "hardware_decodable", "ends_with_eoi", "Route", "ENGINE", "HYBRID", "CPU", "Split",
           "SplitPlanner", "Plan", "Demand"]
