"""One epoch of a Loader (`EpochIterator`) and the Loader's sampler as torch's code sees it
(`LoaderSampler`: `set_epoch`, `len`, iteration).

Invariants:
- an iterator takes its epoch, first batch and generation from the Loader when its first batch
  is drawn (`Loader._begin`), not when it is made: what is called in between (`set_epoch`,
  `load_state_dict`, as Lightning calls them after `iter()`) decides that iteration's epoch.
- an iterator reports each batch it hands out to its Loader (`Loader._taken`) with the
  generation it began in; the Loader moves only for its latest iteration, so a `set_epoch` or
  `load_state_dict` made while an older loop runs is not undone by that loop.
"""
from __future__ import annotations

import os
import time
import warnings
import weakref

from ..errors import ConfigError, OnError, RecordError


class LoaderSampler:
    """`Loader.sampler`: the Loader's per-epoch order as torch's samplers present it, so that what
    calls `set_epoch` on a DataLoader's sampler (Lightning, at every epoch's start; scripts written
    for DistributedSampler) reaches the Loader. `len()` is this rank's share of an epoch,
    iterating gives the sample ids of the epoch the Loader stands in, and `order` is the order
    itself (Sampler or BlockSampler, for the Loader's rank and world size as they stand: see
    Loader.rank; its other attributes are read through). Holds the Loader weakly: it never keeps
    a Loader and its producers alive."""

    def __init__(self, loader):  # the Loader
        self._loader = weakref.ref(loader)

    @property
    def order(self):
        return self._owner()._share()

    def _owner(self):
        loader = self._loader()
        if loader is None:
            raise ConfigError("this sampler's Loader is gone: set_epoch on the Loader you iterate")
        return loader

    def set_epoch(self, epoch: int) -> None:
        """`Loader.set_epoch`."""
        self._owner().set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        return iter(self.order.indices(self._owner().epoch).tolist())

    def __getattr__(self, name: str):
        if name in ("order", "_loader"):  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.order, name)


class EpochIterator:
    """One epoch of a Loader: its batches from the BatchStream, in order; records where the
    epoch stands (for state_dict) and applies the on_error policy to bad records, in the
    consumer's thread. Its epoch is the one the Loader stands at when the first batch is
    drawn (see the module's invariants). Left before its end (or collected so), it stops the
    stream."""

    def __init__(self, loader):  # the Loader
        self.loader = loader
        self._stream = None  # the Loader's BatchStream, from the first batch on
        self._epoch = self._next = self._count = self._generation = None  # set by _begin
        self._last, self.finished = None, False  # _last: when the previous batch was handed out

    def _begin(self) -> None:
        self._stream, self._epoch, self._next, self._generation = self.loader._begin(self)
        self._count = len(self.loader)

    @property
    def epoch(self) -> int:
        """The epoch this iteration runs: fixed at its first batch; before it, the one it would run."""
        return self._epoch if self._stream is not None else self.loader._next_start()[0]

    def __iter__(self):
        return self

    def __len__(self) -> int:
        if self._stream is None:
            return len(self.loader) - self.loader._next_start()[1]
        return self._count - self._next

    def __next__(self):
        ld = self.loader
        if self._stream is None:
            self._begin()
        if self._next >= self._count:
            self._finish()  # the epoch is out (or had nothing left to yield: resumed at its end)
            raise StopIteration
        backend = ld.backend
        backend.pace(ld.stage_seconds)  # as far as the device needs (cuda: its run_ahead bound)
        t = time.perf_counter()
        try:
            epoch, j, ids, made = self._stream.take()
        except StopIteration:
            raise RuntimeError("recordtool: the loader's producers were stopped (Loader.close(), a new "
                               "iteration, or an error this epoch raised) while this epoch was being "
                               "iterated") from None
        if (epoch, j) != (self._epoch, self._next):  # an invariant of BatchStream
            raise RuntimeError(f"recordtool: batch {j} of epoch {epoch} came for batch {self._next} of {self._epoch}")
        self._next += 1
        now = time.perf_counter()
        if self._last is not None:  # how long the training loop waited (cuda: steers the CPU share)
            backend.consumer_waited(now - t, now - self._last)
        self._last = now
        counts = backend.stats(made)
        if counts.report is not None:
            ld.last_split = counts.report
        if counts.decoded:
            ld.decoded = {side: ld.decoded.get(side, 0) + n for side, n in counts.decoded.items()}
        ld.overflow += counts.overflow
        ld.ahead += counts.ahead
        for k, v in made.stages.items():
            ld.stage_seconds[k] = ld.stage_seconds.get(k, 0.0) + v
        if made.errors:
            self._bad(ids, made.errors)
        ld._taken(self._generation, self._epoch, self._next)
        if self._next == self._count:
            self._finish()
        images, labels = backend.handout(made, ld.as_torch)
        return (images, labels, ids) if ld.with_ids else (images, labels)

    def _finish(self) -> None:
        """The epoch's last batch is out: the Loader moves on to the next epoch, also for loops
        that stop after len(loader) batches without asking for one more (Lightning's fit loop
        does), and state_dict() says so."""
        if not self.finished and self._next == self._count:
            self.finished = True
            self.loader._taken(self._generation, self._epoch, self._next)

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
        """Stop the producers unless this epoch is out (then they run on into the next one for
        the loader's next iteration). Nothing to stop before the first batch. Also on garbage
        collection; interpreter exit stops them."""
        if self._stream is not None and not self.finished:
            self._stream.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
