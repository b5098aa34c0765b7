"""Small facts about the machine that several layers need (kept apart so that counting CPUs
does not import the decoder)."""
from __future__ import annotations

import os


def cores() -> int:
    """CPU cores this process may run on (its affinity mask: a rank pinned to 16 of 32 cores
    gets 16), the default thread count everywhere."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
