"""Where pack's work runs: an `Engine` is threads of this process, worker processes, or a Ray
cluster. Every engine runs the same two units of work (task.py), so the bytes never depend on
the engine or its worker count:

- by size (no `shards`): chunks of items are loaded and fixed on the engine's workers
  (`Session.load`), and the driver writes them in order, a new part file whenever the current
  one reaches `shard_size`;
- planned (`shards=N`): each part file is filled by `fill_shard` on a worker
  (`Session.fill`), and the driver merges their records.

Each engine reads `workers` its own way (threads, processes, the CPUs of a local Ray
instance). A new engine is a frozen dataclass with `name` and `session()` here, and a name
in `ENGINES`. process_worker.py is what runs in ProcessEngine's workers; ray_tasks.py is
RayEngine's Ray side.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import deque
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Iterator, Protocol

from ..checks import MAX_THREADS, bounded_int
from ..errors import ShardStopped, WorkerLost
from ..sources.base import Source
from ..util import cores
from .plan import Options
from .process_worker import _process_fill, _process_init, _process_load, _sigint_deferred, _WorkerContext
from .semaphores import named
from .task import fill_shard, light_source, load_item

CHUNK = 16  # items per unit of by-size loading (a future per item costs more than reading a small file)
AHEAD = 4  # chunks in flight per worker: memory stays bounded


class Session(Protocol):
    """An engine at work on one pack (what `Engine.session` yields).

    Attributes:
        window: chunks that may be in flight at once when loading by size.
        retried: tasks run again after their worker died (the Ray engine; 0 elsewhere).
    """

    window: int
    retried: int

    def load(self, chunk: list):
        """Start loading and fixing `chunk`; an object whose `result()` is (the `load_item`
        results in order, the source's notes for their labels)."""

    def fill(self, tasks: list, partial: str, bar=None) -> list:
        """Fill `tasks`' part files into `partial`; their `ShardDone`s. The first failure
        stops the others at their next item."""


class Engine(Protocol):
    name: str  # "local", "process", "ray": the Summary's and the CLI's word

    def session(self, source: Source, options: Options) -> contextlib.AbstractContextManager:
        """Workers ready for `source`'s items (a `Session`), stopped when the block ends."""


def _workers(engine) -> None:
    """An engine's `workers` checked (an integer in 0..MAX_THREADS) and stored as an int, or
    None for 0 / None (the engine's default)."""
    w = engine.workers
    w = None if w is None else bounded_int("workers", w, 0, MAX_THREADS, floats=False)
    object.__setattr__(engine, "workers", w or None)


def ordered_chunks(session, items: list, chunk: int = CHUNK) -> Iterator[tuple]:
    """`session.load` over `items` in chunks, results in input order, at most
    `session.window` chunks in flight. Yields (results, notes) per chunk."""
    chunks = (items[i:i + chunk] for i in range(0, len(items), chunk))
    pending = deque()
    for batch in chunks:
        pending.append(session.load(batch))
        if len(pending) >= session.window:
            break
    while pending:
        done = pending.popleft().result()
        for batch in chunks:
            pending.append(session.load(batch))
            break
        yield done


# ------------------------------------------------------------------ threads

@dataclass(frozen=True)
class ThreadEngine:
    """Threads of this process (the default without transcoding: reading and copying JPEG
    bytes releases the GIL).

    Args:
        workers: threads (default 2 × cores, at most 32).
    """

    workers: int | None = None
    name = "local"

    def __post_init__(self):
        _workers(self)

    @property
    def threads(self) -> int:
        return self.workers or min(32, cores() * 2)

    @contextlib.contextmanager
    def session(self, source, options):
        s = _ThreadSession(source, options, self.threads)
        try:
            yield s
        except BaseException:
            s.stop.set()
            s.close(cancel=True)
            raise
        s.close()


class _ThreadSession:
    retried = 0

    def __init__(self, source, options, threads):
        self.source, self.options, self.threads = source, options, threads
        self.window = threads * AHEAD
        self.stop = threading.Event()
        self._ex = None

    def load(self, chunk):
        if self._ex is None:
            self._ex = ThreadPoolExecutor(self.threads, thread_name_prefix="recordtool-pack")
        source, options = self.source, self.options
        return self._ex.submit(lambda: ([load_item(source, it, options) for it in chunk], {}))

    def fill(self, tasks, partial, bar=None):
        from ..io.fs import get_fs

        fs, partial = get_fs(partial)
        stop = self.stop
        progress = bar.update if bar is not None else None

        def one(task):
            if stop.is_set():
                raise ShardStopped(task.name)
            try:
                return fill_shard(task, self.source, self.options, partial, fs, progress, stop)
            except BaseException:
                stop.set()
                raise

        ex = ThreadPoolExecutor(max_workers=max(1, min(self.threads, len(tasks))), thread_name_prefix="recordtool-shard")
        try:
            futures = [ex.submit(one, t) for t in tasks]
            wait(futures)
        except BaseException:  # Ctrl-C, SIGTERM: the shard threads stop at their next item
            stop.set()
            raise
        finally:
            ex.shutdown(wait=True)
        return _results(futures)

    def close(self, cancel: bool = False):
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=cancel)
            self._ex = None


def _results(futures) -> list:
    """The futures' results, or the failure itself (not the shards it stopped early)."""
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, ShardStopped)), errors[0])
    return [f.result() for f in futures]


# ------------------------------------------------------------------ processes

@dataclass(frozen=True)
class ProcessEngine:
    """Worker processes (the default when transcoding: its Python share — header probes, the
    encoder's wrapper, numpy, the record's framing — keeps threads from scaling; processes do
    not share a GIL). Workers are spawned (not forked: the driver has threads), get the source
    once without its item list, and die with the driver.

    Args:
        workers: processes (default: cores).
    """

    workers: int | None = None
    name = "process"

    def __post_init__(self):
        _workers(self)

    @property
    def processes(self) -> int:
        return self.workers or cores()

    @contextlib.contextmanager
    def session(self, source, options):
        s = _ProcessSession(source, options, self.processes)
        try:
            yield s
        except BaseException:
            s.stop.set()  # the workers stop at their next item
            s.close(cancel=True)
            raise
        s.close()


class _ProcessSession:
    retried = 0

    def __init__(self, source, options, processes):
        self.source, self.options, self.processes = source, options, processes
        self.window = processes * AHEAD
        self.ctx = _WorkerContext()
        with named():  # the semaphores behind them: see pack/semaphores.py
            self.progress, self.stop = self.ctx.SimpleQueue(), self.ctx.Event()
        self._pool = None
        self._procs = {}

    def _executor(self, n: int):
        if self._pool is None:
            from concurrent.futures import ProcessPoolExecutor

            with named():
                self._pool = ProcessPoolExecutor(n, mp_context=self.ctx, initializer=_process_init,
                                                 initargs=(light_source(self.source), self.progress, self.stop,
                                                           os.getpid()))
            procs = getattr(self._pool, "_processes", None)  # the pool's own dict (filled as it spawns): to name a death
            self._procs = procs if isinstance(procs, dict) else {}
        return self._pool

    def load(self, chunk):
        ex = self._executor(self.processes)
        with _sigint_deferred():
            return _Result(self, ex.submit(_process_load, chunk, self.options))

    def fill(self, tasks, partial, bar=None):
        ex = self._executor(max(1, min(self.processes, len(tasks))))

        def drain():
            while not self.progress.empty():
                k = self.progress.get()
                if bar is not None:
                    bar.update(k)

        with _sigint_deferred():
            futures = [ex.submit(_process_fill, t, self.options, partial) for t in tasks]
        pending = set(futures)
        try:
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                drain()
                if any(f.done() and f.exception() is not None for f in futures):
                    self.stop.set()
        except BaseException:  # Ctrl-C, SIGTERM: the workers stop at their next item
            self.stop.set()
            raise
        drain()
        try:
            return _results(futures)
        except _broken() as e:
            raise self.lost(e, sum(1 for f in futures if f.done() and f.exception() is None)) from None

    def lost(self, e, kept: int | None = None) -> WorkerLost:
        """The error for a worker that died under the pool (BrokenProcessPool)."""
        self.close(cancel=True)  # joins the workers: their exit codes are known from here
        how = sorted({f"killed by {signal.Signals(-p.exitcode).name}" for p in self._procs.values()
                      if p.exitcode is not None and p.exitcode < 0 and -p.exitcode != signal.SIGTERM})
        what = f"a worker process of --engine process died ({', '.join(how) or 'terminated abruptly'}: " \
               "a signal, or the out-of-memory killer?)"
        if kept is None:
            return WorkerLost(f"{what}; nothing was published: run the same command again "
                              "(a pack without --shards starts over)")
        return WorkerLost(f"{what}; the shards finished ({kept} of this run) are kept in OUT/.partial: run the same "
                          "command again to resume")

    def close(self, cancel: bool = False):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None


class _Result:
    """A by-size chunk in a worker process; a dead worker's chunk raises WorkerLost."""

    def __init__(self, session, future):
        self.session, self.future = session, future

    def result(self):
        try:
            return self.future.result()
        except _broken() as e:
            raise self.session.lost(e) from None


def _broken():
    from concurrent.futures.process import BrokenProcessPool

    return BrokenProcessPool


# ------------------------------------------------------------------ Ray

@dataclass(frozen=True)
class RayEngine:
    """Ray tasks on a cluster (pip install 'recordtool[ray]'): by size, chunks of items are
    loaded and fixed on the cluster and written here; with `shards`, one task per part file
    writes into OUT/.partial, which must then be on storage every node sees.

    Args:
        workers: CPUs of the local Ray instance pack starts (default: all); not used when
            joining a running cluster.
        address: None (RAY_ADDRESS if set, else a new local instance), "auto" (the cluster
            running on this machine), "ray://HOST:PORT", "HOST:PORT" or "local".
    """

    workers: int | None = None
    address: str | None = None
    name = "ray"

    def __post_init__(self):
        _workers(self)
        from .ray_tasks import require

        require()

    @contextlib.contextmanager
    def session(self, source, options):
        from . import ray_tasks

        with ray_tasks.connected(self.address, self.workers):
            c = ray_tasks.Cluster(source, options)
            try:
                yield c
            except BaseException:
                c.cancel()
                raise


ENGINES = {"local": ThreadEngine, "process": ProcessEngine, "ray": RayEngine}


def engine_of(engine, workers=None, ray_address=None, transcoding: bool = False):
    """The `Engine` for pack's `engine=` argument: an Engine as it is, a name of `ENGINES`, or
    None — the default: "process" when transcoding (re-encoding keeps threads from scaling),
    else "local"."""
    if engine is not None and not isinstance(engine, str):
        return engine
    name = engine or ("process" if transcoding else "local")
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if name == "ray":
        return RayEngine(workers, ray_address)
    return ENGINES[name](workers)
