"""Write a dataset directory: part files, index, manifest — all or nothing.

Everything is written under OUT/.partial/ and moved into OUT only when complete, manifest
last: a dataset is finished exactly when manifest.json exists. A killed pack leaves
.partial/ behind, which the next run removes before starting again.
"""
from __future__ import annotations

import os
import shutil

import crc32c

from ..errors import OutputExists
from . import files
from . import index as ix
from . import manifest as mf
from .jpeg import JpegInfo
from .ofrecord import LENGTH_SIZE, encode_ofrecord, frame

PARTIAL_DIR = ".partial"
SHARD_PREFIX = "part-"
SHARD_DIGITS = 5

# OneFlow ImageNet converter's keys
KEY_IMAGE = "encoded"
KEY_LABEL = "class/label"
KEY_HEIGHT = "height"
KEY_WIDTH = "width"
KEY_FILENAME = "filename"


def shard_name(i: int) -> str:
    return f"{SHARD_PREFIX}{i:0{SHARD_DIGITS}d}"


def claim_output(out: str, overwrite: bool) -> None:
    """Make OUT ready for a new pack, refusing to clobber anything that is not ours."""
    os.makedirs(out, exist_ok=True)
    names = set(os.listdir(out))
    finished = mf.MANIFEST_FILE in names
    ours = finished or PARTIAL_DIR in names
    if names and not ours:
        raise OutputExists(f"{out}: not empty and holds no recordtool dataset; "
                           "choose an empty or new directory")
    if finished and not overwrite:
        raise OutputExists(f"{out}: already holds a finished dataset; pass --overwrite to replace it")
    # remove what a finished or killed pack of ours left: manifest first, so a kill during the
    # cleanup still leaves nothing that looks finished
    for name in sorted(names, key=lambda nm: nm != mf.MANIFEST_FILE):
        if name in (ix.INDEX_FILE, mf.REPORT_FILE, mf.MANIFEST_FILE) or \
                (name.startswith(SHARD_PREFIX) and name[len(SHARD_PREFIX):].isdigit()):
            os.remove(os.path.join(out, name))
    shutil.rmtree(os.path.join(out, PARTIAL_DIR), ignore_errors=True)
    os.makedirs(os.path.join(out, PARTIAL_DIR))


class ShardWriter:
    """One part file: records appended in order, its CRC32C and index rows kept as it goes.
    Shards are independent files, so several can be written by different threads at once."""

    def __init__(self, path: str, number: int):
        self.number = number
        self.name = os.path.basename(path)
        self.index = ix.IndexBuilder()
        self.pos = 0
        self.crc = 0
        self.records = 0
        self._fd = files.create_exclusive(path)

    def add(self, jpeg: bytes, info: JpegInfo, label: int, filename: bytes) -> None:
        enc = encode_ofrecord({KEY_IMAGE: jpeg, KEY_LABEL: int(label), KEY_HEIGHT: info.height,
                               KEY_WIDTH: info.width, KEY_FILENAME: filename}, locate=KEY_IMAGE)
        pieces = frame(enc)
        offset = self.pos
        total = LENGTH_SIZE + enc.size
        # One writev per record: measured faster than gathering records into big blocks,
        # which costs an extra copy of every byte.
        written = os.writev(self._fd, pieces)
        if written < total:  # short write: finish the rest
            rest = memoryview(b"".join(bytes(p) for p in pieces))[written:]
            while len(rest):
                rest = rest[os.write(self._fd, rest):]
        for p in pieces:
            self.crc = crc32c.crc32c(p, self.crc)
        self.pos += total
        self.index.add(self.number, offset, enc.size, offset + LENGTH_SIZE + enc.payload_offset, len(jpeg), label,
                       info)
        self.records += 1

    def close(self) -> dict:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return {"name": self.name, "records": self.records, "bytes": self.pos, "crc32c": f"{self.crc:08x}"}


class DatasetWriter:
    """Part files, then `commit()` publishes the dataset atomically. Shards are either opened
    in turn (`new_shard` + `add`) or all at once (`open_shards`) for writers running in parallel."""

    def __init__(self, out: str, overwrite: bool = False):
        self.out = out
        claim_output(out, overwrite)
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
        self.writers.append(ShardWriter(os.path.join(self.tmp, shard_name(k)), k))
        return self.writers[-1]

    def open_shards(self, n: int) -> list:
        for _ in range(n):
            k = len(self.writers)
            self.writers.append(ShardWriter(os.path.join(self.tmp, shard_name(k)), k))
        return self.writers

    def add(self, jpeg: bytes, info: JpegInfo, label: int, filename: bytes) -> None:
        if not self.writers:
            self.new_shard()
        self.writers[-1].add(jpeg, info, label, filename)

    def commit(self, fields: dict, report: dict | None = None) -> dict:
        """Write index + manifest (`fields`: manifest.build's arguments beyond the shards and
        the index), then move everything into place, manifest last."""
        shards = [w.close() for w in self.writers]
        builder = ix.IndexBuilder()
        for w in self.writers:
            builder.extend(w.index)
        index = builder.finish()
        blob = ix.encode_index(index)
        files.write_new(os.path.join(self.tmp, ix.INDEX_FILE), blob)
        names = [s["name"] for s in shards] + [ix.INDEX_FILE]
        fields = dict(fields)
        if report is not None:
            files.write_new(os.path.join(self.tmp, mf.REPORT_FILE), mf.dump(report))
            names.append(mf.REPORT_FILE)
            fields["report"] = mf.REPORT_FILE
        manifest = mf.build(records=len(index), shards=shards,
                            index={"file": ix.INDEX_FILE, "bytes": len(blob), "crc32c": f"{crc32c.crc32c(blob):08x}"},
                            keys={"image": KEY_IMAGE, "label": KEY_LABEL, "height": KEY_HEIGHT, "width": KEY_WIDTH,
                                  "filename": KEY_FILENAME}, **fields)
        files.write_new(os.path.join(self.tmp, mf.MANIFEST_FILE), mf.dump(manifest))
        for name in names:
            fault_point("publish")
            os.replace(os.path.join(self.tmp, name), os.path.join(self.out, name))
        os.replace(os.path.join(self.tmp, mf.MANIFEST_FILE), os.path.join(self.out, mf.MANIFEST_FILE))
        fault_point("published")
        shutil.rmtree(self.tmp, ignore_errors=True)
        return manifest

    def abort(self) -> None:
        """Drop everything written so far: an aborted pack leaves no trace that looks finished."""
        for w in self.writers:
            w.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


_faults: dict = {}
_FAULT = os.environ.get("RECORDTOOL_FAULT", "")  # read once: fault_point sits on the per-record path


def fault_point(name: str) -> None:
    """Crash-test hook: RECORDTOOL_FAULT=name:N kills the process (SIGKILL) at the N-th hit of name.

    Lets the tests stop a pack at exact moments (mid-shard, between renames) to prove a
    killed pack never looks finished and a re-run is byte-identical.
    """
    if not _FAULT:
        return
    want, _, count = _FAULT.partition(":")
    if want != name:
        return
    _faults[name] = _faults.get(name, 0) + 1
    if _faults[name] >= int(count or 1):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
