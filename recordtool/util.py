"""Small facts about the machine that several layers need (kept apart so that counting CPUs
does not import the decoder)."""
from __future__ import annotations

import os
import sys
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


def process_start(pid) -> str | None:
    """The start time of process `pid` (clock ticks after boot, from /proc: with the pid, it
    names one process), or None when there is none, it is a zombie (gone in all but name), or
    /proc does not say (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode()


def pid_namespace() -> str | None:
    """This process's pid namespace: a pid means something only within it (a /dev/shm or a
    $TMPDIR shared across containers holds the names of processes this one cannot see)."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def process_identity() -> tuple | None:
    """(pid namespace, pid, start time) of this process, as strings: what names it among every
    process this machine ran since boot — so a later process can tell whether the owner of
    something it left (a semaphore, a staging folder) still lives. None where /proc does not
    tell (not Linux): there, nothing is named after its owner and nothing is swept."""
    if not sys.platform.startswith("linux"):
        return None
    ns, start = pid_namespace(), process_start("self")
    return None if ns is None or start is None else (ns, str(os.getpid()), start)


def owner_gone(ns: str, pid: str, start: str) -> bool:
    """True when the process `process_identity` gave as (ns, pid, start) has ended: it lived in
    this pid namespace and its pid is now free or another process's. A name of another
    namespace is never called gone (its pids cannot be looked up here)."""
    me = process_identity()
    return me is not None and ns == me[0] and process_start(pid) != start
