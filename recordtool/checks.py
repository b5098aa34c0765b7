"""Range checks of numeric parameters, and `flag` (a bool argument): one rule per kind of
value, for the Python API's edges (`pack`, `Transcode`, `tune.run`, `index_parts`, the
sources, the Loader and its parts: an ConfigError, a ValueError) and for the CLI, whose
click types (recordtool.cli) apply the same bounds and turn a bad value into a usage error
(exit 2). Inner layers trust what passed here.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import ConfigError

MAX_THREADS = 4096  # threads / workers / producers / processes a parameter may ask for
# native decode threads of one pool (a Loader's `threads`: each producer's pool has that many):
# each keeps a decode buffer sized for the dataset's largest image and a stack, and decoding
# is CPU-bound, so threads past the cores only contend; the bound keeps a typo (threads=40000)
# from starting tens of thousands of threads before the system refuses one
MAX_DECODE_THREADS = 256
# a Loader's producer threads: each holds a batch being made (on the GPU its own decoders, arena
# and staging) and its prefetched ones; past a few they only contend for the same engines and
# cores, and the bound keeps a typo from reserving memory for thousands of batches
MAX_PRODUCERS = 32
MAX_BATCH = 1 << 16
MAX_EPOCHS = 1 << 20
MAX_INFLATE = 1e6  # --max-inflate (a ratio)
MAX_CACHE_LIMIT = 1 << 60
MIN_DEADLINE, MAX_DEADLINE = 0.01, 86400.0  # seconds a remote request may take (RemoteOptions.deadline)
MAX_SEED = 2**63 - 1
MAX_SHARD_SIZE = 1 << 40
MAX_SIDE = 65500  # libjpeg-turbo's largest side (format.jpeg.MAX_DIMENSION)
MAX_PIXELS = MAX_SIDE * MAX_SIDE
# --max-classes may go up to this (the default is manifest.MAX_CLASSES, 1M). The manifest
# stores a class name per label up to the largest one, so one record labelled near the limit
# costs a 50 MB manifest and ~9 s; at 2**31 it was a MemoryError after the whole scan
CLASSES_LIMIT = 1 << 22

_UNITS = {"KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40, "B": 1}


def bounded_int(name: str, value, lo: int, hi: int | None = None, floats: bool = True) -> int:
    """`value` as an int in lo..hi (hi None: no upper bound), else ConfigError naming `name`:
    the one integer check of the package. bool and non-integral numbers are refused (True is
    not a thread count, 2.5 no batch size). floats: an integral float (32.0, as a CLI's or a
    JSON file's number may come) is taken; False: integers only, Python's or NumPy's — the
    Loader's arguments and parts, as torch's DataLoader takes them."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float) if floats else numbers.Integral) \
            or (isinstance(value, float) and not value.is_integer()):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise ConfigError(f"{name} must be in {lo}..{hi}, not {v}" if hi is not None
                          else f"{name} must be at least {lo}, not {v}")
    return v


def flag(value, what: str) -> bool:
    """A bool argument (NumPy's too), or ConfigError naming it: 0, 1 and strings are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{what} must be True or False, not {value!r}")
    return bool(value)


def bounded_float(name: str, value, lo: float, hi: float) -> float:
    """`value` as a finite float in lo..hi, else ConfigError naming `name` (NaN and inf too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, not {value!r}")
    v = float(value)
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ConfigError(f"{name} must be in {lo:g}..{hi:g}, not {value!r}")
    return v


def check_deadline(value) -> float:
    """A remote request's deadline in seconds (RemoteOptions.deadline, recordtool.open's
    `deadline`): a number in MIN_DEADLINE..MAX_DEADLINE, else ConfigError naming it."""
    return bounded_float("deadline", value, MIN_DEADLINE, MAX_DEADLINE)


def parse_size(name: str, text, lo: int = 1, hi: int = MAX_SHARD_SIZE) -> int:
    """'256MB', '1GiB', '1.5GB', '1000000' (or an int) → bytes in lo..hi, else ConfigError
    naming `name` (a negative, NaN, infinite or 1e400 MB size included)."""
    if isinstance(text, numbers.Integral) and not isinstance(text, bool):
        return bounded_int(name, text, lo, hi)
    t = str(text).strip().upper().replace("IB", "B")
    mult = 1
    for suffix, m in _UNITS.items():
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)].strip(), m
            break
    try:
        v = float(t) * mult if mult != 1 or not t.isdigit() else int(t)
    except ValueError:
        raise ConfigError(f"{name}: a size such as 128MB, 1GiB or 1000000 expected, not {text!r}") from None
    if not (isinstance(v, int) or math.isfinite(v)) or not lo <= v <= hi:
        raise ConfigError(f"{name} must be in {lo}..{hi} bytes, not {text!r}")
    return int(v)


def parse_ints(name: str, text: str, lo: int, hi: int) -> list:
    """'256,320' → [256, 320], each in lo..hi, at least one; else ConfigError naming `name`."""
    try:
        vals = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{name}: comma-separated integers expected, got {text!r}") from None
    if not vals:
        raise ConfigError(f"{name}: no value given")
    return [bounded_int(name, v, lo, hi) for v in vals]
