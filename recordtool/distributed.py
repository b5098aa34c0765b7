"""This process's rank and world size when the caller does not give them, by torch's
distributed convention (as torch.utils.data.DistributedSampler takes them): the initialised
process group's, else the RANK / WORLD_SIZE variables torchrun sets, else (0, 1).

Why here: the launcher's environment is read in one place, outside the loader, whose layers
take their configuration from arguments only.
"""
from __future__ import annotations

import os


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
