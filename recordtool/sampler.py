"""Which samples a rank takes each epoch: `Sampler`, a global shuffle per epoch split by rank as
torch's DistributedSampler splits it, and `BlockSampler`, the block shuffle of datasets read shard
by shard through a bounded cache (recordtool.remote). Pure functions of (seed, epoch, rank,
world_size): the Loader's batches are the same whatever its threads and producers.
"""
from __future__ import annotations

import numpy as np

from .checks import MAX_SEED, bounded_int
from .errors import ConfigError


def check_block_shards(value, lo: int) -> int:
    """block_shards, shards per block: an integer ≥ lo (0 at `Dataset.sampler`: a global
    permutation; 1 at `BlockSampler`), or ConfigError naming it — a bool, a float, a string or
    NaN is no shard count."""
    return bounded_int("block_shards", value, lo, floats=False)


def check_ranks(n: int, rank, world_size, drop_last: bool) -> tuple:
    """(rank, world_size) of a split of n samples, or ConfigError naming the argument. More
    ranks than samples is taken as torch's DistributedSampler takes it: without drop_last the
    shares are padded by repeating samples, so each rank still gets one; with drop_last each
    share would be empty — refused, naming both numbers."""
    world_size = bounded_int("world_size", world_size, 1, floats=False)
    rank = bounded_int("rank", rank, 0, floats=False)
    if rank >= world_size:
        raise ConfigError(f"rank {rank} not in [0, world_size={world_size})")
    if n == 0:
        raise ConfigError(f"no samples to split over world_size={world_size} ranks")
    if n < world_size and drop_last:
        raise ConfigError(f"{n} samples cannot be split over world_size={world_size} ranks with drop_last: each "
                          f"rank's share would be empty; use at most {n} ranks, or pass drop_last=False (the "
                          "shares are then padded by repeating samples, as torch's DistributedSampler pads them)")
    return rank, world_size


class Sampler:
    """Per-epoch permutation from (seed, epoch), split across ranks in equal parts.

    Like torch's DistributedSampler: the global order is shuffled once per epoch, padded by
    wrapping around (or cut with drop_last) to a multiple of world_size, and rank r takes
    positions r, r + world_size, … — so every sample is seen once per epoch across ranks.
    With more ranks than samples each rank gets one, repeats included (drop_last: refused,
    `check_ranks`). ConfigError for a bad argument.
    """

    def __init__(self, n: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 drop_last: bool = False, shuffle: bool = True):
        n = bounded_int("n (samples)", n, 0, floats=False)
        rank, world_size = check_ranks(n, rank, world_size, drop_last)
        seed = bounded_int("seed", seed, 0, MAX_SEED, floats=False)
        self.n, self.seed, self.rank, self.world_size = n, seed, rank, world_size
        self.drop_last, self.shuffle = drop_last, shuffle
        self.per_rank = n // world_size if drop_last else -(-n // world_size)

    def __len__(self) -> int:
        return self.per_rank

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))

    def _order(self, epoch: int) -> np.ndarray:
        """This epoch's order of all n samples, before padding or cutting for the ranks."""
        return self._rng(epoch).permutation(self.n) if self.shuffle else np.arange(self.n)

    def _pad(self, order: np.ndarray, count: int) -> np.ndarray:
        return np.resize(order, count)  # wrap around to the start

    def global_order(self, epoch: int) -> np.ndarray:
        order = self._order(epoch)
        total = self.per_rank * self.world_size
        if total > self.n:
            order = np.concatenate([order, self._pad(order, total - self.n)])
        return order[:total]

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for `epoch`."""
        return self.global_order(epoch)[self.rank::self.world_size]


DEFAULT_BLOCK_SHARDS = 4


class BlockSampler(Sampler):
    """Block shuffle for data read shard by shard (object storage through a bounded cache).

    Each epoch: the shards are permuted, cut into blocks of `block_shards` consecutive shards
    of that permutation, the blocks taken in turn, and the samples within each block permuted
    — one generator seeded with (seed, epoch) draws both. So the epoch reads each shard while
    its block is current: once per epoch, with at most two blocks on disk at a time (the
    current one and the next, fetched ahead). Ranks split the order like `Sampler` (rank r
    takes positions r, r + world_size, …), so every sample is seen once per epoch across ranks
    and all ranks of a machine want the same shards at the same time (one download each,
    shared through the cache). Padding repeats samples from the end of the order (the last
    block, still on disk), not the start. Pack already shuffles records across shards, so a
    block is a random mix of the whole dataset.

    Args:
        shard_of: the shard number of every record (the index's `shard` column).
        shards: number of shards in the dataset.
        block_shards: shards per block, an integer ≥ 1.
        seed, rank, world_size, drop_last, shuffle: as for `Sampler`.
    """

    def __init__(self, shard_of: np.ndarray, shards: int, block_shards: int = DEFAULT_BLOCK_SHARDS,
                 seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False, shuffle: bool = True):
        super().__init__(len(shard_of), seed=seed, rank=rank, world_size=world_size, drop_last=drop_last,
                         shuffle=shuffle)
        self.shards, self.block_shards = int(shards), check_block_shards(block_shards, 1)
        shard_of = np.asarray(shard_of, np.int64)
        self._by_shard = np.argsort(shard_of, kind="stable")  # record ids grouped by shard, in order
        self._starts = np.concatenate([[0], np.cumsum(np.bincount(shard_of, minlength=self.shards))])
        self.on_plan = None  # callback(epoch, blocks, indices): a RemoteDataset fetches ahead along the blocks

    def blocks(self, epoch: int, rng: np.random.Generator | None = None) -> list:
        """This epoch's blocks: arrays of shard numbers, in the order they are read."""
        if rng is None:
            rng = self._rng(epoch)
        perm = rng.permutation(self.shards) if self.shuffle else np.arange(self.shards)
        return [perm[b:b + self.block_shards] for b in range(0, self.shards, self.block_shards)]

    def _order(self, epoch: int) -> np.ndarray:
        rng = self._rng(epoch)
        blocks = self.blocks(epoch, rng)
        parts = []
        for block in blocks:
            ids = np.concatenate([self._by_shard[self._starts[s]:self._starts[s + 1]] for s in block])
            parts.append(rng.permutation(ids) if self.shuffle else ids)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def indices(self, epoch: int) -> np.ndarray:
        mine = super().indices(epoch)
        if self.on_plan is not None:
            self.on_plan(epoch, self.blocks(epoch), mine)
        return mine

    def _pad(self, order: np.ndarray, count: int) -> np.ndarray:
        return np.resize(order[::-1], count)  # from the end: the last block is still on disk
