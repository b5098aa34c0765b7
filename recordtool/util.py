"""Small facts about the machine that several layers need (kept apart so that counting CPUs
does not import the decoder)."""
from __future__ import annotations

import os
import threading
import weakref


def cores() -> int:
    """CPU cores this process may run on (its affinity mask: a rank pinned to 16 of 32 cores
    gets 16), the default thread count everywhere."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ForkLock:
    """A threading.Lock that a forked child gets unlocked. A fork copies a lock as it stands:
    held by one of the parent's threads (a Loader's producer compiling its op's lookup, mapping
    a shard, taking a decode pool) it stays held in the child, where that thread does not
    exist, and the child's first use of it never returns (a fork DataLoader worker, a
    multiprocessing 'fork' child). Every ForkLock is made anew in the child
    (`os.register_at_fork`); what it guarded is left as the parent's threads left it, so use
    it for state that is consistent between statements (caches, free lists, lazy maps)."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self):
        self._lock = threading.Lock()
        _fork_locks.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


_fork_locks: "weakref.WeakSet[ForkLock]" = weakref.WeakSet()


def _renew_fork_locks() -> None:
    for lock in list(_fork_locks):
        lock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_fork_locks)
