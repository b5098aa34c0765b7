"""A producer's look-ahead lane on the GPU: the CPU-routed images of its next batch decoded on
the CPU while it makes this one.

Why: the images no GPU decoder takes — above GPU_MAX_PIXELS, CMYK, layouts nvJPEG refuses; the
index says which (decode.gpu.plan.route) — are decoded by the CPU share inside their batch, and
a large file is Huffman-decoded whole for one random crop, longer beside a training loop. At a
node's share of the cores each producer's CPU share has one or two threads for all its images,
so without a lane the batch, its engines' part done, waits for the share's last file.
A producer makes batches t, t + P, t + 2P, … (prefetch.Prefetcher, P producers); while it
makes batch t its lane decodes batch t + P's CPU-routed images, largest first, with the CPU
path, the same windows and the same arguments as the batch's own CPU share
(GPUDecoder._decode_cpu): the same pixels, bit for bit (a batch's windows are a pure function
of seed, epoch and id: Recipe.draws).

Invariants:
- one lane per producer slot, called only from that producer's thread; its one worker thread
  runs the native decode on itself (pool=-1: no native pool shared with the batch's CPU share)
  at the CPU share's low priority (decode.cpu.BACKGROUND_NICE): work done ahead must give the
  cores up to the training loop and the engines' submitting thread when they want them, as the
  CPU share's pool threads do.
- at most KEEP batches' images are held: the batch being made and the next one. A lane whose
  producer's stream was discarded (set_epoch, load_state_dict) drops the stale batches' work at
  its next `ahead` (not-started images are cancelled).
- `take` never waits: an image the lane has not started is cancelled and the batch decodes it
  itself; one it is decoding is handed over as a callable, which the batch's CPU share calls
  while the engines work (GPUDecoder._decode_cpu), not before the batch is submitted; one the
  lane failed to decode is decoded again by the batch, which names the error (on_error), as
  without the lane.
"""
from __future__ import annotations

import collections
import functools
import os
import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor

import numpy as np

KEEP = 2  # batches whose images a lane holds: the one being made and the next


def decode_one(buffer, window, size):
    """One image as the batch's CPU share decodes it (decoder.cpu_share_decode), on the
    calling thread: uint8 (h, w, 3), or None when it failed."""
    from .decoder import cpu_share_decode

    h, w = size
    out = np.empty((1, h, w, 3), np.uint8)
    errors: list = []
    cpu_share_decode([buffer], np.asarray(window, np.float64).reshape(1, 4), (h, w), out, errors)
    return None if errors else out[0]


def _background() -> None:
    """The lane's worker: raise its own thread's nice as the CPU share's pools do (Linux: a
    thread's id names it alone; raising nice needs no privilege)."""
    from .. import cpu

    me = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + cpu.BACKGROUND_NICE))


def _result(f):
    """A lane's image, or None where its decode failed (the batch decodes it again and names the error)."""
    try:
        return f.result()
    except (CancelledError, Exception):
        return None


class AheadLane:
    """The look-ahead lane of one producer slot (see the module's docstring).

    Args:
        size: the output side (h, w) the CPU share decodes to.
    """

    def __init__(self, size: tuple):
        self.size = tuple(size)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="recordtool-ahead", initializer=_background)
        self._pending: collections.deque = collections.deque()  # (epoch, {id: Future}), oldest first
        self.taken = 0  # images a batch took from the lane (decoded ahead)

    def ahead(self, epoch: int, ids, buffers, windows, pixels) -> None:
        """Start decoding a coming batch's CPU-routed images: their record ids, JPEG bytes,
        windows (y, x, h, w) and pixel counts (largest first: the longest decode starts first)."""
        while len(self._pending) >= KEEP:
            self._drop(self._pending.popleft()[1])
        jobs: dict = {}
        for k in np.argsort(-np.asarray(pixels, np.int64), kind="stable").tolist():
            i = int(ids[k])
            if i not in jobs:  # a record twice in a batch (a padded rank share): the same window
                jobs[i] = self._pool.submit(decode_one, buffers[k], windows[k], self.size)
        self._pending.append((epoch, jobs))

    def take(self, epoch: int, ids) -> dict:
        """This batch's images the lane decoded or is decoding: {position in the batch: uint8
        (h, w, 3), or a callable giving it (None: the batch decodes it)}; never waits. The batch
        is the oldest held one of this epoch whose records are all in `ids` (batches held before
        it are stale: dropped)."""
        wanted = {int(i) for i in np.asarray(ids).tolist()}
        for n, (e, jobs) in enumerate(self._pending):
            if e == epoch and jobs.keys() <= wanted:
                break
        else:
            return {}
        for _ in range(n):
            self._drop(self._pending.popleft()[1])
        jobs = self._pending.popleft()[1]
        got: dict = {}
        for i, f in jobs.items():
            if f.cancel():  # not started: the batch decodes it
                continue
            if not f.done():  # being decoded: the batch's CPU share waits for it beside the engines
                got[i] = functools.partial(_result, f)
            elif (img := _result(f)) is not None:
                got[i] = img
        out = {k: got[int(i)] for k, i in enumerate(np.asarray(ids).tolist()) if int(i) in got}
        self.taken += len(out)
        return out

    @staticmethod
    def _drop(jobs: dict) -> None:
        for f in jobs.values():
            f.cancel()

    def close(self) -> None:
        """Cancel what has not started and stop the worker (it finishes the image it is on)."""
        while self._pending:
            self._drop(self._pending.popleft()[1])
        self._pool.shutdown(wait=False, cancel_futures=True)
