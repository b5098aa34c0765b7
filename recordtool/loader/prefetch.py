"""Ordered prefetch on producer threads: task j is made by producer j % P, results come out in
task order, an exception in a producer is raised in the consumer with its traceback.

Producer threads hold no reference to the Prefetcher, so an abandoned one is garbage-collected
and its `__del__` stops them. Every live Prefetcher is also closed at interpreter exit, before
finalization: a producer thread still inside native code when the interpreter tears down
would otherwise be killed mid-call (std::terminate, SIGABRT — "terminate called without an
active exception").
"""
from __future__ import annotations

import atexit
import itertools
import queue
import threading
import weakref


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


_LIVE: "weakref.WeakSet[Prefetcher]" = weakref.WeakSet()
_THIS = threading.local()  # .producer: set on producer threads


def on_producer_thread() -> bool:
    """Is the caller a producer thread of some Prefetcher (where a garbage collection may run
    an owner's __del__)?"""
    return getattr(_THIS, "producer", False)


def _close_all() -> None:
    for p in list(_LIVE):
        p.close()


atexit.register(_close_all)


def _produce(k: int, tasks: int | None, producers: int, make, out: queue.Queue, stop: threading.Event) -> None:
    def put(item) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    _THIS.producer = True
    try:
        for j in (itertools.count(k, producers) if tasks is None else range(k, tasks, producers)):
            if stop.is_set():
                return
            if not put(make(j, k)):
                return
    except BaseException as e:  # surfaces in the consumer, with its traceback
        put(_Failure(e))


class Prefetcher:
    """Iterate make(j, slot) for j in range(tasks), in order, made ahead on producer threads.

    Args:
        tasks: number of items; None: no end (the producers stop at close()).
        make: make(j, slot) → item; slot (0..producers-1) is the producer's id, so per-producer
            state (a GPU decoder, scratch buffers) is indexed by it — never shared.
        producers: threads; task j runs on producer j % producers.
        depth: items each producer may have made ahead (its queue's size).
        name: thread name.
    """

    def __init__(self, tasks: int | None, make, producers: int = 1, depth: int = 2, name: str = "recordtool-loader",
                 start: bool = True):
        self.tasks = None if tasks is None else int(tasks)
        self.producers = max(1, int(producers) if tasks is None else min(int(producers), max(1, self.tasks)))
        self._queues = [queue.Queue(maxsize=max(1, int(depth))) for _ in range(self.producers)]
        self._stop = threading.Event()
        self._next = 0
        self._threads = [threading.Thread(target=_produce, name=name, daemon=True,
                                          args=(k, self.tasks, self.producers, make, self._queues[k], self._stop))
                         for k in range(self.producers)]
        _LIVE.add(self)
        # atexit runs the last registered first: registered again now, the producers stop before
        # any exit handler registered since (CuPy's, torch's, the user's) tears down what they use
        atexit.unregister(_close_all)
        atexit.register(_close_all)
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        """Start the producers (once; not after close): with start=False the owner first keeps
        a reference where a producer's own call (a collection running its owner's __del__) can
        find it to stop it."""
        if self._started or self._stop.is_set():
            return
        self._started = True
        for t in self._threads:
            t.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self.tasks is not None and self._next >= self.tasks:
            self.close()
            raise StopIteration
        k = self._next % self.producers
        q, t = self._queues[k], self._threads[k]
        while True:
            try:
                item = q.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():
                    raise StopIteration from None
                if not t.is_alive() and q.empty():
                    self.close()
                    raise RuntimeError(f"recordtool: producer thread {k} ended without a result")
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        self._next += 1
        return item

    @property
    def done(self) -> int:
        """Items handed out so far."""
        return self._next

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def owns_current_thread(self) -> bool:
        """Is the caller one of this Prefetcher's producers (a garbage collection can run an
        owner's __del__ there)?"""
        return threading.current_thread() in self._threads

    def close(self, timeout: float = 60.0) -> None:
        """Stop the producers and wait for them (a producer finishes the item it is making).
        Called on one of the producers (a collection running an owner's __del__ there) it only
        stops them: that thread may hold a lock the others wait for, so joining could stall."""
        self._stop.set()
        self._drain()  # wakes producers blocked on a full queue: each may still queue what it holds
        if not self.owns_current_thread():
            for t in self._threads:
                if t.is_alive():
                    t.join(timeout)
            self._drain()  # what they queued after the first drain (a ring slot each, held while we live)
        _LIVE.discard(self)

    def _drain(self) -> None:
        for q in self._queues:
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
