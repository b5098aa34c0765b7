"""One unit of pack work, the same whatever the engine: load and fix an item (`load_item`),
and fill one planned part file (`fill_shard`) into OUT/.partial, recorded as finished in
`part-NNNNN.done.json` (`ShardDone`) so that a re-run of the same plan reuses it (`finished`).

Engines (engines.py) only decide where these run: a thread, a worker process, a Ray task.
"""
from __future__ import annotations

import copy
import json
import threading
import uuid
from dataclasses import dataclass

from ..errors import FormatError, OnError, PackError, Rejected, ShardStopped
from ..format import index as ix
from ..format.schema import DONE_MAX_BYTES, DONE_SUFFIX
from ..format.writer import ShardWriter
from ..io.fs import get_fs
from ..sources.base import Source
from .plan import PLAN_VERSION, Options, ShardTask
from .transcode import prepare


def load_item(source: Source, item, options: Options) -> tuple:
    """(item, `Prepared` — or the `Rejected` saying why not —, label, filename) of one item."""
    try:
        data, label, filename = source.load(item)
        return item, prepare(data, max_pixels=options.max_pixels, transcode=options.transcode), label, filename
    except Rejected as e:
        return item, e, None, None


def load_chunk(source: Source, chunk: list, options: Options) -> tuple:
    """`load_item` over a chunk, with what the source learned for their labels (`notes_of`):
    what a worker process or Ray task hands back to the driver of a by-size pack."""
    results = [load_item(source, it, options) for it in chunk]
    return results, notes_of(source, {label for _, res, label, _ in results if not isinstance(res, Rejected)})


def notes_of(source, labels) -> dict:
    """What the source learned loading items (`Source.notes`: TFRecord class names), for these
    labels only — what a task hands back to the driver."""
    notes = source.notes() if hasattr(source, "notes") else {}
    return {k: v for k, v in notes.items() if int(k) in labels}


def merge_notes(source, notes: dict) -> None:
    if notes and hasattr(source, "merge_notes"):
        source.merge_notes(notes)


def light_source(source):
    """The source without its item list (each task carries its own items): what is shipped once
    to worker processes or Ray workers."""
    light = copy.copy(source)
    light.items = []
    light.skipped = []
    return light


@dataclass
class ShardDone:
    """What a finished shard task hands back, and what `part-NNNNN.done.json` keeps.

    Attributes:
        number: part file number.
        hash: the `ShardTask.hash` it was made under.
        info: its manifest entry {name, records, bytes, crc32c}.
        rows: its index rows (`IndexBuilder.rows()`).
        skipped, converted: [where, reason] of its items.
        notes: what the source learned loading them (`Source.notes`).
    """

    number: int
    hash: str
    info: dict
    rows: dict
    skipped: list
    converted: list
    notes: dict

    def to_json(self) -> dict:
        return {"plan_version": PLAN_VERSION, "number": self.number, "hash": self.hash, "shard": self.info,
                "rows": self.rows, "skipped": self.skipped, "converted": self.converted, "notes": self.notes}

    @classmethod
    def from_json(cls, d, where: str) -> "ShardDone":
        if not isinstance(d, dict) or d.get("plan_version") != PLAN_VERSION:
            raise FormatError(f"{where}: not a finished-shard record of this recordtool")
        for key, typ in (("number", int), ("hash", str), ("shard", dict), ("rows", dict), ("skipped", list),
                         ("converted", list), ("notes", dict)):
            if not isinstance(d.get(key), typ):
                raise FormatError(f"{where}: {key!r} must be a {typ.__name__}")
        ix.IndexBuilder.from_rows(d["rows"], where)  # checked here, so a bad record is never half-used
        return cls(d["number"], d["hash"], d["shard"], d["rows"], d["skipped"], d["converted"], d["notes"])


def fill_shard(task: ShardTask, source: Source, options: Options, partial: str, fs=None,
               progress=None, stop: threading.Event | None = None) -> ShardDone:
    """Read, fix and write one part file into `partial` (OUT/.partial), then record it as
    finished: the part file is written under a temporary name, flushed, renamed, and only then
    is `part-NNNNN.done.json` written (atomically) — nothing half-written is ever reused.

    Args:
        task: the shard's number, name, items and plan hash.
        source: where the items load from.
        options: max_pixels, transcode, on_error (RAISE: the first bad item raises PackError
            naming it; otherwise bad items are listed in the result).
        partial: the folder to write into, in `fs`'s syntax.
        fs: the `FileSystem` of `partial` (default: local disk).
        progress: called with 1 after each item.
        stop: when set, the task stops early (raises `ShardStopped`).
    """
    if fs is None:
        fs, partial = get_fs(partial)
    final = fs.join(partial, task.name)
    tmp = fs.join(partial, f"{task.name}.{uuid.uuid4().hex}.tmp")
    skipped, converted = [], []
    writer = ShardWriter(tmp, task.number, fs, name=task.name)
    try:
        for item in task.items:
            if stop is not None and stop.is_set():
                raise ShardStopped(task.name)
            item, res, label, filename = load_item(source, item, options)
            if isinstance(res, Rejected):
                where = source.where(item)
                if options.on_error is OnError.RAISE:
                    raise PackError(f"{where}: {res}")
                skipped.append([where, str(res)])
            else:
                if res.converted:
                    converted.append([source.where(item), f"re-encoded: {res.converted}"])
                writer.add(res.data, res.info, label, filename)
            if progress is not None:
                progress(1)
        info = writer.close(durable=True)
    except BaseException:
        writer.discard()  # no flush: after ENOSPC it would fail again and keep the file
        try:
            fs.remove(tmp)
        except OSError:
            pass
        raise
    done = ShardDone(task.number, task.hash, info, writer.index.rows(), skipped, converted,
                     notes_of(source, set(writer.index.labels())))
    fs.replace(tmp, final)
    record = fs.join(partial, task.name + DONE_SUFFIX)
    tmp_record = f"{record}.{uuid.uuid4().hex}.tmp"
    fs.write_bytes(tmp_record, json.dumps(done.to_json(), separators=(",", ":")).encode())  # compact: never published
    fs.replace(tmp_record, record)
    return done


def finished(task: ShardTask, partial: str, fs) -> ShardDone | None:
    """The record of `task`'s shard when an earlier run finished it under the same plan hash and
    its part file is there at the recorded size; None otherwise (the shard is redone)."""
    record = fs.join(partial, task.name + DONE_SUFFIX)
    try:
        if not fs.exists(record):
            return None
        done = ShardDone.from_json(json.loads(fs.read_bytes(record, DONE_MAX_BYTES)), record)
        if done.hash != task.hash or done.number != task.number or done.info.get("name") != task.name:
            return None
        if fs.size(fs.join(partial, task.name)) != done.info.get("bytes"):
            return None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return done
