"""This process's place in a distributed run (rank, world size), by torch's convention (as
torch.utils.data.DistributedSampler takes them): the initialised process group's, else the
RANK / WORLD_SIZE variables torchrun sets, else a single process (0, 1).

Why here: the launcher's environment is read in one place, outside the loader, whose layers
take their configuration from arguments only.

Why a caller asks late (the Loader: when it first needs its share, not when it is made): a
launcher may start the processes before it tells them their rank. Lightning's DDP re-runs the
script with WORLD_SIZE and LOCAL_RANK set but no RANK, and only `fit()` initialises the process
group with each process's rank; a Loader made at the top of that script learns its rank there.

Invariant: nothing is guessed. An environment that names a world size without a rank (or the
reverse), a rank outside the world, or a rank argument that contradicts the process group is a
ConfigError naming both sides, never a fall-back to rank 0.
"""
from __future__ import annotations

import os
import sys

from .errors import ConfigError


def group():
    """(rank, world_size) of torch.distributed's initialised process group, else None. torch is
    not imported for this: where torch.distributed was never imported there is no group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_rank(), dist.get_world_size()


def _variable(name: str, low: int):
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ConfigError(f"the environment's {name}={text!r} is not an integer ≥ {low} (a launcher sets it: "
                          "torchrun, Lightning, SLURM)")
    return value


def environment():
    """(rank, world_size) from RANK and WORLD_SIZE; None when neither is set. ConfigError for one
    without the other, a value that is not an integer, or RANK outside [0, WORLD_SIZE)."""
    rank, world = _variable("RANK", 0), _variable("WORLD_SIZE", 1)
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        have, lack = ("WORLD_SIZE", "RANK") if rank is None else ("RANK", "WORLD_SIZE")
        raise ConfigError(f"the environment sets {have}={os.environ[have]} but not {lack}, and no "
                          "torch.distributed process group is initialised: this process's rank is unknown. Make "
                          "the Loader's first epoch (or len(), state_dict()) come after init_process_group — "
                          "Lightning initialises it in fit() —, run under torchrun (it sets both), or pass "
                          "rank= and world_size=")
    if rank >= world:
        raise ConfigError(f"the environment's RANK={rank} is not in [0, WORLD_SIZE={world})")
    return rank, world


def pending() -> bool:
    """A launcher started this process without telling it its rank yet: no process group, and
    WORLD_SIZE set without RANK (Lightning's DDP processes before `fit()`). A caller may wait
    for the group; asked now, `environment` refuses it."""
    return group() is None and "WORLD_SIZE" in os.environ and "RANK" not in os.environ


SINGLE = "a single process (no process group, no RANK / WORLD_SIZE)"


def launcher():
    """(the launcher's (rank, world_size) or None, where it comes from — for messages): the
    process group's, else the environment's (checked: see `environment`), else None."""
    g = group()
    if g is not None:
        return g, "torch.distributed's process group"
    env = environment()
    return (env, "the environment's RANK / WORLD_SIZE") if env is not None else (None, SINGLE)


def placement(rank, world_size, given_by=None, source: str = SINGLE):
    """(rank, world_size) of this process, from the caller's `rank` / `world_size` (checked ints
    ≥ 0 / ≥ 1, or None) and the launcher's placement `given_by` ((rank, world_size) or None):

    - neither given: the launcher's, else (0, 1);
    - one given: the other from the launcher (else 0 / 1), and the given one must agree with it;
    - both given: as given (a split of the caller's own, such as world_size=1 to evaluate every
      sample on one process), except that with the process group's world size the rank must
      be this process's: two processes with one rank would read the same share.

    `source` says where `given_by` came from (`launcher`), for the messages. ConfigError names
    what disagrees."""
    if rank is None and world_size is None:
        return given_by if given_by is not None else (0, 1)
    if rank is not None and world_size is not None:
        if rank >= world_size:
            raise ConfigError(f"rank {rank} not in [0, world_size={world_size})")
        g = group()
        if g is not None and world_size == g[1] and rank != g[0]:
            raise ConfigError(f"rank={rank} of world_size={world_size}, but torch.distributed's process group "
                              f"makes this process rank {g[0]} of {g[1]}: pass its rank (dist.get_rank()), or "
                              "leave rank and world_size out to take the group's")
        return rank, world_size
    if given_by is None:
        given_by, source = (0, 1), SINGLE
    if rank is not None:
        if rank != given_by[0]:
            raise ConfigError(f"rank={rank} given without world_size, but {source} makes this process rank "
                              f"{given_by[0]} of {given_by[1]}: pass both rank and world_size, or neither")
        return given_by
    if world_size != given_by[1]:
        raise ConfigError(f"world_size={world_size} given without rank, but {source} has {given_by[1]} "
                          f"process(es): pass both rank and world_size, or neither")
    return given_by


def resolve(rank, world_size):
    """`placement` with the launcher's placement as it stands now; both given, the environment
    is not read (a process whose launcher set half of it can still pass its own)."""
    if rank is not None and world_size is not None:
        return placement(rank, world_size)
    return placement(rank, world_size, *launcher())
