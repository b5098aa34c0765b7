"""`Loader`: the configuration of a training input pipeline; iterating it runs one epoch.

Composition (FFCV's shape): the Loader holds the settings, the dataset, the sampler and a
batcher (CPUBatcher or GPUBatcher, kept across epochs); `iter(loader)` starts an `EpochIterator`
— an ordered Prefetcher whose producer threads call the batcher for the epoch's batches. A
batch is a pure function of (seed, epoch, rank, world_size, batch index), so `state_dict()` is
just where the epoch stands, and resuming yields exactly the batches an uninterrupted run would.
"""
from __future__ import annotations

import os
import warnings
import weakref
from typing import Literal

import numpy as np

from ..decode.cpu import MAX_SIDE, cores
from ..decode.ops import IMAGENET_MEAN, IMAGENET_STD
from ..errors import OnError, RecordError, on_error as _on_error
from ..reader import Dataset
from .prefetch import Prefetcher
from .recipe import Recipe

Device = Literal["cpu", "cuda"]


def _dist_defaults(rank, world_size):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank), (dist.get_world_size() if world_size is None
                                                                 else world_size)
    except ImportError:
        pass
    return (int(os.environ.get("RANK", 0)) if rank is None else rank,
            int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size)


def _current_gpu() -> int:
    """The caller's current CUDA device (torch.cuda.set_device / cupy Device.use)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    try:
        import torch

        if torch.cuda.is_initialized():
            dev = torch.cuda.current_device()
    except ImportError:
        pass
    return dev


class Loader:
    """Iterate `(images, labels)` batches of a packed dataset, one epoch per iteration.

    Args:
        path: dataset directory, dataset URL (s3://bucket/prefix, any fsspec URL), or an open `Dataset`.
        batch_size: images per batch (≥ 1).
        device: "cpu" (native CPU decoder) or "cuda" (NVJPG engines + hybrid decoder + CPU share,
            on the caller's current CUDA device).
        train: RandomResizedCrop windows + random horizontal flip, keyed by (seed, epoch, sample
            id); False: resize to size·256/224 + centre crop.
        size: output side (1..16384).
        mean, std: normalisation per channel, 0..1 units (torchvision's).
        dtype: "float32" or "float16" output.
        layout: "NCHW" or "NHWC".
        seed: keys the shuffle, windows, flips and keyed user ops.
        rank, world_size: this process's share; default from torch.distributed or RANK/WORLD_SIZE.
        drop_last: drop the last partial batch (and cut the epoch to equal rank shares).
        prefetch: batches each producer makes ahead.
        threads: CPU decode threads (default: cores).
        user_op: op(batch) or KeyedOp op(batch, keys) on each uint8 NHWC batch before
            normalisation (numpy on CPU, CuPy on GPU); returns the batch. Or a compiled per-image
            op (recordtool.ops.ImageOp, needs recordtool[numba]): run by the native decode threads
            on each image after the resize, before mirror and normalize (on cuda: its CUDA
            kernel, one launch per batch); compiled here, OpCompileError if it cannot be.
        as_torch: torch tensors (DLPack on the GPU); default: when torch imports.
        producers: producer threads (default 2 on CPU, 4 on cuda).
        with_ids: also yield each batch's sample ids.
        split: cuda only — how the engines' images are shared with the CPU: "auto" (measured
            rates; an image may be decoded by engines in one run and libjpeg in another, see
            README's fidelity bound), "gpu" (bit-identical runs), "cpu", or a CPU share in [0, 1].
        hybrid: cuda only — progressive and gray files to nvJPEG's hybrid decoder (else the CPU).
        on_error: a record no decoder can decode — "raise" (RecordError naming shard and offset),
            "warn" (a warning; the sample is zeros, its label kept; listed in `bad_records`) or
            "skip" (the same without the warning).
        cache_dir, cache_limit: for a dataset URL (s3://…): its local shard cache (recordtool.remote).
        block_shards: `Dataset.sampler`'s — None: block shuffle for URLs, global permutation for local data.
    """

    def __init__(self, path, batch_size: int, device: Device = "cpu", train: bool = True, size: int = 224,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype: Literal["float32", "float16"] = "float32",
                 layout: Literal["NCHW", "NHWC"] = "NCHW", seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, drop_last: bool = True, prefetch: int = 2, threads: int | None = None,
                 user_op=None, as_torch: bool | None = None, producers: int | None = None, with_ids: bool = False,
                 split="auto", hybrid: bool = True, on_error: OnError | str = "raise", cache_dir: str | None = None,
                 cache_limit: int | None = None, block_shards: int | None = None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer ≥ 1, not {batch_size!r}")
        if not isinstance(size, (int, np.integer)) or not 1 <= size <= MAX_SIDE:
            raise ValueError(f"size must be an integer in 1..{MAX_SIDE}, not {size!r}")
        if dtype not in ("float32", "float16") or layout not in ("NCHW", "NHWC"):
            raise ValueError(f"dtype float32|float16 and layout NCHW|NHWC, not {dtype!r}, {layout!r}")
        if len(mean) != 3 or len(std) != 3 or not all(float(s) > 0 for s in std):
            raise ValueError("mean and std need 3 values each, std > 0")
        if device == "cuda":
            from ..decode.gpu.plan import check_split

            split = check_split(split)
        self.on_error = _on_error(on_error)
        self.ds = path if isinstance(path, Dataset) else Dataset(path, cache_dir=cache_dir, cache_limit=cache_limit)
        self.batch_size = int(batch_size)
        self.device, self.train, self.size = device, bool(train), int(size)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.dtype, self.layout = dtype, layout
        self.seed, self.drop_last, self.prefetch = seed, drop_last, max(1, int(prefetch))
        self.threads = max(1, int(threads or cores()))
        self.user_op, self.with_ids, self.split, self.hybrid = user_op, with_ids, split, hybrid
        # producer threads, batches dealt round-robin and handed out in order. On the GPU several
        # keep the NVJPG engines fed while one stages the next batch (BENCHMARKS.md: 4 best); on
        # the CPU two, so one's Python work and user op overlap the other's decode on the pool.
        self.producers = max(1, int(producers or (4 if device == "cuda" else 2)))
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.sampler = self.ds.sampler(seed=seed, rank=self.rank, world_size=self.world_size, drop_last=drop_last,
                                       block_shards=block_shards)
        if as_torch is None:
            try:
                import torch  # noqa: F401

                as_torch = True
            except ImportError:
                as_torch = False
        self.as_torch = as_torch
        self.epoch = 0
        self._start_batch = 0  # set by load_state_dict: first batch of the next iteration
        self._yielded = 0
        self._iterator = None  # weakref to the running EpochIterator
        self.bad_records: dict = {}  # record id → reason (on_error "warn" / "skip")
        self.last_split = None  # cuda: the last yielded batch's BatchReport
        self.stage_seconds: dict = {}  # producer-side seconds per stage, summed over yielded batches
        self.gpu_id = _current_gpu() if device == "cuda" else 0
        recipe = Recipe(self.ds, self.train, self.size, seed)
        # batches alive at once: queued (producers × prefetch), being made (producers), and the
        # consumer's current and previous one
        slots = self.producers * (self.prefetch + 1) + 2
        if device == "cpu":
            from .cpu import CPUBatcher

            self.batcher = CPUBatcher(recipe, self.threads, self.mean, self.std, dtype, layout, user_op, slots,
                                      self.batch_size, self.producers)
        else:
            from .gpu import GPUBatcher

            self.batcher = GPUBatcher(recipe, self.gpu_id, self.producers, self.threads, self.mean, self.std, dtype,
                                      layout, user_op, split, hybrid, slots, self.batch_size)

    # ------------------------------------------------------------------ epoch bookkeeping
    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._start_batch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self._yielded, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "world_size", "batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state_dict {key}={state[key]} does not match this loader's {getattr(self, key)}")
        self.epoch, self._start_batch = int(state["epoch"]), int(state["batch"])

    def batch_ids(self, epoch: int) -> list:
        """The sample ids of each batch of `epoch` for this rank."""
        order = self.sampler.indices(epoch)
        b = self.batch_size
        stop = len(order) // b * b if self.drop_last else len(order)
        return [order[s:s + b] for s in range(0, stop, b)]

    @property
    def ring(self):
        """The output ring (spills, free slots) — the GPU's OutputRing or the CPU's HostRing."""
        return self.batcher.ring

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> "EpochIterator":
        self.close()
        it = EpochIterator(self, self.epoch, self._start_batch)
        self._start_batch = 0
        self._iterator = weakref.ref(it)
        return it

    def close(self) -> None:
        """Stop the running epoch's producer threads (also done by a new iteration and `del`)."""
        it = self._iterator() if self._iterator is not None else None
        if it is not None:
            it.close()
        self._iterator = None

    def __del__(self):
        try:
            self.close()
            self.batcher.close()
        except Exception:
            pass


class EpochIterator:
    """One epoch of a Loader: the Prefetcher over the epoch's batches, in order; records where
    the epoch stands (for state_dict) and applies the on_error policy to bad records, in the
    consumer's thread."""

    def __init__(self, loader: Loader, epoch: int, start: int):
        self.loader, self.epoch = loader, epoch
        self.batches = loader.batch_ids(epoch)[start:]
        loader._yielded = start
        batches, batcher = self.batches, loader.batcher

        def make(j, slot):
            return batcher(batches[j], epoch, slot)

        self._prefetcher = Prefetcher(len(batches), make, loader.producers, loader.prefetch)

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.batches) - self._prefetcher.done

    def __next__(self):
        ld = self.loader
        try:
            made = next(self._prefetcher)
        except StopIteration:
            if self._prefetcher.done == len(self.batches):
                # a finished epoch moves on, as DataLoader users expect with set_epoch
                ld.epoch, ld._yielded = self.epoch + 1, 0
            raise
        ids = self.batches[self._prefetcher.done - 1]
        if made.report is not None:
            ld.last_split = made.report
        for k, v in made.stages.items():
            ld.stage_seconds[k] = ld.stage_seconds.get(k, 0.0) + v
        if made.errors:
            self._bad(ids, made.errors)
        ld._yielded += 1
        images, labels = made.images, made.labels
        if ld.as_torch:
            images, labels = self._torch(images, labels)
        return (images, labels, ids) if ld.with_ids else (images, labels)

    def _torch(self, images, labels):
        import torch

        ld = self.loader
        if ld.device == "cpu":
            return torch.from_numpy(images), torch.from_numpy(labels)
        from ..decode.gpu import to_torch

        with torch.cuda.device(ld.gpu_id):  # the producer synchronised its stream: the batch is complete
            return to_torch(images), torch.from_numpy(labels).cuda(ld.gpu_id, non_blocking=True)

    def _bad(self, ids, errors) -> None:
        ld = self.loader
        c = ld.ds.index.columns
        lines = []
        for i, reason in errors:
            r = int(ids[i])
            shard = ld.ds.shards[int(c["shard"][r])]["name"]
            where = os.path.join(ld.ds.root, shard)
            lines.append(f"record {r} ({where}, image bytes at offset {int(c['jpeg_offset'][r])}, "
                         f"{int(c['jpeg_length'][r])} bytes): {reason}")
            ld.bad_records[r] = reason
        if ld.on_error is OnError.RAISE:
            self.close()
            raise RecordError("undecodable image(s): " + "; ".join(lines))
        if ld.on_error is OnError.WARN:
            for line in lines:
                warnings.warn(f"recordtool: {line}; the sample is zeros this time", RuntimeWarning, stacklevel=3)

    def close(self) -> None:
        """Stop this epoch's producers (also on garbage collection and at interpreter exit)."""
        self._prefetcher.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
