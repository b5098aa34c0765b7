"""Write a dataset directory: part files, index, manifest — all or nothing — without ever
touching what is not ours.

Everything is written under OUT/.partial/ and moved into OUT only when complete, manifest
last: a dataset is finished exactly when manifest.json exists. What is ours in OUT is decided
by our own records, never by a file name:
- `.partial/pack.json` (created right after `.partial/`, JSON with `"tool": "recordtool"`)
  marks `.partial` as ours; its `publishing` list names files being moved into (or removed
  from) OUT, so a pack killed half-way through a publish or a cleanup leaves nothing that the
  next run cannot recognise. A `.partial` without the marker is foreign and never deleted.
- a finished dataset is ours only if its manifest.json loads as a recordtool manifest, and
  `--overwrite` then removes exactly the files it lists (shards, index, report) and itself.
- `OUT/.recordtool.lock` (flock, non-blocking) is held for the whole pack: a second pack into
  the same OUT fails at once. The lock file stays (removing it would race with a waiter).
- OUT may not be SRC, inside SRC, or hold SRC.

A killed planned pack (`--shards`, `--engine ray`) also leaves its finished shards in
.partial (`part-NNNNN` + `part-NNNNN.done.json`) and its plan hash in the marker: the next run
of the same plan keeps them (`claim_output(plan=, resume=)`), any other run removes them.
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass

import crc32c

from ..errors import FormatError, OutputExists, RecordtoolError, UnsafePath
from . import files
from . import index as ix
from . import manifest as mf
from .jpeg import JpegInfo
from .ofrecord import LENGTH_SIZE, encode_ofrecord, frame
from ..fs import LocalFS, get_fs

PARTIAL_DIR = ".partial"
MARKER_FILE = "pack.json"  # in .partial: {"tool": "recordtool", "publishing": [...], ...plan fields}
LOCK_FILE = ".recordtool.lock"
SHARD_PREFIX = "part-"
SHARD_DIGITS = 5
MARKER_MAX = 64 << 20
# names a pack writes into OUT: a foreign file by one of these names is never replaced
_OUR_NAMES = re.compile(r"^(part-\d+|index\.rtx|manifest\.json|pack_report\.json)(\.tmp)?$")
# in .partial: what a shard task finished (kept for a re-run of the same plan)
_FINISHED = re.compile(r"^part-\d+(\.done\.json)?$")

# OneFlow ImageNet converter's keys
KEY_IMAGE = "encoded"
KEY_LABEL = "class/label"
KEY_HEIGHT = "height"
KEY_WIDTH = "width"
KEY_FILENAME = "filename"


def shard_name(i: int) -> str:
    return f"{SHARD_PREFIX}{i:0{SHARD_DIGITS}d}"


def check_separate(out: str, sources=()) -> None:
    """Refuse an OUT that is a source, lies inside one, or holds one (resolved paths): packing
    into SRC would pack the output as a class, and `--overwrite` would remove the input.

    Args:
        out: the dataset directory to write.
        sources: paths of what is read (a folder, OFRecord part folder, TFRecord files).
    """
    ro = os.path.realpath(out)
    for src in sources:
        rs = os.path.realpath(src)
        if ro == rs:
            raise OutputExists(f"{out}: is the source {src} itself; write to a new directory (then move it) "
                               "instead of re-packing in place")
        if os.path.isdir(rs) and ro.startswith(rs.rstrip(os.sep) + os.sep):
            raise OutputExists(f"{out}: lies inside the source folder {src}; choose an OUT outside it")
        if rs.startswith(ro.rstrip(os.sep) + os.sep):
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
        ours |= set(_listed(finished)) | {mf.MANIFEST_FILE}
    ours &= names
    clash = sorted(n for n in names - ours if _OUR_NAMES.match(n))
    if clash:
        raise OutputExists(f"{where}: holds {', '.join(clash[:5])}, which recordtool did not write (no manifest or "
                           "pack marker of ours lists them) and a pack would replace; move them away")
    return ours


def write_marker(out: str, marker: dict) -> None:
    """Replace OUT/.partial/pack.json (temp file + rename): other fields are kept by callers
    that read, update and write it back."""
    files.replace_tmp(os.path.join(out, PARTIAL_DIR, MARKER_FILE), mf.dump(marker))


def _listed(manifest: dict) -> list:
    """Files a finished dataset of ours consists of (besides its manifest)."""
    names = [s["name"] for s in manifest["shards"]] + [manifest["index"]["file"]]
    if "report" in manifest:
        names.append(manifest["report"])
    return names


def _remove_file(out: str, name: str) -> None:
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
            if n != MARKER_FILE and not (keep and _FINISHED.match(n)):
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
        _remove_file(out, name)
    write_marker(out, {**(plan or {}), "tool": "recordtool", "publishing": []})
    return keep


class ShardWriter:
    """One part file: records appended in order, its CRC32C and index rows kept as it goes.
    Shards are independent files, so several can be written by different threads or
    processes at once. All I/O goes through a `FileSystem` (local disk or object storage).

    Args:
        path: where to write (a new file: nothing may be there yet).
        number: the part file number (the index's shard column).
        fs: the file system `path` is on (default: local disk).
        name: the part file's final name (default: the base name of `path`).
    """

    def __init__(self, path: str, number: int, fs=None, name: str | None = None):
        self.number = number
        self.name = name or os.path.basename(path)
        self.index = ix.IndexBuilder()
        self.pos = 0
        self.crc = 0
        self.records = 0
        self._f = (fs or LocalFS()).open_write(path)

    def add(self, jpeg: bytes, info: JpegInfo, label: int, filename: bytes) -> None:
        enc = encode_ofrecord({KEY_IMAGE: jpeg, KEY_LABEL: int(label), KEY_HEIGHT: info.height,
                               KEY_WIDTH: info.width, KEY_FILENAME: filename}, locate=KEY_IMAGE)
        offset = self.pos
        # pieces go to the (buffered) file as they are: small headers are gathered by its
        # buffer, the image bytes pass through without an extra copy
        for p in frame(enc):
            self._f.write(p)
            self.crc = crc32c.crc32c(p, self.crc)
        self.pos += LENGTH_SIZE + enc.size
        self.index.add(self.number, offset, enc.size, offset + LENGTH_SIZE + enc.payload_offset, len(jpeg), label,
                       info)
        self.records += 1

    def close(self, durable: bool = False) -> dict:
        """Close the file (`durable`: flushed to the device first, as far as the file system
        can say) and return its manifest entry {name, records, bytes, crc32c}."""
        if self._f is not None:
            f, self._f = self._f, None
            try:
                if durable:
                    f.flush()
                    try:
                        os.fsync(f.fileno())
                    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
                        pass  # object stores: the upload completes at close
            finally:
                f.close()
        return {"name": self.name, "records": self.records, "bytes": self.pos, "crc32c": f"{self.crc:08x}"}

    def finish(self, durable: bool = False) -> "FinishedShard":
        return FinishedShard(self.close(durable), self.index)


@dataclass
class FinishedShard:
    """A complete part file: its manifest entry and its index rows."""

    info: dict  # {name, records, bytes, crc32c}
    index: ix.IndexBuilder


class DatasetWriter:
    """Part files, then `commit()` publishes the dataset atomically. Shards are either opened
    in turn (`new_shard` + `add`), or written elsewhere (pack's shard tasks) into `tmp` and
    handed to `commit` as `FinishedShard`s.

    Args:
        out: the dataset directory (claimed: see `claim_output`).
        overwrite: replace a finished dataset in `out`.
        sources: paths the pack reads (OUT must stay apart from them).
        plan: the plan fields of a resumable pack, kept in `.partial/pack.json`.
        resume: keep the finished shards of an unfinished earlier run of the same plan
            (`kept` says whether there were any to keep).
    """

    def __init__(self, out: str, overwrite: bool = False, sources=(), plan: dict | None = None,
                 resume: bool = True):
        self.out = out
        self.fs, _ = get_fs(out)
        self._lock, self.kept = claim_output(out, overwrite, sources, plan, resume)
        self.tmp = os.path.join(out, PARTIAL_DIR)
        self.writers: list[ShardWriter] = []

    @property
    def shard(self) -> int:
        return len(self.writers) - 1

    def shard_bytes(self) -> int:
        return self.writers[-1].pos if self.writers else 0

    def records(self) -> int:
        return sum(w.records for w in self.writers)

    def max_label(self) -> int:
        return max((max(w.index.labels(), default=-1) for w in self.writers), default=-1)

    def new_shard(self) -> ShardWriter:
        if self.writers:
            self.writers[-1].close()
        k = len(self.writers)
        self.writers.append(ShardWriter(os.path.join(self.tmp, shard_name(k)), k, self.fs))
        return self.writers[-1]

    def add(self, jpeg: bytes, info: JpegInfo, label: int, filename: bytes) -> None:
        if not self.writers:
            self.new_shard()
        self.writers[-1].add(jpeg, info, label, filename)

    def commit(self, fields: dict, report: dict | None = None, shards: list | None = None) -> dict:
        """Write index + manifest (`fields`: manifest.build's arguments beyond the shards and
        the index), then move everything into place, manifest last. A failure before the
        manifest is published aborts (nothing left that looks finished, .partial removed).

        Args:
            fields: the manifest's classes, source, pack options, tool, ...
            report: pack_report.json's content, if any.
            shards: `FinishedShard`s in part-file order, already in `tmp` (default: this
                writer's own shards).
        """
        try:
            return self._commit(fields, report, shards)
        except BaseException:
            if not os.path.exists(os.path.join(self.out, mf.MANIFEST_FILE)):
                self.abort()
            raise

    def _commit(self, fields: dict, report: dict | None, shards: list | None) -> dict:
        fs = self.fs
        if shards is None:
            shards = [w.finish() for w in self.writers]
        builder = ix.IndexBuilder()
        for s in shards:
            builder.extend(s.index)
        index = builder.finish()
        blob = ix.encode_index(index)
        fs.write_bytes(os.path.join(self.tmp, ix.INDEX_FILE), blob)
        infos = [s.info for s in shards]
        names = [s["name"] for s in infos] + [ix.INDEX_FILE]
        fields = dict(fields)
        if report is not None:
            fs.write_bytes(os.path.join(self.tmp, mf.REPORT_FILE), mf.dump(report))
            names.append(mf.REPORT_FILE)
            fields["report"] = mf.REPORT_FILE
        manifest = mf.build(records=len(index), shards=infos,
                            index={"file": ix.INDEX_FILE, "bytes": len(blob), "crc32c": f"{crc32c.crc32c(blob):08x}"},
                            keys={"image": KEY_IMAGE, "label": KEY_LABEL, "height": KEY_HEIGHT, "width": KEY_WIDTH,
                                  "filename": KEY_FILENAME}, **fields)
        fs.write_bytes(os.path.join(self.tmp, mf.MANIFEST_FILE), mf.dump(manifest))
        clash = [n for n in names + [mf.MANIFEST_FILE] if os.path.lexists(os.path.join(self.out, n))]
        if clash:  # appeared since claim_output (not ours: it removed ours)
            raise OutputExists(f"{self.out}: {', '.join(clash[:5])} appeared while packing; not replaced")
        # the marker lists what is about to move into OUT: a kill half-way leaves files there
        # that the next run knows to be ours
        marker = read_marker(self.out) or {"tool": "recordtool"}
        marker["publishing"] = sorted(names + [mf.MANIFEST_FILE])
        write_marker(self.out, marker)
        for name in names:
            fault_point("publish")
            fs.replace(os.path.join(self.tmp, name), os.path.join(self.out, name))
        fs.replace(os.path.join(self.tmp, mf.MANIFEST_FILE), os.path.join(self.out, mf.MANIFEST_FILE))
        fault_point("published")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._unlock()
        return manifest

    def abort(self) -> None:
        """Drop everything written so far: an aborted pack leaves no trace that looks finished.
        Files already moved into OUT by a commit that failed half-way are ours (the marker
        lists them) and go too."""
        for w in self.writers:
            w.close()
        marker = read_marker(self.out)
        if marker and not os.path.exists(os.path.join(self.out, mf.MANIFEST_FILE)):
            for name in marker.get("publishing", []):
                if os.path.exists(os.path.join(self.tmp, name)):
                    continue  # still in .partial: not moved, nothing of ours in OUT by that name
                try:
                    _remove_file(self.out, name)
                except (OSError, RecordtoolError):
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._unlock()

    def release(self) -> None:
        """Stop holding OUT's lock after a failure, leaving .partial as it is: its finished
        shards are for the next run of the same plan to reuse."""
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


_faults: dict = {}
_FAULT = os.environ.get("RECORDTOOL_FAULT", "")  # read once: fault_point sits on the per-record path


def fault_point(name: str) -> None:
    """Crash-test hook: RECORDTOOL_FAULT=name:N kills the process (SIGKILL) at the N-th hit of name.

    Lets the tests stop a pack at exact moments (mid-shard, between renames) to prove a
    killed pack never looks finished and a re-run is byte-identical. `name:N:FLAG` fires
    only in the one process that creates the file FLAG first (a worker killed once, then
    retried by Ray).
    """
    if not _FAULT:
        return
    want, _, rest = _FAULT.partition(":")
    if want != name:
        return
    count, _, flag = rest.partition(":")
    _faults[name] = _faults.get(name, 0) + 1
    if _faults[name] >= int(count or 1):
        if flag:
            try:
                os.close(files.create_exclusive(flag))
            except FileExistsError:
                return
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
