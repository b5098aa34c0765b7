"""The small file-system interface pack and the reader do their I/O through.

Local paths get `LocalFS` (plain os calls, symlinks never followed for what we create or
delete), `file://` URLs included; other URLs (`s3://`, `gs://`, `memory://` …) get `FsspecFS`, a
thin wrapper over fsspec (an optional dependency: `pip install recordtool[s3]`). Paths are
strings in the file system's own syntax; `join` builds them. Writes go to a new object
(`open_write`), and `replace` is atomic on local disks and copy-then-delete on object stores,
which is why a dataset's manifest is always written last: its presence means "finished".

An object store is untrusted: every read is bounded. `open_read(path, limit)` never delivers
more than `limit + 1` bytes, and on async stores (s3fs, gcsfs, …) streams one GET body in
pieces, so a server that answers with more bytes than the object has costs at most one piece
of memory, never the whole answer. `read_bytes` refuses an object over its limit.
"""
from __future__ import annotations

import difflib
import glob as _glob
import hashlib
import inspect
import os
import posixpath
from collections.abc import Mapping
from typing import BinaryIO, Protocol

from ..errors import ConfigError, UnsafePath
from . import files
from .store import DEADLINE, PROBE_SECONDS, STORE_KEYS, Store, run  # noqa: F401  (API)

PIECE = 8 << 20  # bytes one read of a stream asks for at most


class FileSystem(Protocol):
    """What pack tasks and readers may do to storage."""

    def join(self, *parts: str) -> str: ...
    def open_read(self, path: str, limit: int | None = None) -> BinaryIO: ...
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
    def store_id(self) -> str: ...


def is_url(path) -> bool:
    """True for object-store URLs (s3://, gs://, memory://, …); file:// is a local path."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def option_names(options) -> dict:
    """`storage_options` as a mapping of option names (str), copied; {} for None. ConfigError
    names what is wrong (never a value: it may be a secret)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"storage_options must be a dict of fsspec options for the URL (e.g. "
                          f"{{'endpoint_url': 'http://host:9000', 'key': …, 'secret': …}}), not a "
                          f"{type(options).__name__}")
    bad = [k for k in options if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"storage_options keys are option names (str), not {type(bad[0]).__name__} {bad[0]!r}")
    return dict(options)


def check_options(path, options) -> dict:
    """`storage_options` checked where they come in (recordtool.open, Loader, pack to a URL): a
    mapping of option names, and only for an object-store URL — a local path has none to take,
    so options given with one are a mistake, not something to drop in silence. ConfigError
    names the option (never its value: it may be a secret). Returns a copy."""
    options = option_names(options)
    if options and not is_url(os.fspath(path) if isinstance(path, os.PathLike) else path):
        raise ConfigError(f"storage_options ({', '.join(sorted(options))}) given for {os.fspath(path)!r}, a local "
                          "path: they reach an object store (s3://bucket/prefix, gs://…); leave them out, or give "
                          "the dataset's URL")
    return dict(options)


def _option_names(cls) -> tuple:
    """(names the file-system class's constructors take, whether the one that runs — its own or
    the nearest base's — takes **kwargs too). A signature that cannot be read takes anything."""
    names, more, first = set(), False, True
    for k in cls.__mro__:
        init = k.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            more = more or first
            first = False
            continue
        for p in params:
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self":
                names.add(p.name)
            elif p.kind is p.VAR_KEYWORD and first:
                more = True
        first = False
    return names, more


def _check_option_names(url: str, options: dict) -> None:
    """ConfigError for a storage option the URL's file system cannot take: one its constructor
    does not name, close to one it does (`endpoint` for s3fs's `endpoint_url`), or any unknown
    one where the constructor takes no others. (s3fs hands unknown names on to its session when
    it first connects: a misspelt one would fail there, after the retries.)"""
    if not options or "::" in url:
        return
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):  # url_to_fs says what is missing
        return
    names, more = _option_names(cls)
    where = f"{cls.__module__.split('.')[0]}.{cls.__name__}"
    for key in options:
        if key in names:
            continue
        close = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.75)
        if close:
            raise ConfigError(f"storage_options key {key!r} is not an option of {where} ({url}); did you mean "
                              f"{close[0]!r}?")
        if not more:
            raise ConfigError(f"storage_options key {key!r} is not an option of {where} ({url}); it takes "
                              f"{', '.join(sorted(names))}")


def get_fs(path, *, deadline: float = DEADLINE, **options) -> tuple:
    """(FileSystem, path in its syntax) for a local path or a URL.

    Args:
        path: a local path, a file:// URL (local too) or an fsspec URL.
        deadline: seconds one request to an async store may take in all (io.store.run).
        options: fsspec storage options for URLs (s3fs: endpoint_url, key, secret, …); fsspec's
            own configuration (FSSPEC_S3_ENDPOINT_URL=…, ~/.config/fsspec) applies as well.
    """
    path = os.fspath(path)
    if is_url(path):
        return FsspecFS.from_url(path, deadline=deadline, **options)
    if path.startswith("file://"):
        path = path[len("file://"):]
    return LocalFS(), path


def read_all(f, limit: int) -> bytes:
    """Everything `f` gives, up to limit + 1 bytes (one more than allowed shows "too long")."""
    parts, got = [], 0
    while got <= limit:
        b = f.read(min(PIECE, limit + 1 - got))
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


class _Bounded:
    """A reader that stops after `limit + 1` bytes whatever the file underneath would give."""

    def __init__(self, f, limit: int | None):
        self._f, self._left = f, None if limit is None else limit + 1

    def read(self, n: int = -1) -> bytes:
        if self._left is not None:
            n = self._left if n is None or n < 0 else min(n, self._left)
            if n <= 0:
                return b""
        b = self._f.read(n)
        if self._left is not None:
            b = b[:self._left]
            self._left -= len(b)
        return b

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Stream(_Bounded):
    """One streamed GET of an async fsspec file (`open_async`), read in pieces of at most the
    size asked for; closing it before the end drops the connection (the rest is never read).
    Opening it and each piece run within `deadline` seconds (io.store.run)."""

    def __init__(self, fs, path: str, limit: int | None, deadline: float):
        self._fs, self._deadline = fs, deadline
        super().__init__(run(fs, deadline, fs.open_async, path, "rb"), limit)

    async def _read(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            b = await self._f.read(n - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._left if self._left is not None else 1 << 62
        n = min(n, self._left) if self._left is not None else n
        if n <= 0:
            return b""
        b = run(self._fs, self._deadline, self._read, min(n, PIECE))
        if self._left is not None:
            self._left -= len(b)
        return b

    async def _close(self) -> None:
        body = getattr(self._f, "r", None)  # s3fs: the response body, open until read to its end
        if body is not None and hasattr(body, "close"):
            body.close()

    def close(self) -> None:
        run(self._fs, self._deadline, self._close)


class LocalFS:
    """Local disk. Reads refuse symlinks and special files (files.open_regular); writes create
    new files exclusively (a planted symlink is never written through)."""

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def open_read(self, path: str, limit: int | None = None) -> BinaryIO:
        return _Bounded(os.fdopen(files.open_regular(path), "rb"), limit)

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

    def store_id(self) -> str:
        return "local"


class FsspecFS(Store):
    """Any fsspec file system (s3fs for s3://, gcsfs for gs://, memory:// in tests); which store
    it reaches and whether that is there: `Store` (io/store.py). Requests to an async store run
    within `deadline` seconds each (`Store.call`).

    In a process forked from the one that made it, `fs` is made again from the URL and
    options: an async client belongs to its process's event loop thread, which a forked child
    does not have (fsspec refuses the parent's client there)."""

    def __init__(self, fs, protocol: str, deadline: float = DEADLINE, remake=None):
        self._fs, self.protocol, self.deadline = fs, protocol, deadline
        self._remake = remake  # (url, options): how to make `fs` again in a forked child
        self._pid = os.getpid()

    @property
    def fs(self):
        if self._pid != os.getpid() and self._remake is not None:
            import fsspec

            url, options = self._remake
            self._fs, self._pid = fsspec.core.url_to_fs(url, **options)[0], os.getpid()
        return self._fs

    @classmethod
    def from_url(cls, url: str, deadline: float = DEADLINE, **options) -> tuple:
        try:
            import fsspec
        except ImportError:
            raise ImportError(f"{url}: object storage needs fsspec (pip install 'recordtool[s3]')") from None
        _check_option_names(url, options)
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except TypeError as e:  # the file system's constructor refused an option
            raise ConfigError(f"{url}: storage_options refused by the file system ({e})") from None
        return cls(fs, url.split("://", 1)[0], deadline, (url, options)), path

    def url(self, path: str) -> str:
        return f"{self.protocol}://{path}"

    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def open_read(self, path: str, limit: int | None = None) -> BinaryIO:
        """A reader of at most limit + 1 bytes: one streamed GET on async stores; elsewhere
        reads straight from the file without fsspec's read-ahead buffer (`cache_type="none"`)."""
        fs = self.fs
        if getattr(fs, "async_impl", False) and hasattr(fs, "open_async"):
            try:
                return _Stream(fs, path, limit, self.deadline)
            except NotImplementedError:
                pass
        return _Bounded(fs.open(path, "rb", cache_type="none"), limit)

    def open_write(self, path: str) -> BinaryIO:
        return self.fs.open(path, "wb")

    def read_bytes(self, path: str, limit: int) -> bytes:
        with self.open_read(path, limit) as f:
            data = read_all(f, limit)
        if len(data) > limit:
            raise UnsafePath(f"{self.url(path)}: more than the {limit} bytes allowed here")
        return data

    def write_bytes(self, path: str, data: bytes) -> None:
        self.call("pipe_file", path, data)

    def size(self, path: str) -> int:
        return int(self.call("size", path))

    def exists(self, path: str) -> bool:
        return self.call("exists", path)

    def listdir(self, path: str) -> list:
        # refresh: a listing cached by this client may predate another process's writes
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.call("ls", path, detail=False, refresh=True))

    def replace(self, src: str, dst: str) -> None:
        self.call("mv", src, dst)

    def remove(self, path: str) -> None:
        self.call("rm_file", path)

    def glob(self, pattern: str) -> list:
        return sorted(self.call("glob", pattern))


def store_key(fs, url: str) -> str:
    """A hash of the store (`store_id`) and the URL: distinct stores or URLs never collide."""
    return hashlib.sha256((fs.store_id() + "\n" + url).encode()).hexdigest()
