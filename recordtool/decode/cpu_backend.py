"""The CPU backend: a batch's JPEGs → fused native decode + crop + resize + mirror + normalize
straight into a recycled output array — with a compiled per-image op (recordtool.ops) inside
that pass; with a batch user op, uint8 first, then the op, then normalize."""
from __future__ import annotations

import collections
import ctypes
import threading
import time

import numpy as np

from ..errors import OpError
from . import cpu
from .backend import NO_STATS, Backend, BatchStats, CompiledOp, ProducedBatch, as_bfloat16, call_user_op, op_params
from .recipe import Recipe


class HostRing:
    """Host output batches allocated once and recycled, like the GPU's OutputRing: a slot comes
    back when the last array viewing it (numpy, or a torch tensor made by from_numpy) dies.
    Every batch a fresh 150 MB array would cost page faults on each of its pages (glibc maps
    such blocks anew each time); a held slot is never reused — when all are held the batch is a
    new array and counts in `spills`.

    Args:
        shape: the full batch shape.
        dtype: element type.
        slots: batches alive at once.
    """

    def __init__(self, shape, dtype, slots: int):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        ring = self

        class Owner(ctypes.c_uint8 * nbytes):
            __slots__ = ("k",)

            def __del__(self):
                ring._give_back(self.k)

        self._owner = Owner
        self._mem = [np.empty(nbytes, np.uint8) for _ in range(slots)]
        for m in self._mem:
            m.fill(0)  # touch every page now, not in the first epoch
        self._free = collections.deque(range(slots))
        self._lock = threading.Lock()
        self.spills = 0

    @property
    def slots(self) -> int:
        return len(self._mem)

    @property
    def free(self) -> int:
        return len(self._free)

    def acquire(self, n: int) -> np.ndarray:
        shape = (n,) + self.shape[1:]
        with self._lock:
            k = self._free.popleft() if self._free else None
            if k is None:
                self.spills += 1
        if k is None:
            return np.empty(shape, self.dtype)
        owner = self._owner.from_buffer(self._mem[k])
        owner.k = k
        return np.frombuffer(owner, self.dtype, int(np.prod(shape))).reshape(shape)

    def _give_back(self, k: int) -> None:
        with self._lock:
            self._free.append(k)


class CPUBackend(Backend):
    """Makes the batches of a CPU Loader (decode.backend.Backend). Where the protocol asks for
    what only a device with a queue or a second decoder needs, it does nothing by design: no
    pacing (a batch's work is done when it is handed out), no announcement (no look-ahead lane:
    every image is on the CPU path already) and no steering (one decoder, nothing to share).

    Args:
        recipe: what a batch is (windows, flips, labels from seed, epoch and ids) and its
            output (recipe.output: size, normalisation, dtype, layout, memory format).
        threads: native decode threads per call.
        user_op: optional op on the uint8 NHWC batch before normalisation (see ops.batch), or a
            compiled per-image op (recordtool.ops.ImageOp) run inside the fused pass.
        image_op: `user_op` when it is a compiled per-image op, compiled by the Loader for the
            CPU (ImageOp.prepare); else None.
        slots: output batches alive at once (queued + being made + held by the consumer).
        max_batch: images per batch at most.
        producers: producer slots; each gets its own native thread pool.
    """

    announces = False

    def __init__(self, recipe: Recipe, *, threads: int, user_op, image_op: CompiledOp | None, slots: int,
                 max_batch: int, producers: int = 1):
        self.recipe, self.threads = recipe, threads
        spec = recipe.output
        self.user_op = user_op
        self.image_op = image_op
        h, w = spec.size
        self.ring = HostRing(spec.buffer_shape(max_batch), spec.storage_dtype, slots)
        # producer slot → its uint8 batch for the user op (each producer writes only its own)
        self._scratch = [np.empty((max_batch, h, w, 3), np.uint8) for _ in range(producers)] \
            if user_op is not None and self.image_op is None else []
        # one native pool per producer slot: batches of different producers decode at the same
        # time, so one batch's tail (its last, largest images) overlaps the next one's start
        self._pools = [cpu.new_pool_id() for _ in range(producers)]
        ix = recipe.ds.index
        try:
            for pool in self._pools:
                cpu.reserve(ix.width, ix.height, threads, pool)  # its threads' decode buffers, now
        except BaseException:  # ThreadStartError: the pool stopped what it started; its id goes back
            self.close()
            raise

    def make(self, ids, epoch: int, slot: int, drawn: tuple | None = None) -> ProducedBatch:
        """The batch of these ids in this epoch, made by producer `slot`; drawn: its (windows,
        flips) when the stream drew them (Recipe.draws)."""
        t0 = time.perf_counter()
        b = self.recipe.inputs(ids, epoch, drawn)
        t1 = time.perf_counter()
        errors: list = []
        out = self.ring.acquire(len(ids))
        spec = self.recipe.output
        pool = self._pools[slot]
        if self.user_op is None or self.image_op is not None:
            op = None
            if self.image_op is not None:
                h, w = spec.size
                op = self.image_op.native(op_params(self.image_op, len(ids), b.keys, h, w))
            try:
                cpu.decode_crop_resize_normalize(b.buffers, b.windows, b.flips, spec.size, spec.mean, spec.std,
                                                 spec.buffer_layout, spec.dtype, out=out, threads=self.threads,
                                                 on_error="skip", fallback=True, errors=errors, pool=pool, op=op)
            except OpError as e:
                raise OpError(e.failures, e.name,
                              f" (sample ids {[int(ids[i]) for i, _ in e.failures[:5]]}, epoch {epoch})") from None
            t2 = t3 = time.perf_counter()
        else:
            raw = cpu.decode_crop_resize(b.buffers, b.windows, spec.size, self.threads, self._scratch[slot][:len(ids)],
                                         on_error="skip", fallback=True, errors=errors, pool=pool)
            raw[b.flips] = raw[b.flips, :, ::-1]  # the user sees the batch as training will
            t2 = time.perf_counter()
            raw = call_user_op(self.user_op, raw, b.keys)
            t3 = time.perf_counter()
            cpu.normalize(raw, spec.mean, spec.std, spec.buffer_layout, spec.dtype, threads=self.threads, out=out)
        return ProducedBatch(out, b.labels, errors, {"inputs": t1 - t0, "decode": t2 - t1, "user_op": t3 - t2,
                                                     "normalize": time.perf_counter() - t3})

    def announce(self, ids, epoch: int, slot: int, drawn: tuple | None = None) -> None:
        """Nothing: the CPU decodes each batch when it makes it (`announces` is False)."""

    def pace(self, stages: dict) -> None:
        """Nothing: a CPU batch is complete when it is made; the consumer has no queue to outrun."""

    def consumer_waited(self, wait: float, interval: float) -> None:
        """Nothing: one decoder, no share to steer."""

    def stats(self, made: ProducedBatch) -> BatchStats:
        return NO_STATS

    def handout(self, made: ProducedBatch, as_torch: bool) -> tuple:
        """The batch's arrays, or torch tensors on them (no copy)."""
        images, labels = made.images, made.labels
        if as_torch:
            import torch

            images, labels = as_bfloat16(torch.from_numpy(images), self.recipe.output), torch.from_numpy(labels)
        return self.recipe.output.arrange(images), labels

    def close(self) -> None:
        for pool in self._pools:
            cpu.release_pool_id(pool)
        self._pools = []
        self._scratch = []
