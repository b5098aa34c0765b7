"""Write a dataset directory: part files, index, manifest — all or nothing.

Everything is written under OUT/.partial/ and moved into OUT only when complete, manifest
last: a dataset is finished exactly when manifest.json exists. What pack may replace in OUT
is decided by `format.claim` (the marker, the lock, OUT apart from SRC); this module only
writes. `DatasetWriter` is a context manager (as MosaicML Streaming's writers): the dataset
is published when the block ends cleanly, and dropped — or, for a resumable planned pack,
left in .partial for the next run — when it ends with an exception.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
from dataclasses import dataclass

import crc32c

from ..errors import OutputExists, RecordtoolError
from . import index as ix
from . import manifest as mf
from .claim import claim_output, read_marker, remove_file, write_marker
from .jpeg import JpegInfo
from .ofrecord import LENGTH_SIZE, encode_ofrecord, frame
from .schema import KEY_FILENAME, KEY_HEIGHT, KEY_IMAGE, KEY_LABEL, KEY_WIDTH, KEYS, PARTIAL_DIR, shard_name
from ..io.fs import LocalFS


class ShardWriter:
    """One part file: records appended in order, its CRC32C, SHA-256 and index rows kept as it
    goes.
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
        self.path = path
        self.name = name or os.path.basename(path)
        self.index = ix.IndexBuilder()
        self.pos = 0
        self.crc = 0
        self.sha256 = hashlib.sha256()  # (the manifest's digest: what a reader's cache checks copies against)
        self.records = 0
        self._f = (fs or LocalFS()).open_write(path)

    def add(self, jpeg: bytes, info: JpegInfo, label: int, filename: bytes) -> None:
        enc = encode_ofrecord({KEY_IMAGE: jpeg, KEY_LABEL: int(label), KEY_HEIGHT: info.height,
                               KEY_WIDTH: info.width, KEY_FILENAME: filename}, locate=KEY_IMAGE)
        offset = self.pos
        # pieces go to the (buffered) file as they are: small headers are gathered by its
        # buffer, the image bytes pass through without an extra copy
        try:
            for p in frame(enc):
                self._f.write(p)
                self.crc = crc32c.crc32c(p, self.crc)
                self.sha256.update(p)
        except OSError as e:
            raise self._named(e) from None
        self.pos += LENGTH_SIZE + enc.size
        self.index.add(self.number, offset, enc.size, offset + LENGTH_SIZE + enc.payload_offset, len(jpeg), label,
                       info)
        self.records += 1

    def close(self, durable: bool = False) -> dict:
        """Close the file (`durable`: flushed to the device first, as far as the file system
        can say) and return its manifest entry {name, records, bytes, crc32c, sha256}."""
        if self._f is not None:
            f, self._f = self._f, None
            try:
                try:
                    if durable:
                        f.flush()
                        try:
                            os.fsync(f.fileno())
                        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
                            pass  # object stores: the upload completes at close
                finally:
                    f.close()  # a failed flush still closes the file
            except OSError as e:
                raise self._named(e) from None
        return {"name": self.name, "records": self.records, "bytes": self.pos, "crc32c": f"{self.crc:08x}",
                "sha256": self.sha256.hexdigest()}

    def finish(self, durable: bool = False) -> "FinishedShard":
        return FinishedShard(self.close(durable), self.index)

    def discard(self) -> None:
        """Close the file without writing what its buffer still holds: what is thrown away must
        not need a write, which a full disk refuses (the flush of `close` would raise ENOSPC
        again, before the caller's cleanup). The file itself stays: its owner removes it."""
        if self._f is not None:
            f, self._f = self._f, None
            raw = getattr(f, "raw", None)  # a buffered file: closing its raw file drops the buffer
            try:
                (raw if raw is not None else f).close()
            except (OSError, ValueError):
                pass

    def _named(self, e: OSError) -> OSError:
        """`e` naming the part file (a buffered write's error names none: "No space left on
        device" alone does not say where)."""
        if e.filename is not None or e.errno is None or isinstance(e, RecordtoolError):
            return e
        return OSError(e.errno, e.strerror, self.path)  # the subclass of the errno (OSError picks it)


@dataclass
class FinishedShard:
    """A complete part file: its manifest entry and its index rows."""

    info: dict  # {name, records, bytes, crc32c, sha256}
    index: ix.IndexBuilder


class DatasetWriter:
    """A dataset directory being written; a context manager that publishes it on a clean exit.

    Shards are either opened in turn (`new_shard` + `add`), or written elsewhere (pack's shard
    tasks) into `tmp` and handed over as `FinishedShard`s (`finish(shards=)`). `finish` gives
    what the manifest says besides shards and index; the block's clean end then commits: index
    + manifest written, everything moved into OUT, manifest last. An exception in the block
    aborts (nothing left that looks finished) — or, when the writer is resumable (`plan`
    given), only releases the lock, so the finished shards in .partial serve the next run.

        with DatasetWriter(out, sources=source_paths(source)) as w:
            w.add(jpeg, info, label, filename)
            w.finish(fields, report)
        w.manifest  # the published manifest

    OUT is a local directory (object storage: `format.upload.staged` gives a local one).

    Args:
        out: the dataset directory (claimed at once: see `claim.claim_output`).
        overwrite: replace a finished dataset in `out`.
        sources: paths the pack reads (OUT must stay apart from them).
        plan: the plan fields of a resumable pack, kept in `.partial/pack.json`.
        resume: keep the finished shards of an unfinished earlier run of the same plan
            (`kept` says whether there were any to keep).
    """

    def __init__(self, out: str, overwrite: bool = False, sources=(), plan: dict | None = None,
                 resume: bool = True):
        self.out = out
        self.fs = LocalFS()
        self._lock, self.kept = claim_output(out, overwrite, sources, plan, resume)
        self.tmp = os.path.join(out, PARTIAL_DIR)
        self.resumable = plan is not None
        self.writers: list[ShardWriter] = []
        self.manifest: dict | None = None
        self._pending: tuple | None = None

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            if self.resumable:
                self.release()
            else:
                self.abort()
            return
        if self.manifest is None:
            if self._pending is None:
                self.abort()
                raise RuntimeError("DatasetWriter: the block ended without finish(); nothing published")
            self.commit(*self._pending)

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

    def finish(self, fields: dict, report: dict | None = None, shards: list | None = None) -> None:
        """What to publish when the block ends cleanly (see `commit` for the arguments)."""
        self._pending = (fields, report, shards)

    def commit(self, fields: dict, report: dict | None = None, shards: list | None = None) -> dict:
        """Write index + manifest, then move everything into place, manifest last. A failure
        before the manifest is published aborts (nothing left that looks finished, .partial
        removed). Called by the block's clean end after `finish`, or directly.

        Args:
            fields: the manifest's classes, source, pack options, tool, ... (manifest.build's
                arguments beyond the shards, the index and the keys).
            report: pack_report.json's content, if any.
            shards: `FinishedShard`s in part-file order, already in `tmp` (default: this
                writer's own shards).
        """
        try:
            self.manifest = self._commit(fields, report, shards)
        except BaseException:
            if not os.path.exists(os.path.join(self.out, mf.MANIFEST_FILE)):
                self.abort()
            raise
        return self.manifest

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
                            index={"file": ix.INDEX_FILE, "bytes": len(blob), "crc32c": f"{crc32c.crc32c(blob):08x}",
                                   "sha256": hashlib.sha256(blob).hexdigest()},
                            keys=dict(KEYS), **fields)
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
            self._move(name)
        fs.replace(os.path.join(self.tmp, mf.MANIFEST_FILE), os.path.join(self.out, mf.MANIFEST_FILE))
        self._published()
        return manifest

    def _move(self, name: str) -> None:
        """One file of the dataset from .partial into OUT (the manifest is moved last, apart)."""
        self.fs.replace(os.path.join(self.tmp, name), os.path.join(self.out, name))

    def _published(self) -> None:
        """After the manifest is in place: .partial removed, the lock released."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._unlock()

    def abort(self) -> None:
        """Drop everything written so far: an aborted pack leaves no trace that looks finished.
        Files already moved into OUT by a commit that failed half-way are ours (the marker
        lists them) and go too. Nothing here writes: a full disk does not stop it."""
        for w in self.writers:
            w.discard()
        marker = read_marker(self.out)
        if marker and not os.path.exists(os.path.join(self.out, mf.MANIFEST_FILE)):
            for name in marker.get("publishing", []):
                if os.path.exists(os.path.join(self.tmp, name)):
                    continue  # still in .partial: not moved, nothing of ours in OUT by that name
                try:
                    remove_file(self.out, name)
                except (OSError, RecordtoolError):
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._unlock()

    def release(self) -> None:
        """Stop holding OUT's lock after a failure, leaving .partial as it is: its finished
        shards are for the next run of the same plan to reuse."""
        for w in self.writers:
            w.discard()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
