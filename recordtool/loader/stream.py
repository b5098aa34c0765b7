"""The Loader's batches as one stream across epoch ends, as DALI's pipeline runs: the producer
threads go on into the next epoch's first batches while the training loop consumes this epoch's
last ones, so an epoch starts with its batches made instead of from idle producers.

Invariants:
- task t of a stream that starts at (epoch e0, batch s) is batch s + t of e0 while t < n − s, then
  batch (t − n + s) mod n of epoch e0 + 1 + (t − n + s) // n, n = batches per epoch: the same
  (epoch, batch) → same ids → same batch, whatever the producers (a batch is a pure function of
  seed, epoch, rank, world_size and batch index).
- a stream runs ahead by at most what the Prefetcher holds (producers × (depth + 1) batches), so
  the output ring's slot count is the same as for one epoch.
- producer threads hold the backend and the sampler, never the Loader: an abandoned Loader is
  garbage-collected and closes its stream.
- a batch's windows and flips are drawn DRAW_RUN batches at a time (`draws`: one call for the
  run's ids, then split) — the same values as one batch's call, computed once by whichever
  producer needs the run first.
- with `ahead`, the producer making task t first announces its next task, t + producers (the
  same (epoch, batch) → ids → draws), so the backend can start on that batch's slowest images
  (decode.gpu.ahead); nothing is announced past the end of a stream that is not continuous.
"""
from __future__ import annotations

import threading

import numpy as np

from .prefetch import Prefetcher

DRAW_RUN = 16  # batches whose windows and flips are drawn in one call


def epoch_batches(sampler, batch_size: int, drop_last: bool, epoch: int) -> list:
    """The sample ids of each batch of `epoch` (a rank's share, in order)."""
    order = sampler.indices(epoch)
    stop = len(order) // batch_size * batch_size if drop_last else len(order)
    return [order[s:s + batch_size] for s in range(0, stop, batch_size)]


class BatchStream:
    """Batches from (epoch, start) on; across epoch ends when `continuous`, else to the end of
    this epoch only. `take()` gives (epoch, batch index, ids, made) in order.

    Args:
        make_batch: make_batch(ids, epoch, slot, drawn) → ProducedBatch (Backend.make); drawn =
            draws(ids, epoch).
        draws: draws(ids, epoch) → (windows, flips) of those ids (Recipe.draws); None: the
            backend draws each batch itself (make_batch(ids, epoch, slot)).
        sampler, batch_size, drop_last: what each epoch's batches are (epoch_batches).
        per_epoch: batches in an epoch (the Loader's len).
        epoch, start: where the stream starts.
        producers, depth: the Prefetcher's threads and their queue depth.
        continuous: run on into the following epochs.
        launch: start the producers now; False: at `launch()`.
        ahead: ahead(ids, epoch, slot, drawn) — producer `slot`'s next batch, announced before
            it makes its current one (Backend.announce); None: nothing announced.
    """

    def __init__(self, make_batch, sampler, batch_size: int, drop_last: bool, per_epoch: int, epoch: int, start: int,
                 producers: int, depth: int, continuous: bool, draws=None, launch: bool = True, ahead=None):
        self.per_epoch, self.epoch0, self.start, self.order = per_epoch, epoch, start, sampler
        first = per_epoch - start
        self.continuous = continuous and per_epoch > 0
        lock, cache, runs = threading.Lock(), {}, {}

        def where(t: int):
            if t < first:
                return epoch, start + t
            e, j = divmod(t - first, per_epoch)
            return epoch + 1 + e, j

        def batches(e: int) -> list:
            with lock:  # each epoch's order computed once, by whichever producer needs it first
                if e not in cache:
                    for old in [k for k in cache if k < e - 1]:
                        del cache[old]
                    cache[e] = epoch_batches(sampler, batch_size, drop_last, e)
                return cache[e]

        per_run = -(-per_epoch // DRAW_RUN)  # runs in an epoch

        def drawn(e: int, j: int, order: list):
            """(windows, flips) of batch j of epoch e, from its run's draws (made on first use)."""
            c = j // DRAW_RUN
            key = e * per_run + c  # runs in stream order
            with lock:
                run = runs.get(key)
                if run is None:
                    part = order[c * DRAW_RUN:(c + 1) * DRAW_RUN]
                    win, flips = draws(np.concatenate(part), e)
                    cuts = np.cumsum([len(b) for b in part])[:-1]
                    run = runs[key] = list(zip(np.split(win, cuts), np.split(flips, cuts)))
                    for old in [k for k in runs if k < key - 2]:
                        del runs[old]  # a producer lagging further behind draws its run again
            return run[j % DRAW_RUN]

        def make(t: int, slot: int):
            nxt = t + producers  # this producer's next task (Prefetcher: t, t + producers, ...)
            if ahead is not None and (self.continuous or nxt < first):
                e, j = where(nxt)
                order = batches(e)
                ahead(order[j], e, slot, None if draws is None else drawn(e, j, order))
            e, j = where(t)
            order = batches(e)
            ids = order[j]
            if draws is None:
                return e, j, ids, make_batch(ids, e, slot)
            return e, j, ids, make_batch(ids, e, slot, drawn(e, j, order))

        self._where = where
        self._prefetcher = Prefetcher(None if self.continuous else first, make, producers, depth, start=launch)

    def launch(self) -> None:
        """Start the producers (made with launch=False; see Prefetcher.start)."""
        self._prefetcher.start()

    @property
    def position(self) -> tuple:
        """(epoch, batch index) of the next batch `take()` gives; None past the end of a stream
        that is not continuous."""
        t = self._prefetcher.done
        return None if not self.continuous and t >= self.per_epoch - self.start else self._where(t)

    @property
    def closed(self) -> bool:
        return self._prefetcher.closed

    def take(self):
        """The next (epoch, batch index, ids, made); StopIteration at the end of a stream that is not continuous."""
        return next(self._prefetcher)

    def close(self) -> None:
        self._prefetcher.close()
