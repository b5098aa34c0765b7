"""Pack a source into a dataset directory (`recordtool pack`).

Modules, in the order the data goes through them:
    api.py        `pack()`: arguments validated once into a `PackConfig`; the one pipeline
                  (source → shuffle → by size or planned → publish); `Summary`.
    plan.py       `Plan`/`ShardTask`/`Options`: which items go into which part file (frozen, hashed).
    task.py       the units of work every engine runs: `load_item`, `fill_shard`, `ShardDone`.
    transcode.py  `prepare`: a source image into bytes every decoder takes; `Transcode`, presets.
    engines.py    `Engine`s: `ThreadEngine`, `ProcessEngine`, `RayEngine` (ray_tasks.py: its Ray side).

The package itself is callable: `recordtool.pack(src, out, ...)` is `recordtool.pack.pack(...)`.
"""
from __future__ import annotations

import sys
import types

from .api import DEFAULT_SHARD_SIZE, PackConfig, Summary, configure, pack  # noqa: F401
from .engines import ENGINES, Engine, ProcessEngine, RayEngine, ThreadEngine  # noqa: F401
from .transcode import NO_TRANSCODE, SPEED_PRESETS, Transcode  # noqa: F401

__all__ = ["pack", "Summary", "PackConfig", "configure", "DEFAULT_SHARD_SIZE", "Engine", "ENGINES",
           "ThreadEngine", "ProcessEngine", "RayEngine", "Transcode", "NO_TRANSCODE", "SPEED_PRESETS"]


class _Callable(types.ModuleType):
    """`recordtool.pack` is this package; calling it packs (see `api.pack`)."""

    def __call__(self, *args, **kwargs):
        return pack(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
