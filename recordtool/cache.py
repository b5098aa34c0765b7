"""A bounded local cache of one remote dataset's files, shared by every process on the machine.

Layout of `cache_dir/<key>/` (key: a hash of the dataset URL and its last path component):

    shards/<name>.<crc32c>        complete shards, checked against the manifest's size and CRC32C
    shards/<name>.<crc32c>.part   a download in progress, preallocated to its full size
    meta/<name>.<crc32c>          the index (small; not counted, replaced when the dataset changes)
    locks/<name>.<crc32c>         one lock file per cached file
    .lock                         the cache's lock: accounting, eviction and pinning happen under it

Rules (all through fcntl.flock, so they hold between threads and processes alike, and a
process that dies lets go of everything it held):
- One download per file: the downloader holds the file's lock; whoever else wants the file
  waits on that lock, then finds the complete file.
- Nothing half-downloaded is used: bytes go to the .part file, which is renamed into place only
  after its size and CRC32C match the manifest; a .part left by a dead process is deleted.
- Pinned files are never evicted: a reader keeps a shared flock on the open shard file for as
  long as it maps it; eviction deletes a file only after taking an exclusive flock without waiting.
- Budget: shard files and .part files together stay within `limit` bytes. Before a download
  reserves its size (fallocate), least recently used unpinned shards are deleted; a shard's
  modification time is its last use (set each time it is pinned).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import threading
import time

from . import fs as _fs
from .errors import CacheFull, FormatError
from .format import files

ROOM_WAIT = 120.0  # seconds a download waits for pinned shards to be let go before CacheFull
_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def default_dir() -> str:
    """$RECORDTOOL_CACHE_DIR, else $XDG_CACHE_HOME/recordtool, else ~/.cache/recordtool."""
    if os.environ.get("RECORDTOOL_CACHE_DIR"):
        return os.environ["RECORDTOOL_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "recordtool")


def key(url: str) -> str:
    """The cache folder name of a dataset URL: a hash (distinct URLs never share files) plus the
    URL's last component, cleaned, for people looking at the folder."""
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "dataset"
    return f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{tail}"


class ShardCache:
    """The cache folder of one remote dataset (see the module docstring).

    Args:
        fs: the dataset's FileSystem (recordtool.fs).
        root: the dataset's path in `fs`.
        directory: this dataset's cache folder (created).
        limit: bytes of shards (complete and downloading) the folder may hold.
        retry: how downloads are retried (recordtool.fs.Retry).
    """

    def __init__(self, fs, root: str, directory: str, limit: int, retry: _fs.Retry):
        self.fs, self.root, self.dir, self.limit, self.retry = fs, root, directory, int(limit), retry
        self.shards_dir = os.path.join(directory, "shards")
        self.meta_dir = os.path.join(directory, "meta")
        self.locks_dir = os.path.join(directory, "locks")
        for d in (self.shards_dir, self.meta_dir, self.locks_dir):
            os.makedirs(d, exist_ok=True)
        self._lock_fd = os.open(os.path.join(directory, ".lock"), _FLAGS, 0o644)
        self._tlock = threading.Lock()  # flock does not exclude threads sharing one fd
        self.closed = threading.Event()

    # ------------------------------------------------------------------ names and locks
    @staticmethod
    def file_name(name: str, crc: str) -> str:
        return f"{files.plain_name(name, 'shard name')}.{crc}"

    def path(self, name: str, crc: str) -> str:
        return os.path.join(self.shards_dir, self.file_name(name, crc))

    def url(self, name: str) -> str:
        return self.fs.url(self.fs.join(self.root, name))

    @contextlib.contextmanager
    def _locked(self):
        """The cache's lock (threads of this process and other processes alike)."""
        with self._tlock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _file_lock(self, fname: str, wait: bool):
        """An fd holding the exclusive download lock of one file, or None when `wait` is False
        and someone else holds it."""
        fd = os.open(os.path.join(self.locks_dir, fname), _FLAGS, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ------------------------------------------------------------------ accounting
    def used(self) -> int:
        """Bytes of shards and downloads in the folder now."""
        with self._locked():
            return sum(size for _, _, size, _ in self._entries())

    def _entries(self) -> list:
        """(mtime_ns, name, bytes, is_part) of the shards folder's regular files; .part files
        whose download lock is free (their process died) are deleted on the way."""
        out = []
        with os.scandir(self.shards_dir) as it:
            for e in it:
                if not e.is_file(follow_symlinks=False):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                part = e.name.endswith(".part")
                if part:
                    lock = self._file_lock(e.name[:-len(".part")], wait=False)
                    if lock is not None:  # nobody is downloading it: left by a dead process
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(e.path)
                        os.close(lock)
                        continue
                out.append((st.st_mtime_ns, e.name, st.st_size, part))
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
            path = os.path.join(self.shards_dir, fname)
            try:
                fd = files.open_regular(path)
            except (FileNotFoundError, files.UnsafePath):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # pinned: mapped by a reader
                os.close(fd)
                continue
            os.unlink(path)
            os.close(fd)
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
                try:
                    fd = files.open_regular(os.path.join(self.shards_dir, fname))
                except (FileNotFoundError, files.UnsafePath):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    total += size
                os.close(fd)
        return total

    # ------------------------------------------------------------------ reading
    def pin(self, name: str, size: int, crc: str):
        """A read-only fd of the complete shard holding a shared lock (pinned: not evicted until
        the fd is closed), or None if the shard is not in the cache."""
        path = self.path(name, crc)
        with self._locked():
            try:
                fd = files.open_regular(path)
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                if os.fstat(fd).st_size != size:  # not ours to trust: drop it, fetch again
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(path)
                    os.close(fd)
                    return None
                os.utime(fd)  # last use, for LRU eviction
            except BlockingIOError:
                os.close(fd)
                return None
            return fd

    def fetch(self, name: str, size: int, crc: str, wait: bool = True, protect=None, release=None,
              strict: bool = False, patience: float | None = None) -> bool:
        """Make sure the shard is in the cache, downloading it if needed.

        Args:
            name, size, crc: the shard's manifest entry.
            wait: wait for another thread or process downloading it (False: return False).
            protect: a callable giving cache file names (`file_name`) to keep: evicted for room
                only when nothing else can go and `strict` is False.
            release: called when room is short, to let go of pins the caller can spare.
            strict: never evict protected files (a download ahead waits instead).
            patience: seconds to wait for room before CacheFull (default ROOM_WAIT).
        Returns:
            True when the shard is complete in the cache.
        """
        fname = self.file_name(name, crc)
        final = os.path.join(self.shards_dir, fname)
        if os.path.isfile(final):
            return True
        if size > self.limit:
            raise CacheFull(f"{self.url(name)}: {size} bytes do not fit in cache_limit={self.limit}; raise "
                            f"cache_limit to at least a few shards")
        lock = self._file_lock(fname, wait)
        if lock is None:
            return False
        try:
            if os.path.isfile(final):  # another process finished it while we waited
                return True
            part = final + ".part"
            fd = self._reserve(part, size, protect, release, strict, ROOM_WAIT if patience is None else patience, name)
            self._download(fd, part, final, name, size, crc)
            return True
        finally:
            os.close(lock)

    def _reserve(self, part: str, size: int, protect, release, strict: bool, patience: float, name: str) -> int:
        """Room for `size` more bytes, then the .part file created and preallocated (under the
        cache's lock, so the budget holds between processes). Tries: sparing protected files;
        again after `release()`; then (not strict) letting protected files go; then waits."""
        deadline = time.monotonic() + patience
        while True:
            for attempt in range(2):
                keep = protect() if protect is not None else ()
                with self._locked():
                    if self._make_room(size, keep) or (attempt and not strict and self._make_room(size, ())):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(part)  # ours: we hold its download lock
                        fd = files.create_exclusive(part)
                        try:
                            _preallocate(fd, size)
                        except OSError as e:
                            os.close(fd)
                            os.unlink(part)
                            if e.errno == errno.ENOSPC:
                                raise CacheFull(f"{self.dir}: no space left on the disk for {self.url(name)} "
                                                f"({size} bytes); lower cache_limit or free space") from None
                            raise
                        return fd
                if attempt == 0 and release is not None:
                    release()  # the caller unmaps what it does not use, then we try again at once
            if self.closed.is_set():
                raise _fs.Cancelled(f"{self.url(name)}: cache closed")
            if time.monotonic() > deadline:
                raise CacheFull(f"{self.url(name)}: no room for {size} bytes in cache_limit={self.limit} "
                                f"after {patience:.0f} s: {self.pinned()} bytes of shards are in use "
                                f"(mapped by readers); raise cache_limit or lower block_shards")
            time.sleep(0.2 if strict else 0.05)

    def _download(self, fd: int, part: str, final: str, name: str, size: int, crc: str) -> None:
        url = self.url(name)
        src = self.fs.join(self.root, name)
        try:
            try:
                self.retry.call(lambda: _fs.copy_into(self.fs, src, fd, size, crc, stop=self.closed.is_set), url)
            except FileNotFoundError:
                raise FormatError(f"{url}: missing on object storage (the dataset's manifest lists it)") from None
            os.close(fd)
            fd = None
            os.replace(part, final)  # complete and checked: only now does it get its name
            os.utime(final)
        except BaseException:
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            raise

    # ------------------------------------------------------------------ meta files
    def meta(self, name: str, size: int, crc: str) -> str:
        """Local path of a checked copy of a small dataset file (the index), downloaded once;
        older versions of it (a re-packed dataset) are deleted."""
        fname = self.file_name(name, crc)
        final = os.path.join(self.meta_dir, fname)
        if not os.path.isfile(final):
            lock = self._file_lock("meta-" + fname, wait=True)
            try:
                if not os.path.isfile(final):
                    free = shutil.disk_usage(self.meta_dir).free
                    if size > free:  # the manifest says how big: refuse before filling the disk
                        raise CacheFull(f"{self.url(name)}: {size} bytes, the disk of {self.dir} has {free} free")
                    part = final + ".part"
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(part)
                    self._download(files.create_exclusive(part), part, final, name, size, crc)
            finally:
                os.close(lock)
        for other in os.listdir(self.meta_dir):  # mapped copies stay valid for who maps them
            if other.startswith(name + ".") and other != fname and not other.endswith(".part"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.meta_dir, other))
        return final

    def close(self) -> None:
        """Stop downloads in progress (they raise Cancelled) and release the cache's lock file."""
        self.closed.set()
        with self._tlock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


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
