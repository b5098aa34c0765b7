"""The Loader's argument checks, each run once at construction (the inner layers trust what
they give), and the memory bound it takes from the machine (ranks: recordtool.distributed).
"""
from __future__ import annotations

import os

# The output ring's memory at most, as a share of this machine's RAM (host ring) or of the GPU's
# memory (device ring): past it the Loader refuses to start and says what to lower.
RING_MEMORY_SHARE = 0.5


def memory_bound(gpu_id: int | None) -> int:
    """Bytes the output ring may take: RING_MEMORY_SHARE of RAM, or of the GPU's memory."""
    if gpu_id is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        import cupy

        with cupy.cuda.Device(gpu_id):
            total = cupy.cuda.runtime.memGetInfo()[1]
    return int(total * RING_MEMORY_SHARE)
