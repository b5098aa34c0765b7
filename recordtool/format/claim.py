"""Who owns what in a dataset directory: the protocol that lets pack replace its own files
and never anything else's — for a local OUT (`claim_output`) and one on object storage
(`format.upload`) alike.

What is ours in OUT is decided by our own records, never by a file name:
- `.partial/pack.json` (created right after `.partial/`, JSON with `"tool": "recordtool"`)
  marks `.partial` as ours; its `publishing` list names files being moved into (or removed
  from) OUT, so a pack killed half-way through a publish or a cleanup leaves nothing that the
  next run cannot recognise. A `.partial` without the marker is foreign and never deleted.
- a finished dataset is ours only if its manifest.json loads as a recordtool manifest, and
  `--overwrite` then removes exactly the files it lists (shards, index, report) and itself.
- `OUT/.recordtool.lock` (flock, non-blocking) is held for the whole pack: a second pack into
  the same OUT fails at once. The lock file stays (removing it would race with a waiter).
- OUT may not be SRC, inside SRC, or hold SRC (compared by st_dev/st_ino: aliases included).

A killed planned pack (`--shards`) also leaves its finished shards in .partial (`part-NNNNN` +
`part-NNNNN.done.json`) and its plan hash in the marker: the next run of the same plan keeps
them (`claim_output(plan=, resume=)`), any other run removes them.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat

from ..errors import FormatError, OutputExists, UnsafePath
from ..io import files
from . import manifest as mf
from .schema import FINISHED, LOCK_FILE, MARKER_FILE, MARKER_MAX, OUR_NAMES, PARTIAL_DIR


def _identity(path: str):
    """(st_dev, st_ino) of what `path` names (links followed), None when nothing is there."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _ancestors(path: str) -> list:
    """Identities of the existing folders above `path` (resolved), nearest first."""
    ids, p = [], os.path.realpath(path)
    while True:
        parent = os.path.dirname(p)
        if parent == p:
            return ids
        p = parent
        ident = _identity(p)
        if ident is not None:
            ids.append(ident)


def check_separate(out: str, sources=()) -> None:
    """Refuse an OUT that is a source, lies inside one, or holds one: packing into SRC would
    pack the output as a class, and `--overwrite` would remove the input. Folders are compared
    by identity (st_dev, st_ino), not by path, so an alias (a symbolic link, a bind mount, a
    second mount of the same file system) is the folder it shows.

    Args:
        out: the dataset directory to write (it may not exist yet).
        sources: paths of what is read (a folder, OFRecord part folder, TFRecord files).
    """
    out_id, out_up = _identity(out), _ancestors(out)
    for src in sources:
        src_id = _identity(src)
        if src_id is None:
            continue
        if out_id == src_id:
            raise OutputExists(f"{out}: is the source {src} itself; write to a new directory (then move it) "
                               "instead of re-packing in place")
        if os.path.isdir(src) and src_id in out_up:
            raise OutputExists(f"{out}: lies inside the source folder {src}; choose an OUT outside it")
        if out_id is not None and out_id in _ancestors(src):
            raise OutputExists(f"{out}: holds the source {src}; choose an OUT that does not contain it")


def lock_output(out: str) -> int:
    """Take OUT's pack lock (flock on OUT/.recordtool.lock, never blocking); returns its fd,
    held until closed. OutputExists when another pack holds it."""
    path = os.path.join(out, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{path}: is a symbolic link; remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path}: is not a regular file; remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise OutputExists(f"{out}: another recordtool pack is writing here ({path} is locked)") from None
        raise
    return fd


def read_marker(out: str) -> dict | None:
    """OUT/.partial/pack.json if .partial is a directory of ours (the marker loads and says
    `"tool": "recordtool"`), else None."""
    partial = os.path.join(out, PARTIAL_DIR)
    try:
        if not stat.S_ISDIR(os.lstat(partial).st_mode):  # a link or a file there is not ours
            return None
        raw = files.read_bounded(os.path.join(partial, MARKER_FILE), MARKER_MAX, "pack marker")
    except (OSError, FormatError):
        return None
    return parse_marker(raw)


def parse_marker(raw: bytes) -> dict | None:
    """A pack marker's content if it is ours (JSON object, `"tool": "recordtool"`, `publishing`
    a list of names), else None — for a local OUT and one on object storage alike."""
    try:
        m = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(m, dict) or m.get("tool") != "recordtool":
        return None
    if not (isinstance(m.get("publishing", []), list) and all(isinstance(n, str) for n in m.get("publishing", []))):
        return None
    return m


def owned(where: str, names: set, marker: dict | None, finished: dict | None, overwrite: bool) -> set:
    """The names in OUT (`names`) that are provably ours: listed by our pack marker or by the
    finished dataset's manifest. OutputExists when OUT holds a finished dataset and not
    `overwrite`, holds things but nothing of ours, or holds files a pack would replace that
    nothing of ours lists. Shared by a local OUT and one on object storage."""
    if finished is not None and not overwrite:
        raise OutputExists(f"{where}: already holds a finished dataset; pass --overwrite to replace it")
    if finished is None and marker is None and names:
        raise OutputExists(f"{where}: not empty and holds no recordtool dataset; choose an empty or new directory")
    ours = set(marker.get("publishing", [])) if marker else set()
    if finished is not None:
        ours |= set(listed(finished)) | {mf.MANIFEST_FILE}
    ours &= names
    clash = sorted(n for n in names - ours if OUR_NAMES.match(n))
    if clash:
        raise OutputExists(f"{where}: holds {', '.join(clash[:5])}, which recordtool did not write (no manifest or "
                           "pack marker of ours lists them) and a pack would replace; move them away")
    return ours


def write_marker(out: str, marker: dict) -> None:
    """Replace OUT/.partial/pack.json (temp file + rename): other fields are kept by callers
    that read, update and write it back."""
    files.replace_tmp(os.path.join(out, PARTIAL_DIR, MARKER_FILE), mf.dump(marker))


def listed(manifest: dict) -> list:
    """Files a finished dataset of ours consists of (besides its manifest)."""
    names = [s["name"] for s in manifest["shards"]] + [manifest["index"]["file"]]
    if "report" in manifest:
        names.append(manifest["report"])
    return names


def remove_file(out: str, name: str) -> None:
    """Remove OUT/name if it is a file or a link (a link is removed, never followed)."""
    path = os.path.join(out, files.plain_name(name))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise OutputExists(f"{path}: is a directory where recordtool's file was; remove it yourself")
    os.unlink(path)


def claim_output(out: str, overwrite: bool, sources=(), plan: dict | None = None, resume: bool = True) -> tuple:
    """Make OUT ready for a new pack, removing only what is provably ours; returns (the fd of
    the pack lock (see module doc), held until the caller closes it; whether the finished
    shards of an unfinished run of the same plan were kept).

    Args:
        out: the dataset directory (created when missing).
        overwrite: replace a finished dataset of ours in OUT.
        sources: paths the pack reads (see check_separate).
        plan: plan fields kept in the marker (`plan`: the plan hash) by a pack that can resume.
        resume: keep the finished shards when the marker there holds the same plan hash.
    """
    check_separate(out, sources)
    os.makedirs(out, exist_ok=True)
    lock_path = os.path.join(out, LOCK_FILE)
    new_lock = not os.path.lexists(lock_path)
    lock = lock_output(out)
    try:
        kept = _claim(out, overwrite, plan, resume)
    except BaseException:
        if new_lock:  # refused a directory that is not ours: leave no trace in it
            os.unlink(lock_path)
        os.close(lock)
        raise
    return lock, kept


def _claim(out: str, overwrite: bool, plan: dict | None, resume: bool) -> bool:
    names = set(os.listdir(out)) - {LOCK_FILE}
    partial = os.path.join(out, PARTIAL_DIR)
    marker = None
    if PARTIAL_DIR in names:
        marker = read_marker(out)
        if marker is None:
            st = os.lstat(partial)
            if not (stat.S_ISDIR(st.st_mode) and not os.listdir(partial)):  # empty: killed before the marker
                raise OutputExists(f"{partial}: not made by recordtool (no {MARKER_FILE} marker saying so); "
                                   "remove it yourself or choose another OUT")
            marker = {"tool": "recordtool"}
    finished = None
    if mf.MANIFEST_FILE in names:
        try:
            finished = mf.load(out)
        except FormatError as e:
            raise OutputExists(f"{out}: holds a manifest.json that is not a recordtool manifest ({e}); "
                               "choose another OUT") from None
    ours = owned(out, names, marker, finished, overwrite)
    keep = bool(resume and plan and plan.get("plan") and marker is not None and marker.get("plan") == plan["plan"])
    # .partial (ours) emptied but for the marker (and the finished shards of the same plan),
    # the marker from now on listing what is removed: a kill during the cleanup leaves files the
    # next run still knows to be ours
    if marker is not None and os.path.isdir(partial) and not os.path.islink(partial):
        for n in os.listdir(partial):
            if n != MARKER_FILE and not (keep and FINISHED.match(n)):
                p = os.path.join(partial, n)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
    else:
        os.mkdir(partial)
    write_marker(out, {**(plan or {}), "tool": "recordtool", "publishing": sorted(ours)})
    # manifest first: a kill during the cleanup never leaves something that looks finished
    for name in sorted(ours, key=lambda nm: nm != mf.MANIFEST_FILE):
        remove_file(out, name)
    write_marker(out, {**(plan or {}), "tool": "recordtool", "publishing": []})
    return keep
