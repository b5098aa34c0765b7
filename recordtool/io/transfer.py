"""Retry and the one download: every remote read of a whole object goes through `download_into`.

Object stores fail now and then (5xx answers, timeouts, cut connections): `Retry.call` runs
an operation again with exponential backoff and then raises RemoteError naming the object.
A missing object or refused access is not retried. A download is checked as it arrives:
exactly the expected size (a longer answer is cut off, never buffered) and, when the
manifest gives them, its CRC32C and SHA-256; a transfer that fails a check is `Damaged` and
retried.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from ..errors import Cancelled, Damaged, RecordtoolError, RemoteError
from . import files
from .fs import PIECE
from .store import refusal

# not retried: the object is not there, access is refused, or recordtool itself refused it
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, RecordtoolError)


@dataclass(frozen=True)
class Retry:
    """How remote operations are retried: `attempts` tries in all, waiting backoff·2^k seconds
    (at most max_backoff) before try k+2. Anything but PERMANENT errors is retried (5xx answers,
    timeouts, cut connections, Damaged transfers); then RemoteError names the object and the
    last error. Refused or missing credentials (AccessDenied) and a configuration or request
    the client refuses (ConfigError: an unknown storage option reaches it only when it first
    connects) are raised at once, never retried.

    Args:
        attempts: tries in all (≥ 1).
        backoff: seconds before the second try; doubled for each further one.
        max_backoff: the longest wait between two tries.
    """

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 8.0

    def call(self, fn, what: str):
        """fn() until it succeeds, a PERMANENT error, or `attempts` failures (RemoteError).
        What asking again would only repeat is raised at once as a RecordtoolError naming
        `what` (io.store.refusal): refused or missing credentials (AccessDenied), a refused
        configuration or request (ConfigError)."""
        last = None
        for k in range(max(1, self.attempts)):
            if k:
                time.sleep(min(self.max_backoff, self.backoff * 2 ** (k - 1)))
            try:
                return fn()
            except RecordtoolError:
                raise
            except PERMANENT as e:
                err = refusal(e, what)  # (a PermissionError: AccessDenied)
                if err is not None:
                    raise err from e
                raise
            except Exception as e:  # 5xx, timeouts, connection and checksum errors of any backend
                err = refusal(e, what)
                if err is not None:  # the same call fails the same way every time
                    raise err from e
                last = e
        raise RemoteError(f"{what}: failed {max(1, self.attempts)} times (retried with backoff); last error: "
                          f"{type(last).__name__}: {last}") from last


def copy_into(fs, path: str, fd: int, size: int, crc: str | None = None, stop=None,
              sha256: str | None = None) -> None:
    """One attempt at downloading `path` into the open file `fd` from offset 0: Damaged unless
    exactly `size` bytes arrive (and their CRC32C is `crc`, their SHA-256 `sha256`, when
    given). At most size + 1 bytes are ever read, so a server answering with more costs
    nothing more.

    Args:
        fs, path: where the object is.
        fd: a local file opened for writing (its content is overwritten from offset 0).
        size: the bytes expected.
        crc: their CRC32C, or None to check the size only.
        stop: a callable; when it returns True the copy ends with Cancelled.
        sha256: their SHA-256 (64 hex digits), or None.
    """
    import crc32c

    got, c = 0, 0
    h = hashlib.sha256() if sha256 is not None else None
    with fs.open_read(path, size) as f:
        while True:
            if stop is not None and stop():
                raise Cancelled(f"{fs.url(path)}: download cancelled")
            chunk = f.read(PIECE)
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
            if h is not None:
                h.update(chunk)
            got += len(chunk)
    if got != size:
        raise Damaged(f"{got} bytes arrived, {size} expected (truncated)")
    if crc is not None and f"{c:08x}" != crc:
        raise Damaged(f"CRC32C {c:08x} of the bytes that arrived differs from the manifest's {crc} "
                      f"(altered in transit or on the store)")
    if h is not None and h.hexdigest() != sha256:
        raise Damaged(f"SHA-256 {h.hexdigest()[:16]}… of the bytes that arrived differs from the manifest's "
                      f"{sha256[:16]}… (altered in transit or on the store)")


def download_into(fs, path: str, fd: int, size: int, retry: Retry, crc: str | None = None, stop=None,
                  sha256: str | None = None) -> None:
    """`copy_into` retried: the object's checked bytes in `fd`, or RemoteError naming it after
    the retries; FileNotFoundError (not retried) when the store has no such object."""
    retry.call(lambda: copy_into(fs, path, fd, size, crc, stop=stop, sha256=sha256), fs.url(path))


def download(fs, path: str, local: str, size: int, retry: Retry, crc: str | None = None) -> str:
    """A new local file `local` (created exclusively) holding the object's checked bytes; on
    any failure nothing is left there."""
    fd = files.create_exclusive(local)
    try:
        download_into(fs, path, fd, size, retry, crc)
    except BaseException:
        os.close(fd)
        os.unlink(local)
        raise
    os.close(fd)
    return local
