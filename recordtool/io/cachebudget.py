"""A cache folder's byte budget: what its shards and downloads hold (`used`), the least recently
used unpinned shards evicted for room (`make_room`; a shard's last use is its lock file's mtime),
what readers hold pinned (`pinned`), and a download's blocks reserved before it starts
(`_preallocate`). All of it under the cache folder's lock (`CacheFolder.locked`), so the budget
holds between threads and processes alike. io/cache.py's `ShardCache` is the protocol that uses
it, with its folder (its module docstring gives the rules).
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil

from .cachefolder import CacheFolder, held, let_go


class CacheBudget:
    """The byte budget of one cache folder: its shard and .part files hold at most `limit`
    bytes, counted and evicted under the folder's lock.

    Invariant: a download reserves its bytes (`make_room`, then `_preallocate`) under the
    folder's lock, so what the files hold stays within `limit` between threads and processes
    alike; a pinned shard (a reader's shared flock) is never evicted.

    Args:
        folder: the CacheFolder whose files it counts.
        limit: bytes of shards (complete and downloading) the folder may hold; None: `total`,
            or 80 % of the free disk space plus what is cached already, when that is less.
        total: the dataset's shard bytes (for the default limit).
    """

    def __init__(self, folder: CacheFolder, limit: int | None = None, total: int = 0):
        self.folder = folder
        if limit is None:
            limit = min(total, int(0.8 * shutil.disk_usage(folder.shards_dir).free) + self.used())
        self.limit = int(limit)

    # ------------------------------------------------------------------ accounting
    def used(self) -> int:
        """Bytes of shards and downloads in the folder now."""
        with self.folder.locked():
            return sum(size for _, _, size, _ in self.entries())

    def entries(self) -> list:
        """(mtime_ns, name, bytes, is_part) of the cache's own files in shards/; .part files
        whose download lock is free (their process died) are deleted on the way."""
        out = []
        for fname in os.listdir(self.folder.shards_fd):
            try:
                st = os.stat(fname, dir_fd=self.folder.shards_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not self.folder.mine(st, fname):
                continue
            part = fname.endswith(".part")
            if part:
                lock = self.folder.file_lock(fname[:-len(".part")], wait=False)
                if lock is not None:  # nobody is downloading it: left by a dead process
                    self.folder.unlink(self.folder.shards_fd, fname)
                    self.folder.unlock(lock)
                    continue
            out.append((st.st_mtime_ns if part else self.folder.last_use(fname, st), fname, st.st_size, part))
        return out

    def make_room(self, need: int, protect) -> bool:
        """Evict least recently used, unpinned, unprotected shards until `need` more bytes fit.
        Called under the cache's lock."""
        entries = self.entries()
        used = sum(size for _, _, size, _ in entries)
        if used + need <= self.limit:
            return True
        for _, fname, size, part in sorted(entries):
            if part or fname in protect:
                continue
            fd = self.folder.open_mine(self.folder.shards_fd, fname, os.path.join(self.folder.shards_dir, fname))
            if fd is None:
                continue
            held(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # pinned: mapped by a reader
                let_go(fd)
                continue
            self.folder.unlink(self.folder.shards_fd, fname)  # a name in our own folder: never anything outside it
            let_go(fd, unlock=True)
            used -= size
            if used + need <= self.limit:
                return True
        return False

    def pinned(self) -> int:
        """Bytes of shards some reader holds pinned now (for messages)."""
        total = 0
        with self.folder.locked():
            for _, fname, size, part in self.entries():
                if part:
                    continue
                fd = self.folder.open_mine(self.folder.shards_fd, fname, fname)
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
