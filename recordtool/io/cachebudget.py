"""A cache folder's byte budget: what its shards and downloads hold (`used`), the least recently
used unpinned shards evicted for room (`_make_room`; a shard's last use is its lock file's mtime),
what readers hold pinned (`pinned`), and a download's blocks reserved before it starts
(`_preallocate`). All of it under the cache's lock (`_locked`), so the budget holds between
threads and processes alike. io/cache.py's `ShardCache` is the protocol built on it (its module
docstring gives the rules).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading

from .cachefolder import CacheFolder, held, let_go


class CacheBudget(CacheFolder):
    """A CacheFolder holding at most `limit` bytes of shards (`limit`: set by the subclass)."""

    limit: int

    def __init__(self, cache_dir: str, name: str):
        super().__init__(cache_dir, name)
        self._tlock = threading.Lock()  # flock does not exclude threads sharing one fd

    def _forked(self) -> None:
        """In a forked child: the thread lock made anew (a thread of the parent may have held
        it at the fork; that thread is not here to let go of it), and the lock file reopened."""
        self._tlock = threading.Lock()
        super()._forked()

    @contextlib.contextmanager
    def _locked(self):
        """The cache's lock (threads of this process and other processes alike)."""
        with self._tlock:
            fd = self._cache_lock_fd()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ accounting
    def used(self) -> int:
        """Bytes of shards and downloads in the folder now."""
        with self._locked():
            return sum(size for _, _, size, _ in self._entries())

    def _entries(self) -> list:
        """(mtime_ns, name, bytes, is_part) of the cache's own files in shards/; .part files
        whose download lock is free (their process died) are deleted on the way."""
        out = []
        for fname in os.listdir(self._shards):
            try:
                st = os.stat(fname, dir_fd=self._shards, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not self._mine(st, fname):
                continue
            part = fname.endswith(".part")
            if part:
                lock = self._file_lock(fname[:-len(".part")], wait=False)
                if lock is not None:  # nobody is downloading it: left by a dead process
                    self._unlink(self._shards, fname)
                    self._unlock(lock)
                    continue
            out.append((st.st_mtime_ns if part else self._last_use(fname, st), fname, st.st_size, part))
        return out

    def _make_room(self, need: int, protect) -> bool:
        """Evict least recently used, unpinned, unprotected shards until `need` more bytes fit.
        Called under the cache's lock."""
        entries = self._entries()
        used = sum(size for _, _, size, _ in entries)
        if used + need <= self.limit:
            return True
        for _, fname, size, part in sorted(entries):
            if part or fname in protect:
                continue
            fd = self._open_mine(self._shards, fname, os.path.join(self.shards_dir, fname))
            if fd is None:
                continue
            held(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # pinned: mapped by a reader
                let_go(fd)
                continue
            self._unlink(self._shards, fname)  # a name in our own folder: never anything outside it
            let_go(fd, unlock=True)
            used -= size
            if used + need <= self.limit:
                return True
        return False

    def pinned(self) -> int:
        """Bytes of shards some reader holds pinned now (for messages)."""
        total = 0
        with self._locked():
            for _, fname, size, part in self._entries():
                if part:
                    continue
                fd = self._open_mine(self._shards, fname, fname)
                if fd is None:
                    continue
                held(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    let_go(fd, unlock=True)
                except BlockingIOError:
                    let_go(fd)
                    total += size
        return total


def _preallocate(fd: int, size: int) -> None:
    """Reserve the blocks now (a full disk fails here, not mid-download); st_size is the full
    size at once, which is what the budget counts."""
    if not size:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)
