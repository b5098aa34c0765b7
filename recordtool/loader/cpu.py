"""The CPU batcher: a batch's JPEGs → fused native decode + crop + resize + mirror + normalize
straight into a recycled output array — with a compiled per-image op (recordtool.ops) inside
that pass; with a batch user op, uint8 first, then the op, then normalize."""
from __future__ import annotations

import collections
import ctypes
import threading
import time

import numpy as np

from ..decode import cpu
from ..decode.ops import normalize
from ..errors import OpError
from .recipe import Made, Recipe


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


class CPUBatcher:
    """Makes the batches of a CPU Loader.

    Args:
        recipe: what a batch is (windows, flips, labels from seed, epoch and ids) and its
            output (recipe.spec: size, normalisation, dtype, layout, memory format).
        threads: native decode threads per call.
        user_op: optional op on the uint8 NHWC batch before normalisation (see ops.batch), or a
            compiled per-image op (recordtool.ops.ImageOp) run inside the fused pass.
        slots: output batches alive at once (queued + being made + held by the consumer).
        max_batch: images per batch at most.
        producers: producer slots; each gets its own native thread pool.
    """

    def __init__(self, recipe: Recipe, *, threads: int, user_op, slots: int, max_batch: int, producers: int = 1):
        self.recipe, self.threads = recipe, threads
        self.spec = spec = recipe.spec
        self.user_op = user_op
        self.image_op = image_op(user_op)
        if self.image_op is not None:
            self.image_op.compiled()  # compile now: a refused function fails the Loader, not a batch
        h, w = spec.size
        self.ring = HostRing(spec.buffer_shape(max_batch), spec.storage_dtype, slots)
        # producer slot → its uint8 batch for the user op (each producer writes only its own)
        self._scratch = [np.empty((max_batch, h, w, 3), np.uint8) for _ in range(producers)] \
            if user_op is not None and self.image_op is None else []
        # one native pool per producer slot: batches of different producers decode at the same
        # time, so one batch's tail (its last, largest images) overlaps the next one's start
        self._pools = [cpu.new_pool_id() for _ in range(producers)]
        ix = recipe.ds.index
        for pool in self._pools:
            cpu.reserve(ix.width, ix.height, threads, pool)  # its threads' decode buffers, now

    def __call__(self, ids, epoch: int, slot: int, drawn: tuple | None = None):
        """The batch of these ids in this epoch, made by producer `slot`; drawn: its (windows,
        flips) when the stream drew them (Recipe.draws)."""
        t0 = time.perf_counter()
        b = self.recipe.inputs(ids, epoch, drawn)
        t1 = time.perf_counter()
        errors: list = []
        out = self.ring.acquire(len(ids))
        spec = self.spec
        pool = self._pools[slot]
        if self.user_op is None or self.image_op is not None:
            op = None
            if self.image_op is not None:
                h, w = spec.size
                op = self.image_op.native(self.image_op.batch_params(len(ids), b.keys, h, w))
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
            normalize(raw, spec.mean, spec.std, spec.buffer_layout, spec.dtype, threads=self.threads, out=out)
        return Made(out, b.labels, errors, {"inputs": t1 - t0, "decode": t2 - t1, "user_op": t3 - t2,
                                            "normalize": time.perf_counter() - t3})

    def close(self) -> None:
        for pool in self._pools:
            cpu.release_pool_id(pool)
        self._pools = []
        self._scratch = []


def image_op(op):
    """`op` when it is a compiled per-image op (recordtool.ops.ImageOp), else None."""
    if op is None:
        return None
    from ..ops import ImageOp

    return op if isinstance(op, ImageOp) else None


def call_user_op(op, batch, keys):
    """op(batch, keys) for keyed ops (ops.batch.KeyedOp or `keyed = True`), else op(batch)."""
    if getattr(op, "keyed", False):
        return op(batch, keys)
    return op(batch)
