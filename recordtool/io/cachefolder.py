"""One remote dataset's cache folder on disk: its folders opened safely, the names of its files,
the identity recorded for each, and which files are the cache's own (see io/cache.py for the
protocol that uses them).

`cache_dir` (the user's choice, followed if it is a link) holds a folder per dataset,
`<key>/` with `shards/`, `meta/`, `locks/` and `.lock`. Each is opened one component at a time
relative to its parent's fd, without following links, and must be the user's
(io.files.open_dir); every file is then reached through those fds. The cache's own files
are named `<name>.<crc32c>[.part]`, regular, the user's, with one link (`_mine`): nothing
else is counted or deleted. Lock files (`locks/<name>.<crc32c>`, `.lock`) are written to (the
identity stamp), so they pass the same checks before any byte goes into one: a hard link
planted there to a file elsewhere is refused, never written through. `cache_dir` itself must
be the user's (or root's, as /tmp is) and not writable by everyone: another user's folder is a
ConfigError naming it.

A cached file is never written after its download: its last use (for LRU eviction) is the
mtime of its lock file, so a change of the file's identity means another program wrote it.

Across fork (a DataLoader worker, multiprocessing's 'fork'): an flock belongs to the open
file, which a forked child shares with its parent — the child would enter the cache's lock
while the parent holds it, and its unlock would end the parent's hold. So a child closes its
copies of the cache's `.lock` (`_forked`; the next use opens its own) and of every lock an
operation in progress held at the fork (`_HELD`: download locks, pins being checked), which
the parent's threads that held them are not there to let go of; locks are let go of by an
explicit unlock, which ends them even where a child still has a copy.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import re
import stat
import struct
import threading
import time
import weakref

from ..errors import ConfigError, UnsafePath
from . import files

NAME_BUDGET = 240  # bytes of a cached file's name (room for ".part" and "meta-" within NAME_MAX)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
_OURS = re.compile(r".+\.[0-9a-f]{8}(\.part)?")
_STAMP = struct.Struct("<4Q")


def default_dir() -> str:
    """$RECORDTOOL_CACHE_DIR, else $XDG_CACHE_HOME/recordtool, else ~/.cache/recordtool."""
    if os.environ.get("RECORDTOOL_CACHE_DIR"):
        return os.environ["RECORDTOOL_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "recordtool")


def key(url: str, store: str = "") -> str:
    """The cache folder name of a dataset: a hash of its store and URL (distinct stores or URLs
    never share files) plus the URL's last component, cleaned, for people looking at the folder."""
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "dataset"
    if tail in (".", ".."):
        tail = "dataset"
    return f"{hashlib.sha256((store + chr(10) + url).encode()).hexdigest()[:16]}-{tail}"


def file_name(name: str, crc: str) -> str:
    """`<name>.<crc>`, or for a name too long for that, a cleaned prefix and a hash of it."""
    full = f"{files.plain_name(name, 'shard name')}.{crc}"
    if len(os.fsencode(full)) <= NAME_BUDGET:
        return full
    head = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:120]
    return f"{head}~{hashlib.sha256(os.fsencode(name)).hexdigest()[:32]}.{crc}"


def _ident(st) -> bytes:
    return _STAMP.pack(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def touch(fd: int):
    """Set the file's mtime to now, to the nanosecond (its last use), and return its stat.

    The kernel stamps a write with its coarse clock (one tick: milliseconds), and ctime too:
    a write in the same tick as our last stamp would leave ctime as it was. The mtime we set is
    a fine-grained value, made to differ from the coarse ctime the kernel just gave the file,
    so any later write (which sets mtime to the coarse clock) changes the file's identity."""
    t = time.time_ns()
    os.utime(fd, ns=(t, t))
    st = os.fstat(fd)
    if st.st_mtime_ns == st.st_ctime_ns:  # (our value happened to fall on the tick)
        os.utime(fd, ns=(t + 1, t + 1))
        st = os.fstat(fd)
    return st


def sha256_of(fd: int, size: int) -> str | None:
    """SHA-256 of the first `size` bytes of an open file, as 64 hex digits; None when the file
    ends before `size` (cut short meanwhile). Read with pread, not mapped: a file truncated
    while it is hashed is a short read here, never a SIGBUS. Both the reads and hashlib let go
    of the GIL, so other threads run meanwhile."""
    h = hashlib.sha256()
    buf = bytearray(min(size, 8 << 20))
    view = memoryview(buf)
    at = 0
    while at < size:
        n = os.preadv(fd, [view[:min(len(buf), size - at)]], at)
        if not n:
            return None
        h.update(view[:n])
        at += n
    return h.hexdigest()


def read_all(fd: int, size: int) -> bytes | None:
    """The first `size` bytes of an open file (None when it ends before), read into memory:
    what is checked is what is used, whatever happens to the file afterwards."""
    parts, at = [], 0
    while at < size:
        b = os.pread(fd, min(size - at, 1 << 30), at)
        if not b:
            return None
        parts.append(b)
        at += len(b)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def crc_of(fd: int, size: int) -> str:
    """CRC32C of the first `size` bytes of an open file, as 8 hex digits."""
    import crc32c

    if not size:
        return "00000000"
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
        c = 0
        for at in range(0, size, 64 << 20):
            c = crc32c.crc32c(mm[at:at + (64 << 20)], c)
    return f"{c:08x}"


def held(fd: int) -> int:
    """Note `fd` as held by an operation in progress (a lock, a pin being checked): a forked
    child closes its copy (`_forked`). Returns fd."""
    _HELD.add(fd)
    return fd


def handed(fd: int) -> int:
    """An fd `held` noted, handed to its owner (a pin to its reader, who closes it): no longer
    an operation's, so a forked child keeps its copy, with the mapping it inherits. Returns fd."""
    _HELD.discard(fd)
    return fd


def let_go(fd: int, unlock: bool = False) -> None:
    """Close an fd `held` noted (after an explicit unlock when `unlock`: the lock ends even
    where a forked child still has a copy of the fd)."""
    _HELD.discard(fd)
    try:
        if unlock:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def open_cache_dir(cache_dir: str) -> int:
    """An fd of the folder the user chose for caches (created if missing; a link to it is
    followed: the user's own choice). ConfigError naming it when it cannot be made or opened,
    is not a folder, belongs to another user or is writable by everyone without the sticky
    bit: whoever else may write there could move or replace the cache's folders. A folder of
    root's (/tmp, /var/cache) is taken: its mode keeps other users out."""
    what = f"cache_dir {cache_dir!r}"
    try:
        fd = files.open_dir(cache_dir)
    except OSError as e:
        raise ConfigError(f"{what}: cannot be used as the cache folder ({e.strerror or e})") from None
    st = os.fstat(fd)
    why = None
    if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
        why = (f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): that user could move or replace "
               "what the cache keeps there")
    elif st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        why = "writable by every user (without the sticky bit): anyone could move or replace what the cache keeps"
    if why is not None:
        os.close(fd)
        raise ConfigError(f"{what}: {why}; choose a folder of your own")
    return fd


class CacheFolder:
    """The folders of one dataset's cache, opened (created if missing) and held open, and the
    cache's lock (`locked`).

    Invariants: every file is reached through the folder fds opened here (never by a path that
    could follow a link out); only files `mine` accepts are counted or deleted; `locked()`
    excludes the threads of this process and other processes alike, and a forked child never
    holds or ends its parent's hold of it.

    Args:
        cache_dir: the folder holding every dataset's cache folder.
        name: this dataset's folder name in it (`key`).
    """

    def __init__(self, cache_dir: str, name: str):
        self.dir = os.path.join(os.path.abspath(os.fspath(cache_dir)), name)  # (messages name absolute paths)
        self.shards_dir = os.path.join(self.dir, "shards")
        self.meta_dir = os.path.join(self.dir, "meta")
        self.locks_dir = os.path.join(self.dir, "locks")
        self._fds: list = []
        self._tlock = threading.Lock()  # flock does not exclude threads sharing one fd
        # the folder fds outlive close(): a download still finishing uses them; they go with the object
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        try:
            top = open_cache_dir(os.fspath(cache_dir))
            try:
                self.dir_fd = self._keep(files.open_dir(name, top, what=self.dir))
            finally:
                os.close(top)
            self.shards_fd = self._keep(files.open_dir("shards", self.dir_fd, what=self.shards_dir))
            self.meta_fd = self._keep(files.open_dir("meta", self.dir_fd, what=self.meta_dir))
            self.locks_fd = self._keep(files.open_dir("locks", self.dir_fd, what=self.locks_dir))
            self._lock_fd = self._keep(self._open_lockfile(self.dir_fd, ".lock", os.path.join(self.dir, ".lock")))
        except BaseException:
            _close_all(self._fds)
            raise
        _FOLDERS.add(self)

    def cache_lock_fd(self) -> int:
        """The fd of `.lock` this process flocks (its own, opened anew after a fork)."""
        if self._lock_fd is None:
            self._lock_fd = self._keep(self._open_lockfile(self.dir_fd, ".lock", os.path.join(self.dir, ".lock")))
        return self._lock_fd

    @contextlib.contextmanager
    def locked(self):
        """The cache's lock (threads of this process and other processes alike)."""
        with self._tlock:
            fd = self.cache_lock_fd()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _forked(self) -> None:
        """In a forked child: the thread lock made anew (a thread of the parent may have held
        it at the fork; that thread is not here to let go of it), and its copy of the parent's
        `.lock` fd closed (see the module docstring); the next use of the lock opens its own."""
        self._tlock = threading.Lock()
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None and fd in self._fds:
            self._fds.remove(fd)
            os.close(fd)

    @staticmethod
    def _open_lockfile(dir_fd: int, name: str, what: str) -> int:
        """An fd (read-write) of a lock file, created if missing. What is at its name must be a
        file the cache could have made: regular, this user's, one link. A symbolic link is not
        followed (O_NOFOLLOW), a FIFO does not block the open (O_NONBLOCK), and a hard link to
        a file elsewhere is refused before the stamp is written into it: UnsafePath naming it."""
        try:
            fd = os.open(name, _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as e:
            kind = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a directory",
                    errno.ENXIO: "a socket or special file"}.get(e.errno)
            if kind is not None:
                raise UnsafePath(f"{what}: is {kind}, not a lock file recordtool made; remove it") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{what}: is not a regular file, not a lock file recordtool made; remove it")
            files.check_ours(st, what)
            if st.st_nlink != 1:
                raise UnsafePath(f"{what}: has {st.st_nlink} hard links (one is elsewhere); recordtool never "
                                 f"makes one and writes nothing into it: remove it")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def file_lock(self, fname: str, wait: bool):
        """An fd holding the exclusive download lock of one file, or None when `wait` is False
        and someone else holds it."""
        fd = held(self._open_lockfile(self.locks_fd, fname, os.path.join(self.locks_dir, fname)))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            let_go(fd)
            return None
        except BaseException:
            let_go(fd)
            raise
        return fd

    def unlock(self, fd: int) -> None:
        """Let go of a `_file_lock`."""
        let_go(fd, unlock=True)

    def stamp(self, fname: str, st=None) -> bytes:
        """The identity recorded for a cached file; with `st`, record that one instead."""
        fd = self._open_lockfile(self.locks_fd, fname, os.path.join(self.locks_dir, fname))
        try:
            if st is None:
                return os.pread(fd, _STAMP.size, 0)
            os.pwrite(fd, _ident(st), 0)
            return b""
        finally:
            os.close(fd)

    def mark_used(self, fname: str) -> None:
        """Record a use of a cached file now, for LRU eviction: its lock file's mtime (the file
        itself is never written after its download)."""
        fd = self._open_lockfile(self.locks_fd, fname, os.path.join(self.locks_dir, fname))
        try:
            os.utime(fd)
        finally:
            os.close(fd)

    def last_use(self, fname: str, st) -> int:
        """When a cached file (stat `st`) was last used, in ns: its lock file's mtime, or the
        file's own where it has none."""
        try:
            return os.stat(fname, dir_fd=self.locks_fd, follow_symlinks=False).st_mtime_ns
        except FileNotFoundError:
            return st.st_mtime_ns

    def present(self, dir_fd: int, fname: str, where: str) -> bool:
        """True when our complete file is there; UnsafePath when something else is at its name."""
        try:
            st = os.stat(fname, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{where}: is not a regular file the cache wrote (a symbolic link or special "
                             f"file was put there); remove it")
        return True

    def where(self, dir_fd: int, fname: str) -> str:
        """The path of `fname` in one of the cache's folders (for messages)."""
        folder = {self.shards_fd: self.shards_dir, self.meta_fd: self.meta_dir, self.locks_fd: self.locks_dir}
        return os.path.join(folder.get(dir_fd, self.dir), fname)

    def unlink(self, dir_fd: int, fname: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fname, dir_fd=dir_fd)

    def mine(self, st, name: str) -> bool:
        """A file the cache may count and delete: its kind of name, regular, ours, one link."""
        return (_OURS.fullmatch(name) is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1
                and (not hasattr(os, "geteuid") or st.st_uid == os.geteuid()))

    def open_mine(self, dir_fd: int, fname: str, where: str):
        """An fd of our file, or None when it is gone or not one the cache may touch."""
        try:
            return files.open_regular_at(dir_fd, fname, where)
        except (FileNotFoundError, UnsafePath):
            return None

    def new_part(self, dir_fd: int, part: str) -> int:
        """The .part file created anew (a leftover one of ours removed: we hold its download lock)."""
        try:
            st = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            if not self.mine(st, part):
                raise UnsafePath(f"{self.where(dir_fd, part)}: not a file the cache wrote; remove it")
            self.unlink(dir_fd, part)
        except FileNotFoundError:
            pass
        return os.open(part, _NEW_FLAGS, 0o600, dir_fd=dir_fd)


def identity(fd: int) -> bytes:
    """The identity (inode, size, mtime, ctime) of an open file: any write to it changes it."""
    return _ident(os.fstat(fd))


def _close_all(fds: list) -> None:
    while fds:
        os.close(fds.pop())


_FOLDERS: "weakref.WeakSet[CacheFolder]" = weakref.WeakSet()  # the cache folders open in this process
_HELD: set = set()  # fds of locks held by operations in progress (`held`)


def _after_fork_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()
    for folder in list(_FOLDERS):
        folder._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
