"""The Loader's argument checks, each run once at construction (the inner layers trust what
they give), and the defaults it takes from the process (ranks, memory).
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError

# The output ring's memory at most, as a share of this machine's RAM (host ring) or of the GPU's
# memory (device ring): past it the Loader refuses to start and says what to lower.
RING_MEMORY_SHARE = 0.5


def dist_defaults(rank, world_size):
    """(rank, world_size): as given, else torch.distributed's when it is initialised, else the
    RANK / WORLD_SIZE variables torchrun sets, else (0, 1)."""
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank), (dist.get_world_size() if world_size is None
                                                                 else world_size)
    except ImportError:
        pass
    return (int(os.environ.get("RANK", 0)) if rank is None else rank,
            int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size)


def flag(value, what: str) -> bool:
    """A bool argument (NumPy's too), or ConfigError naming it: 0, 1 and strings are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{what} must be True or False, not {value!r}")
    return bool(value)


def memory_bound(gpu_id: int | None) -> int:
    """Bytes the output ring may take: RING_MEMORY_SHARE of RAM, or of the GPU's memory."""
    if gpu_id is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        import cupy

        with cupy.cuda.Device(gpu_id):
            total = cupy.cuda.runtime.memGetInfo()[1]
    return int(total * RING_MEMORY_SHARE)
