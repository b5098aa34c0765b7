"""Pack a source into a dataset directory (`recordtool pack`).

Modules, in the order the data goes through them:
    api.py        `pack()`: arguments validated once into a `PackConfig`; the one pipeline
                  (source → shuffle → by size or planned → publish); `Summary`.
    plan.py       `ShardPlan`/`ShardTask`/`Options`: which items go into which part file (frozen, hashed).
    task.py       the units of work every engine runs: `load_item`, `fill_shard`, `ShardDone`.
    transcode.py  `prepare`: a source image into bytes every decoder takes; `Transcode`, presets.
    engines.py    `Engine`s: `ThreadEngine`, `ProcessEngine`, `RayEngine` (process_worker.py: what runs
                  in ProcessEngine's workers; ray_tasks.py: RayEngine's Ray side).

The names below are imported when first used (the CLI reads the presets without loading the
writer). The package itself is callable: `recordtool.pack(src, out, ...)` is
`recordtool.pack.pack(...)`.
"""
from __future__ import annotations

import importlib
import sys
import types

_WHERE = {"pack": "api", "Summary": "api", "PackConfig": "api", "configure": "api", "DEFAULT_SHARD_SIZE": "api",
          "Engine": "engines", "ENGINES": "engines", "ThreadEngine": "engines", "ProcessEngine": "engines",
          "RayEngine": "engines", "Transcode": "transcode", "NO_TRANSCODE": "transcode",
          "SPEED_PRESETS": "transcode"}
__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


class _Callable(types.ModuleType):
    """`recordtool.pack` is this package; calling it packs (see `api.pack`)."""

    def __call__(self, *args, **kwargs):
        return self.pack(*args, **kwargs)


sys.modules[__name__].__class__ = _Callable
