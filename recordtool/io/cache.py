"""A bounded local cache of one remote dataset's files, shared by every process on the machine.

Layout of `cache_dir/<key>/` (key: a hash of the store — its protocol and endpoint, see
`FsspecFS.store_id` — and the dataset URL, plus the URL's last path component):

    shards/<name>.<crc32c>        complete shards, checked against the manifest's size and digest
    shards/<name>.<crc32c>.part   a download in progress, preallocated to its full size
    meta/<name>.<crc32c>          the index (small; not counted, replaced when the dataset changes)
    locks/<name>.<crc32c>         one lock file per cached file, holding the identity the cache
                                  saw the file with (inode, size, mtime, ctime); its mtime is the
                                  file's last use
    .lock                         the cache's lock: accounting, eviction and pinning happen under it

(A name whose `<name>.<crc32c>` would not fit a file name is shortened and hashed: `file_name`.)

The folder is untrusted, as a dataset is:
- Its folders are opened one component at a time below `cache_dir`, without following links,
  and must be this user's (io.files.open_dir); every file is reached through those folder fds.
  A planted link anywhere below `cache_dir` is an UnsafePath error, never followed.
- Only files the cache names (`<name>.<8 hex>[.part]`), regular, this user's, with one link,
  are counted or deleted; anything else in the folder is left alone. Lock files pass the same
  checks before the cache writes its identity stamp into one.
- What is served is checked against the store's manifest, which the folder cannot change.
  When the manifest gives a file's SHA-256 (`sha256`, written by pack), a download is checked
  against it as it arrives, and a cached shard again each time it is taken into use (pinned):
  hashed after it is opened, before it is mapped — nothing on disk (a stamp, a date) is
  trusted in place of the digest. The index is read into memory and checked there, so what
  was checked is what is used. A copy that does not match is dropped (named in a warning and
  in `dropped`) and downloaded again. A pin returns the identity (inode, size, mtime, ctime)
  the copy had when it was checked, and a copy written while it was checked is dropped: a
  cached file is never written after its download (its last use is its lock file's mtime),
  so its reader compares that identity with the mapped file's before each record it serves
  and pins it again — checked anew — when it differs (recordtool.remote).
  Manifests without `sha256` (written before it existed) are checked as before: size and
  CRC32C, the shard's CRC32C computed again only when its identity differs from the one
  recorded at its download or last check. A CRC can be forged by whoever can write the
  folder; a SHA-256 cannot.

Rules (all through fcntl.flock, so they hold between threads and processes alike, and a
process that dies lets go of everything it held):
- One download per file: the downloader holds the file's lock; whoever else wants the file
  waits on that lock, then finds the complete file. The lock is held while downloading, never
  while waiting for room: a download that finds no room lets go of the lock while it waits,
  so a reader that needs the file now (and holds pins only it can let go) takes the lock and
  makes room itself, instead of waiting on a download that waits on the reader.
- Nothing half-downloaded is used: bytes go to the .part file, which is renamed into place only
  after its size and digest match the manifest; a .part left by a dead process is deleted. A
  .part deleted or replaced by another program during the download is noticed before the
  rename, and downloaded again (CacheChanged naming it when that keeps happening).
- Pinned files are never evicted: a reader keeps a shared flock on the open shard file for as
  long as it maps it; eviction deletes a file only after taking an exclusive flock without waiting.
- Budget: shard files and .part files together stay within `limit` bytes. Before a download
  reserves its size (fallocate), least recently used unpinned shards are deleted; a shard's
  last use is its lock file's modification time (set each time it is pinned).
- Fork: a forked child never holds or ends its parent's locks (io/cachefolder.py).
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
import warnings

import crc32c

from ..errors import CacheChanged, CacheFull, Cancelled, FormatError
from . import files
from .cachebudget import CacheBudget, _preallocate
from .cachefolder import (CacheFolder, _ident, crc_of, default_dir, file_name, handed, held, identity,  # noqa: F401
                          key, let_go, read_all, sha256_of, touch)
from .transfer import Retry, download_into

ROOM_WAIT = 120.0  # seconds a download waits for pinned shards to be let go before CacheFull
LOST_TRIES = 3  # downloads whose .part another program deleted, before CacheChanged


class ShardCache:
    """The cache folder of one remote dataset (see the module docstring): the protocol —
    checked downloads, pins, room reserved before a download — over a `CacheFolder` (`folder`:
    the folder's fds, its files' names, stamps and locks) and a `CacheBudget` (`budget`: the
    bytes its files may hold).

    Invariant: what it serves matches the manifest (size and digest, checked when downloaded
    and again when pinned); its files stay within `limit` bytes.

    Args:
        fs: the dataset's FileSystem (recordtool.io.fs).
        root: the dataset's path in `fs`.
        cache_dir: the folder holding every dataset's cache folder (the user's choice; this
            dataset's folder inside it is created).
        retry: how downloads are retried (recordtool.io.Retry).
        limit: bytes of shards (complete and downloading) the folder may hold; None: `total`,
            or 80 % of the free disk space plus what is cached already, when that is less.
        total: the dataset's shard bytes (for the default limit).
    """

    def __init__(self, fs, root: str, cache_dir: str, retry: Retry, limit: int | None = None, total: int = 0):
        self.fs, self.root, self.retry = fs, root, retry
        self.folder = CacheFolder(cache_dir, key(fs.url(root), fs.store_id()))
        self.dir, self.shards_dir = self.folder.dir, self.folder.shards_dir
        self.meta_dir, self.locks_dir = self.folder.meta_dir, self.folder.locks_dir
        self.dropped: list = []  # messages naming cached copies found bad (and deleted)
        self.advice = "raise cache_limit"  # what a CacheFull message suggests (the dataset knows more)
        self.closed = threading.Event()
        self.budget = CacheBudget(self.folder, limit, total)

    @property
    def limit(self) -> int:
        """Bytes of shards (complete and downloading) the folder may hold."""
        return self.budget.limit

    def used(self) -> int:
        """Bytes of shards and downloads in the folder now."""
        return self.budget.used()

    def pinned(self) -> int:
        """Bytes of shards some reader holds pinned now (for messages)."""
        return self.budget.pinned()

    def _locked(self):
        """The cache's lock (the folder's)."""
        return self.folder.locked()

    # ------------------------------------------------------------------ names
    file_name = staticmethod(file_name)

    def path(self, name: str, crc: str) -> str:
        return os.path.join(self.shards_dir, file_name(name, crc))

    def url(self, name: str) -> str:
        return self.fs.url(self.fs.join(self.root, name))

    # ------------------------------------------------------------------ checking what is served
    def _bad(self, fd: int, fname: str, st, size: int, crc: str) -> str | None:
        """Why the open cached file `fd` (stat `st`) must not be served, or None, for a manifest
        without SHA-256: its size, and its CRC32C when the file is not the one recorded at its
        download or last check (which then records it)."""
        if st.st_size != size:
            return f"{st.st_size} bytes, the manifest says {size}"
        if self.folder.stamp(fname) != _ident(st):
            got = crc_of(fd, size)
            if got != crc:
                return f"CRC32C {got} differs from the manifest's {crc}"
            self.folder.stamp(fname, st)
        return None

    def _drop(self, dir_fd: int, fname: str, where: str, why: str) -> None:
        """Delete a bad cached copy (our name in our folder) and say so."""
        self.folder.unlink(dir_fd, fname)
        msg = (f"{where}: cached copy changed after its download ({why}): dropped, the next read downloads it "
               f"again (the object store's copy is checked then)")
        self.dropped.append(msg)
        warnings.warn(f"recordtool: {msg}", RuntimeWarning, stacklevel=4)

    def drop(self, name: str, crc: str, why: str) -> str:
        """Delete the cached copy of a shard found bad by its reader (recordtool verify); the
        message naming it."""
        fname = file_name(name, crc)
        with self._locked():
            self._drop(self.folder.shards_fd, fname, os.path.join(self.shards_dir, fname), why)
        return self.dropped[-1]

    # ------------------------------------------------------------------ reading
    def pin(self, name: str, size: int, crc: str, sha256: str | None = None):
        """(fd, identity) of the complete, checked shard: a read-only fd holding a shared lock
        (pinned: not evicted until the fd is closed) and the file's identity (inode, size,
        mtime, ctime) as it was checked, which its reader compares with the file's before
        serving from it; None if the shard is not in the cache (or its copy was bad, or was
        written while it was checked, and has been dropped).

        With `sha256` (the manifest's digest) the copy is hashed each time, outside the cache's
        lock (the shared lock keeps it from eviction meanwhile); without, it is checked by
        identity and CRC32C (see the module docstring)."""
        fname = file_name(name, crc)
        where = os.path.join(self.shards_dir, fname)
        with self._locked():
            try:
                fd = held(files.open_regular_at(self.folder.shards_fd, fname, where))
            except FileNotFoundError:
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # being evicted right now
                let_go(fd)
                return None
            try:
                st = os.fstat(fd)
                if sha256 is None:
                    why = self._bad(fd, fname, st, size, crc) or _written(fd, st)
                else:
                    why = None if st.st_size == size else f"{st.st_size} bytes, the manifest says {size}"
                if why is not None:
                    let_go(fd, unlock=True)
                    fd = None
                    self._drop(self.folder.shards_fd, fname, where, why)
                    return None
                if sha256 is None:
                    self.folder.mark_used(fname)
                    return handed(fd), _ident(st)
            except BaseException:
                if fd is not None:
                    let_go(fd, unlock=True)
                raise
        try:
            got = sha256_of(fd, size)
            why = None if got == sha256 else \
                "cut short while it was checked" if got is None else \
                f"SHA-256 {got[:16]}… differs from the manifest's {sha256[:16]}…"
            why = why or _written(fd, st)
            if why is None:
                with self._locked():
                    self.folder.mark_used(fname)
                return handed(fd), _ident(st)
        except BaseException:
            let_go(fd, unlock=True)
            raise
        let_go(fd, unlock=True)
        with self._locked():  # the copy we hashed, not one put at its name since
            with contextlib.suppress(FileNotFoundError):
                now = os.stat(fname, dir_fd=self.folder.shards_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    self._drop(self.folder.shards_fd, fname, where, why)
        return None

    def fetch(self, name: str, size: int, crc: str, wait: bool = True, protect=None, release=None,
              strict: bool = False, patience: float | None = None, sha256: str | None = None) -> bool:
        """Make sure the shard is in the cache, downloading it if needed.

        Args:
            name, size, crc: the shard's manifest entry.
            wait: wait for another thread or process downloading it (False: return False).
            protect: a callable giving cache file names (`file_name`) to keep: evicted for room
                only when nothing else can go and `strict` is False.
            release: called when room is short, to let go of pins the caller can spare.
            strict: never evict protected files (a download ahead waits instead).
            patience: seconds to wait for room before CacheFull (default ROOM_WAIT).
            sha256: the manifest's digest of the shard, checked as it arrives (when given).
        Returns:
            True when the shard is complete in the cache.
        """
        fname = file_name(name, crc)
        where = os.path.join(self.shards_dir, fname)
        if self.folder.present(self.folder.shards_fd, fname, where):
            return True
        if size > self.limit:
            raise CacheFull(f"{self.url(name)}: {size} bytes do not fit in cache_limit={self.limit}; raise "
                            f"cache_limit to at least a few shards")
        patience = ROOM_WAIT if patience is None else patience
        deadline = time.monotonic() + patience
        lost = 0
        while True:
            lock = self.folder.file_lock(fname, wait)
            if lock is None:  # (wait=False) someone else is downloading it, or waiting to
                return False
            try:
                if self.folder.present(self.folder.shards_fd, fname, where):  # another process finished it while we waited
                    return True
                fd = self._reserve(fname + ".part", size, protect, release, strict, name)
                if fd is not None:
                    if self._download(self.folder.shards_fd, fd, fname, name, size, crc, sha256):
                        return True
                    lost += 1
                    if lost >= LOST_TRIES:
                        raise CacheChanged(f"{where}.part: deleted or replaced by another program while it was being "
                                           f"downloaded, {lost} times in a row; is a cache cleaner running on "
                                           f"{self.dir}?")
                    continue  # download it again at once
            finally:
                self.folder.unlock(lock)
            # no room now: wait with the download lock let go (see the module docstring)
            if self.closed.is_set():
                raise Cancelled(f"{self.url(name)}: cache closed")
            if time.monotonic() > deadline:
                raise CacheFull(f"{self.url(name)}: no room for {size} bytes in cache_limit={self.limit} "
                                f"after {patience:.0f} s: {self.pinned()} bytes of shards are in use "
                                f"(mapped by readers); {self.advice}")
            time.sleep(0.2 if strict else 0.05)

    def _reserve(self, part: str, size: int, protect, release, strict: bool, name: str):
        """Room for `size` more bytes, then the .part file created and preallocated (under the
        cache's lock, so the budget holds between processes); None when there is no room now.
        Tries: sparing protected files; again after `release()`; then (not strict) letting
        protected files go."""
        for attempt in range(2):
            keep = protect() if protect is not None else ()
            with self._locked():
                if self.budget.make_room(size, keep) or (attempt and not strict and self.budget.make_room(size, ())):
                    fd = self.folder.new_part(self.folder.shards_fd, part)
                    try:
                        _preallocate(fd, size)
                    except OSError as e:
                        os.close(fd)
                        self.folder.unlink(self.folder.shards_fd, part)
                        if e.errno == errno.ENOSPC:
                            raise CacheFull(f"{self.dir}: no space left on the disk for {self.url(name)} "
                                            f"({size} bytes); lower cache_limit or free space") from None
                        raise
                    return fd
            if attempt == 0 and release is not None:
                release()  # the caller unmaps what it does not use, then we try again at once
        return None

    def _download(self, dir_fd: int, fd: int, fname: str, name: str, size: int, crc: str,
                  sha256: str | None = None) -> bool:
        """Fill the .part file `fd`, then give it its name and record its identity. False when
        the .part at its name is no longer `fd`'s file (another program deleted or replaced it
        during the download): nothing is renamed then."""
        part = fname + ".part"
        mine = os.fstat(fd)
        try:
            try:
                download_into(self.fs, self.fs.join(self.root, name), fd, size, self.retry, crc,
                              stop=self.closed.is_set, sha256=sha256)
            except FileNotFoundError:
                raise FormatError(f"{self.url(name)}: missing on object storage (the dataset's manifest lists "
                                  f"it)") from None
            with self._locked():  # named and stamped at once: a pin sees both or neither
                try:
                    st = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    return False
                if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino):
                    return False
                os.replace(part, fname, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # complete and checked
                self.folder.stamp(fname, touch(fd))
            return True
        except BaseException:
            with contextlib.suppress(OSError):
                st = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                    self.folder.unlink(dir_fd, part)
            raise
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ meta files
    def meta(self, name: str, size: int, crc: str, sha256: str | None = None) -> tuple:
        """(bytes, path) of a checked copy of a small dataset file (the index), downloaded once,
        then read into memory and checked each time it is opened — against `sha256` when the
        manifest gives it, else its CRC32C (a bad copy is dropped and fetched again); older
        versions of it (a re-packed dataset) are deleted."""
        fname = file_name(name, crc)
        where = os.path.join(self.meta_dir, fname)
        for _ in range(3):
            try:  # something not ours at our name (a hard link, another user's file) is an error naming it
                fd = files.open_regular_at(self.folder.meta_fd, fname, where)
            except FileNotFoundError:
                fd = None
            if fd is not None:
                try:
                    data, why = _read_checked(fd, size, crc, sha256)
                finally:
                    os.close(fd)
                if why is None:
                    self._drop_old(name, fname)
                    return data, where
                with self._locked():
                    self._drop(self.folder.meta_fd, fname, where, why)
                continue
            lock = self.folder.file_lock("meta-" + fname, wait=True)
            try:
                if not self.folder.present(self.folder.meta_fd, fname, where):
                    free = shutil.disk_usage(self.meta_dir).free  # (a number only: the folder was checked)
                    if size > free:  # the manifest says how big: refuse before filling the disk
                        raise CacheFull(f"{self.url(name)}: {size} bytes, the disk of {self.dir} has {free} free")
                    self._download(self.folder.meta_fd, self.folder.new_part(self.folder.meta_fd, fname + ".part"), fname, name, size, crc,
                                   sha256)  # (False: its .part was deleted meanwhile; the next round sees)
            finally:
                self.folder.unlock(lock)
        raise CacheFull(f"{where}: changed again each time after its download; is another program writing there?")

    def _drop_old(self, name: str, fname: str) -> None:
        """Delete older versions of a meta file (mapped copies stay valid for who maps them)."""
        stem = file_name(name, "00000000")[:-9]
        for other in os.listdir(self.folder.meta_fd):
            if other != fname and other.startswith(stem + ".") and re.fullmatch(r"\.[0-9a-f]{8}", other[len(stem):]):
                with contextlib.suppress(FileNotFoundError, OSError):
                    st = os.stat(other, dir_fd=self.folder.meta_fd, follow_symlinks=False)
                    if self.folder.mine(st, other):
                        self.folder.unlink(self.folder.meta_fd, other)

    def close(self) -> None:
        """Stop downloads in progress (they raise Cancelled); the folders are let go with the object."""
        self.closed.set()


def _written(fd: int, st) -> str | None:
    """Why a cached file checked from its stat `st` on must not be served: written meanwhile
    (its identity changed), or None."""
    return None if identity(fd) == _ident(st) else "written by another program while it was checked"


def _read_checked(fd: int, size: int, crc: str, sha256: str | None) -> tuple:
    """(bytes, None) of a cached meta file read into memory and matching the manifest, or
    (None, why not)."""
    st = os.fstat(fd)
    if st.st_size != size:
        return None, f"{st.st_size} bytes, the manifest says {size}"
    data = read_all(fd, size)
    if data is None:
        return None, "cut short while it was read"
    if sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            return None, f"SHA-256 {got[:16]}… differs from the manifest's {sha256[:16]}…"
    else:
        got = f"{crc32c.crc32c(data) if size else 0:08x}"
        if got != crc:
            return None, f"CRC32C {got} differs from the manifest's {crc}"
    return data, None
