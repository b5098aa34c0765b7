"""Where a Loader's batches are made: `Device`, parsed once from any of torch's spellings and
checked against what this machine has, so inner layers see a kind and a GPU id only; the
memory its output ring may take (`memory_bound`); and its backend (`make_backend`: the CPU's,
or the GPU's, whose package is imported only for a cuda Device). The loader asks this module,
never the GPU stage, so it holds nothing device-specific.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

from ..errors import ConfigError, DeviceUnavailable
from .backend import Backend

# The output ring's memory at most, as a share of this machine's RAM (host ring) or of the GPU's
# memory (device ring): past it the Loader refuses to start and says what to lower.
RING_MEMORY_SHARE = 0.5

GPU_EXTRAS = "pip install 'recordtool[cu13]' (CUDA 13 driver) or 'recordtool[cu12]' (CUDA 12)"


@dataclass(frozen=True)
class Device:
    """A parsed device: `type` "cpu" or "cuda"; `index` the CUDA device id (None: the caller's
    current device, resolved by `resolve`)."""

    type: str
    index: int | None = None

    @property
    def cuda(self) -> bool:
        """Batches made on a GPU (else on the CPU)."""
        return self.type == "cuda"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def parse_device(device) -> Device:
    """"cpu", "cuda", "cuda:1", a torch.device, an int (a CUDA device id, as torch takes it) or
    a cupy.cuda.Device → Device; ConfigError for anything else."""
    if isinstance(device, Device):
        return device
    if isinstance(device, bool):
        raise ConfigError(f"device must be 'cpu', 'cuda', 'cuda:N', a torch.device or a GPU id, not {device!r}")
    if isinstance(device, numbers.Integral):
        return _cuda(int(device), device)
    dtype = getattr(device, "type", None)
    if isinstance(dtype, str) and not isinstance(device, str):  # torch.device
        if dtype == "cpu":
            return Device("cpu")
        if dtype == "cuda":
            return Device("cuda") if device.index is None else _cuda(device.index, device)
    elif isinstance(getattr(device, "id", None), int) and type(device).__module__.startswith("cupy"):
        return _cuda(device.id, device)
    elif isinstance(device, str):
        kind, sep, index = device.strip().lower().partition(":")
        if kind == "cpu" and (not sep or index == "0"):
            return Device("cpu")
        if kind == "cuda":
            if not sep:
                return Device("cuda")
            if index.isdigit():
                return _cuda(int(index), device)
    raise ConfigError(f"device must be 'cpu', 'cuda', 'cuda:N', a torch.device or a GPU id, not {device!r}")


def _cuda(index: int, given) -> Device:
    if index < 0:
        raise ConfigError(f"device {given!r}: a GPU id is ≥ 0")
    return Device("cuda", int(index))


def resolve(device: Device) -> int:
    """The CUDA device id a cuda Device runs on, after checking that CuPy imports and the GPU is
    visible (DeviceUnavailable says what to install, or that no GPU is visible). `index` None:
    the caller's current device (torch.cuda.set_device / cupy Device.use)."""
    try:
        import cupy
    except ImportError as e:
        raise DeviceUnavailable(f"device={str(device)!r} needs CuPy and nvJPEG, which do not import here "
                                f"({e}): {GPU_EXTRAS}; or use device='cpu'") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, a driver too old for this CuPy, no device node
        raise DeviceUnavailable(f"device={str(device)!r}: no GPU is visible to this process "
                                f"({type(e).__name__}: {e}); use device='cpu'") from None
    if count < 1:
        raise DeviceUnavailable(f"device={str(device)!r}: no GPU is visible to this process; use device='cpu'")
    index = _current_gpu(cupy) if device.index is None else device.index
    if index >= count:
        raise DeviceUnavailable(f"device={str(device)!r}: this process sees {count} GPU(s), ids 0..{count - 1}")
    return index


def _current_gpu(cupy) -> int:
    """The caller's current CUDA device (torch.cuda.set_device / cupy Device.use)."""
    dev = cupy.cuda.runtime.getDevice()
    try:
        import torch

        if torch.cuda.is_initialized():
            dev = torch.cuda.current_device()
    except ImportError:
        pass
    return dev


def memory_bound(gpu_id: int | None) -> int:
    """Bytes the output ring may take: RING_MEMORY_SHARE of RAM, or of the GPU's memory."""
    if gpu_id is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        import cupy

        with cupy.cuda.Device(gpu_id):
            total = cupy.cuda.runtime.memGetInfo()[1]
    return int(total * RING_MEMORY_SHARE)


def make_backend(recipe, gpu_id: int | None, *, gpu, threads: int, producers: int, slots: int, max_batch: int,
                 user_op, image_op, look_ahead: bool) -> Backend:
    """The backend that makes a Loader's batches: the GPU's on GPU `gpu_id` (its GPUOptions
    `gpu`; `look_ahead`: its producers' look-ahead lanes), else the CPU's (gpu_id None). Every
    argument is checked already (the Loader's); image_op: the user op compiled for this device
    (ImageOp.prepare), or None."""
    if gpu_id is not None:
        from .gpu import GPUBackend

        return GPUBackend(recipe, gpu_id=gpu_id, producers=producers, threads=threads, user_op=user_op,
                          image_op=image_op, options=gpu, slots=slots, max_batch=max_batch, look_ahead=look_ahead)
    from .cpu_backend import CPUBackend

    return CPUBackend(recipe, threads=threads, user_op=user_op, image_op=image_op, slots=slots, max_batch=max_batch,
                      producers=producers)
