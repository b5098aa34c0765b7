"""The small file-system interface pack and the reader do their I/O through.

Local paths get `LocalFS` (plain os calls, symlinks never followed for what we create or
delete), `file://` URLs included; other URLs (`s3://`, `gs://`, `memory://` …) get `FsspecFS`, a thin wrapper over
fsspec (an optional dependency: `pip install recordtool[s3]`). Paths are strings in the
file system's own syntax; `join` builds them. Writes go to a new object (`open_write`), and
`replace` is atomic on local disks and copy-then-delete on object stores, which is why a
dataset's manifest is always written last: its presence means "finished".

Object stores fail now and then (5xx answers, timeouts, cut connections): `Retry.call` runs
an operation again with exponential backoff and then raises RemoteError naming the object.
A missing object or refused access is not retried.
"""
from __future__ import annotations

import glob as _glob
import os
import posixpath
import time
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from .errors import Cancelled, Damaged, RecordtoolError, RemoteError  # noqa: F401  (Damaged, Cancelled: fs.X for callers)
from .format import files


class FileSystem(Protocol):
    """What pack tasks and readers may do to storage."""

    def join(self, *parts: str) -> str: ...
    def open_read(self, path: str) -> BinaryIO: ...
    def open_write(self, path: str) -> BinaryIO: ...
    def read_bytes(self, path: str, limit: int) -> bytes: ...
    def write_bytes(self, path: str, data: bytes) -> None: ...
    def size(self, path: str) -> int: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list: ...
    def replace(self, src: str, dst: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def glob(self, pattern: str) -> list: ...
    def url(self, path: str) -> str: ...


def is_url(path) -> bool:
    """True for object-store URLs (s3://, gs://, memory://, …); file:// is a local path."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def get_fs(path, **options) -> tuple:
    """(FileSystem, path in its syntax) for a local path or a URL.

    Args:
        path: a local path, a file:// URL (local too) or an fsspec URL.
        options: fsspec storage options for URLs (s3fs: endpoint_url, key, secret, …); fsspec's
            own configuration (FSSPEC_S3_ENDPOINT_URL=…, ~/.config/fsspec) applies as well.
    """
    path = os.fspath(path)
    if is_url(path):
        return FsspecFS.from_url(path, **options)
    if path.startswith("file://"):
        path = path[len("file://"):]
    return LocalFS(), path


CHUNK = 8 << 20  # bytes per read of a download


def copy_into(fs: "FileSystem", path: str, fd: int, size: int, crc: str | None = None, stop=None) -> None:
    """One attempt at downloading `path` into the open file `fd` from offset 0: Damaged unless
    exactly `size` bytes arrive (and their CRC32C is `crc`, 8 hex digits, when given), so a cut
    or altered transfer is retried by `Retry.call` like any other failure.

    Args:
        fs, path: where the object is.
        fd: a local file opened for writing (its content is overwritten from offset 0).
        size: the bytes expected.
        crc: their CRC32C, or None to check the size only.
        stop: a callable; when it returns True the copy ends with Cancelled.
    """
    import crc32c

    got, c = 0, 0
    with fs.open_read(path) as f:
        while True:
            if stop is not None and stop():
                raise Cancelled(f"{fs.url(path)}: download cancelled")
            chunk = f.read(CHUNK)
            if not chunk:
                break
            if got + len(chunk) > size:
                raise Damaged(f"more than the {size} bytes expected arrived")
            view = memoryview(chunk)
            pos = got
            while len(view):
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
            if crc is not None:
                c = crc32c.crc32c(chunk, c)
            got += len(chunk)
    if got != size:
        raise Damaged(f"{got} bytes arrived, {size} expected (truncated)")
    if crc is not None and f"{c:08x}" != crc:
        raise Damaged(f"CRC32C {c:08x} of the bytes that arrived differs from the manifest's {crc} "
                      f"(altered in transit or on the store)")


# not retried: the object is not there, access is refused, or recordtool itself refused it
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, RecordtoolError)


@dataclass(frozen=True)
class Retry:
    """How remote operations are retried: `attempts` tries in all, waiting backoff·2^k seconds
    (at most max_backoff) before try k+2. Anything but PERMANENT errors is retried (5xx answers,
    timeouts, cut connections, Damaged transfers); then RemoteError names the object and the
    last error.

    Args:
        attempts: tries in all (≥ 1).
        backoff: seconds before the second try; doubled for each further one.
        max_backoff: the longest wait between two tries.
    """

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 8.0

    def call(self, fn, what: str):
        """fn() until it succeeds, a PERMANENT error, or `attempts` failures (RemoteError)."""
        last = None
        for k in range(max(1, self.attempts)):
            if k:
                time.sleep(min(self.max_backoff, self.backoff * 2 ** (k - 1)))
            try:
                return fn()
            except PERMANENT:
                raise
            except Exception as e:  # 5xx, timeouts, connection and checksum errors of any backend
                last = e
        raise RemoteError(f"{what}: failed {max(1, self.attempts)} times (retried with backoff); last error: "
                          f"{type(last).__name__}: {last}") from last


class LocalFS:
    """Local disk. Reads refuse symlinks and special files (files.open_regular); writes create
    new files exclusively (a planted symlink is never written through)."""

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def open_read(self, path: str) -> BinaryIO:
        return os.fdopen(files.open_regular(path), "rb")

    def open_write(self, path: str) -> BinaryIO:
        return os.fdopen(files.create_exclusive(path), "wb")

    def read_bytes(self, path: str, limit: int) -> bytes:
        return files.read_bounded(path, limit)

    def write_bytes(self, path: str, data: bytes) -> None:
        files.write_new(path, data)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def listdir(self, path: str) -> list:
        return sorted(os.listdir(path))

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.unlink(path)

    def glob(self, pattern: str) -> list:
        return sorted(_glob.glob(pattern))

    def url(self, path: str) -> str:
        return path


class FsspecFS:
    """Any fsspec file system (s3fs for s3://, gcsfs for gs://, memory:// in tests)."""

    def __init__(self, fs, protocol: str):
        self.fs, self.protocol = fs, protocol

    @classmethod
    def from_url(cls, url: str, **options) -> tuple:
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{url}: object storage needs fsspec (pip install 'recordtool[s3]')") from None
        fs, path = fsspec.core.url_to_fs(url, **options)
        return cls(fs, url.split("://", 1)[0]), path

    def url(self, path: str) -> str:
        return f"{self.protocol}://{path}"

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def open_read(self, path: str) -> BinaryIO:
        # for streaming reads in large chunks: each read is one ranged request, no read-ahead
        # buffer to copy through (half the client CPU of fsspec's default, measured on s3fs)
        return self.fs.open(path, "rb", cache_type="none")

    def open_write(self, path: str) -> BinaryIO:
        return self.fs.open(path, "wb")

    def read_bytes(self, path: str, limit: int) -> bytes:
        size = self.size(path)
        if size > limit:
            raise files.UnsafePath(f"{self.url(path)}: {size} bytes, more than the {limit} allowed here")
        return self.fs.cat_file(path)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def listdir(self, path: str) -> list:
        # refresh: a listing cached by this client may predate another process's writes
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(path, detail=False, refresh=True))

    def replace(self, src: str, dst: str) -> None:
        self.fs.mv(src, dst)

    def remove(self, path: str) -> None:
        self.fs.rm_file(path)

    def glob(self, pattern: str) -> list:
        return sorted(self.fs.glob(pattern))
