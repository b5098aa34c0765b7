"""The plan of a pack: which source items go into which part file, packed with which options.

The driver makes it (list the source, shuffle with the seed, cut into shards); each part
file is then filled from its `ShardTask` alone by `task.fill_shard`, on a thread, a worker
process or a Ray worker: one code path for "fill shard k" whatever the engine. A plan is plain
data with a stable hash per shard (items, options, seed, tool version): a shard that an earlier, unfinished
run completed under the same hash is reused instead of redone.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from ..version import __version__
from ..errors import OnError
from ..format.schema import shard_name
from .transcode import Transcode

PLAN_VERSION = 2  # bump when the bytes a shard task writes for the same plan change


@dataclass(frozen=True)
class Options:
    """What every shard task needs besides its items.

    Args:
        max_pixels: images declaring more pixels are refused.
        transcode: optional re-encoding.
        on_error: what a bad item does (RAISE stops the task with the item named; else it is
            listed in the shard's result).
    """

    max_pixels: int
    transcode: Transcode
    on_error: OnError

    def shaping(self) -> dict:
        """The options that shape the bytes written (on_error does not: a shard finished under
        "raise" is the same as under "skip")."""
        t = self.transcode
        return {"max_pixels": self.max_pixels, "max_side": t.max_side, "quality": t.quality,
                "hw_friendly": t.hw_friendly}


@dataclass(frozen=True)
class ShardTask:
    """Fill part file `name` (number `number`) with `items`, in this order."""

    number: int
    name: str
    items: list
    hash: str


@dataclass(frozen=True)
class ShardPlan:
    """Which items go into which part file: one ShardTask per part file, the seed and options
    they were cut with, and the hash a re-run compares to reuse finished shards."""

    seed: int
    options: Options
    tasks: list  # ShardTask per part file, in file order
    hash: str  # of every shard's hash: the whole plan

    def marker(self) -> dict:
        """The plan fields kept in OUT/.partial/pack.json so a re-run can tell it is the same pack."""
        return {"plan": self.hash, "plan_version": PLAN_VERSION, "shards": len(self.tasks), "seed": self.seed,
                "options": self.options.shaping()}


def shuffle(items: list, seed: int) -> list:
    """The pack-time shuffle: items in the order they are written (same seed ⇒ same order)."""
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order]


def make_plan(source, shuffled: list, shards: int, seed: int, options: Options) -> ShardPlan:
    """Cut the shuffled items into `shards` part files: candidate k goes to shard k*N//n, so a
    shard's items never depend on what is skipped elsewhere.

    Args:
        source: the `Source` the items come from (its description enters the hash).
        shuffled: every item, in pack order (`shuffle`).
        shards: number of part files.
        seed: the shuffle's seed.
        options: the shard tasks' options.
    """
    n = len(shuffled)
    bounds = [k * n // shards for k in range(shards + 1)]
    head = {"plan_version": PLAN_VERSION, "tool": __version__, "seed": seed, "shards": shards,
            "options": options.shaping(), "source": source.describe()}
    tasks, whole = [], hashlib.sha256()
    for k in range(shards):
        items = shuffled[bounds[k]:bounds[k + 1]]
        h = hashlib.sha256(json.dumps({**head, "shard": k}, sort_keys=True, default=str).encode())
        for item in items:  # items are dataclasses: repr names every field (a path, an offset)
            h.update(repr(item).encode("utf-8", "backslashreplace") + b"\n")
        tasks.append(ShardTask(k, shard_name(k), items, h.hexdigest()))
        whole.update(tasks[-1].hash.encode())
    return ShardPlan(seed, options, tasks, whole.hexdigest())
