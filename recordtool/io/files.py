"""Local files, opened safely: the one place that maps or reads dataset and cache files.

A dataset directory and a cache folder are untrusted input. Names come from a manifest, so
each must be a plain file name (no `/`, `..`, absolute paths, at most NAME_MAX bytes). Files
are opened with O_NOFOLLOW (a planted symlink is not followed out of the directory) and
O_NONBLOCK (a FIFO does not hang the open), then must be regular files. Temporary files we
write are created with O_EXCL | O_NOFOLLOW, so a planted symlink at their name cannot redirect
the write. Folders we own (the shard cache's) are opened one component at a time relative to
their parent's fd (`open_dir`: O_DIRECTORY | O_NOFOLLOW, then fstat: ours), and every file in
them is reached through that fd, so no link anywhere below the folder the user named is followed.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat

from ..errors import UnsafePath

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
NAME_MAX = 255  # bytes in one path component (Linux, macOS; ext4, xfs, btrfs, apfs)


def plain_name(name, what: str = "file name") -> str:
    """`name` if it is a plain file name (one path component, no NUL, at most NAME_MAX bytes
    encoded); else UnsafePath."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name \
            or (os.sep != "/" and os.sep in name):
        raise UnsafePath(f"{what} {name!r} is not a plain file name inside the dataset directory")
    if len(os.fsencode(name)) > NAME_MAX:
        raise UnsafePath(f"{what} {name[:40]!r}… is {len(os.fsencode(name))} bytes long, more than the "
                         f"{NAME_MAX} a file name may have")
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
    """Write `data` to a file that must not exist yet (see create_exclusive); a write that
    fails (a full disk) removes the file it created, so no part-written file is left."""
    fd = create_exclusive(path)
    try:
        view = memoryview(data)
        while len(view):
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
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


def open_dir(name: str, parent: int | None = None, create: bool = True, what: str | None = None) -> int:
    """An fd of the folder `name` (one component inside the folder fd `parent`, or a path the
    user chose when `parent` is None), created (mode 0o700) if missing. Below a parent the
    folder must be a real folder, not a symlink (O_NOFOLLOW), owned by this user and not
    writable by everyone: else UnsafePath naming it (`what`), and nothing in it is touched.

    Args:
        name: a plain name inside `parent`, or any path when `parent` is None (followed: the
            user's own choice, e.g. a cache folder on another disk).
        parent: an fd from open_dir, or None.
        create: make the folder when it does not exist.
        what: the folder's path, for messages.
    """
    what = what or name
    if parent is None:
        if create:
            os.makedirs(name, exist_ok=True)
        return os.open(name, _DIR_FLAGS & ~_NOFOLLOW)
    plain_name(name, "folder name")
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"{what}: is a symbolic link or not a folder; recordtool's own folders must be "
                             f"real folders (remove it)") from None
        raise
    try:
        check_ours(os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_ours(st: os.stat_result, what: str) -> None:
    """UnsafePath unless `st` (of a folder or file we keep) belongs to this user and is not
    writable by everyone (another user could otherwise plant or change what we read)."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise UnsafePath(f"{what}: owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): not ours to use")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{what}: writable by every user; not ours to trust")


def open_regular_at(dir_fd: int, name: str, what: str, flags: int = _READ_FLAGS) -> int:
    """An fd of the regular file `name` in the folder `dir_fd` (see open_dir) that this user
    owns and that has no other hard link; FileNotFoundError passes through, anything else
    (symlink, FIFO, someone else's file, a hard link to a file elsewhere) is UnsafePath."""
    try:
        fd = os.open(name, flags | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0),
                     dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{what}: is a symbolic link, not a file recordtool wrote") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{what}: is not a regular file")
        check_ours(st, what)
        if st.st_nlink != 1:
            raise UnsafePath(f"{what}: has {st.st_nlink} hard links; recordtool never makes one")
    except BaseException:
        os.close(fd)
        raise
    return fd
