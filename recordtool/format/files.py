"""Opening files of a dataset directory safely: the one place that maps or reads them.

A dataset directory is untrusted input. Names come from its manifest, so each must be a plain
file name inside the directory (no `/`, `..`, absolute paths). Files are opened with
O_NOFOLLOW (a planted symlink is not followed out of the directory) and O_NONBLOCK (a FIFO
does not hang the open), then must be regular files. Temporary files we write are created
with O_EXCL | O_NOFOLLOW, so a planted symlink at their name cannot redirect the write.
"""
from __future__ import annotations

import mmap
import os
import stat

from ..errors import UnsafePath  # noqa: F401  (re-exported for fs.py)

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def plain_name(name, what: str = "file name") -> str:
    """`name` if it is a plain file name (one path component, no NUL); else UnsafePath."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name \
            or (os.sep != "/" and os.sep in name):
        raise UnsafePath(f"{what} {name!r} is not a plain file name inside the dataset directory")
    return name


def inside(root: str, name, what: str = "file name") -> str:
    """root/name for a plain `name` (see plain_name)."""
    return os.path.join(root, plain_name(name, what))


def open_regular(path: str, follow: bool = False) -> int:
    """A read-only fd of the regular file at path; never blocks (a FIFO is refused, not
    waited on). FileNotFoundError passes through; anything that is not a regular file is
    UnsafePath.

    Args:
        path: the file.
        follow: follow a final symbolic link (source files the user names or links to);
            dataset files never are.
    """
    flags = _READ_FLAGS & ~getattr(os, "O_NOFOLLOW", 0) if follow else _READ_FLAGS
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and (e.errno == getattr(os, "ELOOP", -1) or os.path.islink(path)):
            raise UnsafePath(f"{path}: is a symbolic link; dataset files must be regular files") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "special file"
        raise UnsafePath(f"{path}: is a {kind}, not a regular file")
    return fd


def map_readonly(path: str):
    """(mapping, size) of a regular file: an mmap, or b"" for an empty file. The mapping is
    read-only; a file truncated by someone else while mapped raises SIGBUS on access (see
    README, Security) — sizes are checked against the manifest before any read."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        return (mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""), size
    finally:
        os.close(fd)


def read_bounded(path: str, limit: int, what: str = "file", follow: bool = False) -> bytes:
    """The whole content of a regular file, refusing one larger than `limit` bytes before
    reading any of it (a sparse or huge file costs nothing); `follow` as in open_regular."""
    fd = open_regular(path, follow)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UnsafePath(f"{path}: {size} bytes, more than the {limit} a {what} may have")
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:
            raise UnsafePath(f"{path}: grew past the {limit} bytes a {what} may have while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def create_exclusive(path: str, mode: int = 0o644) -> int:
    """A new file for writing at path: fails if anything (a file, a planted symlink) is there."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                   | getattr(os, "O_CLOEXEC", 0), mode)


def write_new(path: str, data: bytes) -> None:
    """Write `data` to a file that must not exist yet (see create_exclusive)."""
    fd = create_exclusive(path)
    try:
        view = memoryview(data)
        while len(view):
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def replace_tmp(path: str, data: bytes) -> None:
    """Write `data` to path through path.tmp (created exclusively, after removing a leftover
    .tmp that is ours to remove: a regular file or a symlink, never followed), then rename."""
    tmp = path + ".tmp"
    try:
        st = os.lstat(tmp)
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            os.unlink(tmp)
        else:
            raise UnsafePath(f"{tmp}: exists and is not a regular file; remove it first")
    except FileNotFoundError:
        pass
    write_new(tmp, data)
    os.replace(tmp, path)
