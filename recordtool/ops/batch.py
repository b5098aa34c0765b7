"""Batch user ops for `Loader(user_op=...)`: plain array code on the whole batch, no C++.

A user op takes a uint8 NHWC batch (numpy on the CPU loader, CuPy on the GPU loader — the same
code runs on both through the array module) and returns it. Ops whose randomness must be
reproducible subclass `KeyedOp` (as recordtool.ops.ImageOp does; `ReferenceOp(op)` runs an
ImageOp's array code this way, without Numba): the Loader then calls `op(batch, keys)` with the batch's
`BatchKeys` (sample ids, epoch, seed), so their draws are keyed like the crop windows — a pure
function of (seed, epoch, sample id) whatever the producer threads. The op object itself holds
no per-batch state: several producers call it at the same time.
"""
from __future__ import annotations

import sys

import numpy as np

from ..decode.windows import uniforms
from ..checks import bounded_float, bounded_int

MAX_OP_SIDE = 2**31 - 1  # an op's side in pixels (e.g. Cutout's square; larger than the image: all of it)


def check_seed(seed, op: str) -> int:
    """An op's seed: an integer ≥ 0 (Python or NumPy, not a bool) — checked when the op is made,
    not by the first batch inside a producer thread. ConfigError names the op."""
    return bounded_int(f"{op}: seed", seed, 0)


def check_number(value, what: str, low: float, high: float) -> float:
    """A finite real number in [low, high] (not a bool, not a string), or ConfigError naming it."""
    return bounded_float(what, value, low, high)


def check_side(value, what: str) -> int:
    """A whole number of pixels in [1, MAX_OP_SIDE] (an integral float such as 32.0 is taken;
    1.5, inf, nan, a string are not), or ConfigError naming it."""
    return bounded_int(what, value, 1, MAX_OP_SIDE)


def _xp(batch):
    """The array module of `batch`: CuPy for a CuPy array, else NumPy. Told by the array's type,
    never by trying `import cupy`: ops run on the producer threads, and where CuPy is not
    installed each failed import takes the import system's lock for "cupy" again — a process
    forked meanwhile (a fork DataLoader worker) would find it held for good."""
    if type(batch).__module__.split(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


class KeyedOp:
    """Base of ops whose randomness is keyed like the crop windows: called `op(batch, keys)`.

    Args:
        seed: mixed into the op's draws (beside the loader's seed in `keys`).
    """

    keyed = True  # the Loader passes BatchKeys with each call

    def __init__(self, seed: int = 0):
        self.seed = check_seed(seed, type(self).__name__)

    def draws(self, n: int, counters, keys=None) -> np.ndarray:
        """U[0, 1) (n, len(counters)) keyed by (seed, keys.seed, keys.epoch, keys.ids); without
        keys (a direct call), by batch position and epoch 0."""
        if keys is None:
            return uniforms(np.arange(n), self.seed, 0, counters)
        return uniforms(keys.ids, self.seed ^ (int(keys.seed) * 0x9E3779B1), keys.epoch, counters)

    def __call__(self, batch, keys=None):
        raise NotImplementedError
