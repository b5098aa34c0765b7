"""Build index + manifest for OFRecord part files written elsewhere (e.g. OneFlow's ImageNet).

One sequential pass per shard: frame walk, wire-format walk of each record to find the
image bytes and label, a header probe of the JPEG. Afterwards nothing scans a shard again.
"""
from __future__ import annotations

import hashlib
import mmap
import os

import crc32c

from ..checks import CLASSES_LIMIT, MAX_PIXELS, bounded_int
from ..errors import FormatError, OnError, on_error as _on_error, report
from ..io import files
from . import index as ix
from . import manifest as mf
from .jpeg import DEFAULT_MAX_PIXELS, BadJPEG, NotJPEG, decode_refusal, probe
from .ofrecord import MIN_RECORD_BYTES, BYTES_LIST, INT32_LIST, INT64_LIST, decode_ofrecord, iter_records
from .schema import KEY_FILENAME, KEY_HEIGHT, KEY_IMAGE, KEY_LABEL, KEY_WIDTH


def find_parts(root: str, prefix: str = "part-") -> list[str]:
    names = [n for n in os.listdir(root) if n.startswith(prefix) and n[len(prefix):].isdigit()]
    if not names:
        raise FormatError(f"{root}: no part files named {prefix}NNNNN")
    return sorted(names, key=lambda n: int(n[len(prefix):]))




class Tiny:
    """Counts a part's records too short to hold an image: millions of them cost one line in
    the report (and in the manifest's `skipped`), not one each."""

    def __init__(self, path: str):
        self.path, self.records, self.first = path, 0, -1

    def count(self, rec) -> bool:
        """True (and counted) when rec is too short to hold an image."""
        if rec.length >= MIN_RECORD_BYTES:
            return False
        if self.first < 0:
            self.first = rec.offset
        self.records += 1
        return True

    def reason(self) -> str:
        return (f"{self.path}: offset {self.first}: {self.records} record(s) shorter than {MIN_RECORD_BYTES} "
                "bytes, too short to hold an image, left out (the first is here)")


def part_records(mm, path: str, image_key: str, label_key: str, max_classes: int | None, policy, bad):
    """Yield (record, image span (a, b), label, feats) of each usable record of one mapped part
    file. A record whose fields do not parse goes to bad(offset, reason, None) after the policy
    (raise / warn / skip) is applied; records too short to hold an image are counted and go to
    bad(first offset, reason, Tiny) once at the end. Broken framing raises FormatError (nothing
    after it can be framed): the caller decides. Shared by `index_parts` and OFRecordSource."""
    tiny = Tiny(path)
    for rec in iter_records(mm, path):
        if tiny.count(rec):
            continue
        try:
            span, label, feats = record_fields(mm, rec, image_key, label_key, max_classes)
        except FormatError as e:
            report(policy, str(e), FormatError)
            bad(rec.offset, str(e), None)
            continue
        yield rec, span, label, feats
    if tiny.records:
        report(policy, tiny.reason(), FormatError)
        bad(tiny.first, tiny.reason(), tiny)


def record_fields(mm, rec, image_key: str, label_key: str, max_classes: int | None = None):
    """(image span (a, b), label, feats) of one framed record; FormatError names file+offset
    (also for a label < 0 or ≥ max_classes)."""
    where = f"{rec.shard}: offset {rec.offset}"
    try:
        feats = decode_ofrecord(mm, rec.data_offset, rec.data_offset + rec.length)
    except ValueError as e:
        raise FormatError(f"{where}: not a valid OFRecord message ({e})") from None
    if image_key not in feats or label_key not in feats:
        raise FormatError(f"{where}: record lacks {image_key!r} or {label_key!r} (has {sorted(feats)})")
    a, b = _bytes_span(feats[image_key], image_key, where)
    label = _int_value(feats[label_key], label_key, where)
    if label < 0:
        raise FormatError(f"{where}: negative label {label}")
    if max_classes is not None and label >= max_classes:
        raise FormatError(f"{where}: label {label} is not below max_classes {max_classes} (--max-classes)")
    return (a, b), label, feats


def synset_of(mm, feats):
    f = feats.get("class/synset")
    if f and f[0] == BYTES_LIST and f[1]:
        a, b = f[1][0]
        return bytes(mm[a:b]).decode("utf-8", "replace")
    return None


def _bytes_span(feat, key, where):
    kind, values = feat
    if kind != BYTES_LIST or len(values) != 1:
        raise FormatError(f"{where}: feature {key!r} is not a single bytes value")
    return values[0]


def _int_value(feat, key, where):
    kind, values = feat
    if kind not in (INT32_LIST, INT64_LIST) or len(values) != 1:
        raise FormatError(f"{where}: feature {key!r} is not a single integer")
    return values[0]


def index_parts(root: str, image_key: str = KEY_IMAGE, label_key: str = KEY_LABEL,
                on_error: OnError | str = "skip", progress: bool = True,
                max_classes: int = mf.MAX_CLASSES, max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
    """Scan root/part-* and write root/index.rtx + manifest.json. Returns the manifest.

    Args:
        root: folder of OFRecord part files (e.g. OneFlow's ImageNet).
        image_key, label_key: feature keys of the image bytes and the integer label.
        on_error: a record that cannot be indexed — "skip" (listed in the manifest's
            `skipped`), "warn", or "raise" (stop; nothing written).
        progress: show a tqdm bar.
        max_classes: records with a label ≥ this are left out (a class name is stored per label).
        max_pixels: images declaring more pixels are left out (the decoders refuse them).
    """
    policy = _on_error(on_error)
    # bounded before the scan: a label of 2**31 - 1 under --max-classes 2**31 was a MemoryError
    # (two billion class names) after the whole scan
    max_classes = bounded_int("max_classes", max_classes, 1, CLASSES_LIMIT)
    max_pixels = bounded_int("max_pixels", max_pixels, 1, MAX_PIXELS)
    names = find_parts(root)
    builder = ix.IndexBuilder()
    shards, skipped, synsets = [], [], {}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(os.lstat(os.path.join(root, n)).st_size for n in names), unit="B",
                   unit_scale=True, desc="index")
    for s, name in enumerate(names):
        path = os.path.join(root, name)
        mm, size = files.map_readonly(path)
        def bad(offset, reason, tiny):
            entry = {"shard": name, "offset": offset, "reason": reason}
            if tiny is not None:
                entry.update(records=tiny.records, shorter_than=MIN_RECORD_BYTES)
            skipped.append(entry)

        try:
            count = 0
            for rec, (a, b), label, feats in part_records(mm, path, image_key, label_key, max_classes, policy, bad):
                try:
                    try:
                        info = probe(mm[a:b])
                    except (NotJPEG, BadJPEG) as e:
                        raise FormatError(f"{path}: offset {rec.offset}: image is not a JPEG recordtool can "
                                          f"index ({e}); re-pack with `recordtool pack --from ofrecord`") from None
                    if info.convert_reason:
                        raise FormatError(f"{path}: offset {rec.offset}: {info.convert_reason}; re-pack with "
                                          "`recordtool pack --from ofrecord` to convert it")
                    why = decode_refusal(info, b - a, max_pixels)
                    if why:  # the decoders would refuse it: not indexed (as pack does not pack it)
                        raise FormatError(f"{path}: offset {rec.offset}: {why}")
                except FormatError as e:
                    report(policy, str(e), FormatError)
                    bad(rec.offset, str(e), None)
                    continue
                syn = synset_of(mm, feats)
                if syn is not None:
                    synsets.setdefault(label, syn)
                builder.add(s, rec.offset, rec.length, a, b - a, label, info)
                count += 1
            crc = crc32c.crc32c(mm) if size else 0
            digest = hashlib.sha256(mm).hexdigest()
        finally:
            if isinstance(mm, mmap.mmap):
                mm.close()
        shards.append({"name": name, "records": count, "bytes": size, "crc32c": f"{crc:08x}", "sha256": digest})
        if bar is not None:
            bar.update(size)
    if bar is not None:
        bar.close()
    index = builder.finish()
    if not len(index):
        raise FormatError(f"{root}: no record could be indexed ({len(skipped)} left out"
                          + (f"; first: {skipped[0]['reason']})" if skipped else ")"))
    nclasses = int(index.label.max()) + 1
    blob = ix.encode_index(index)
    manifest = mf.build(
        records=len(index), shards=shards,
        index={"file": ix.INDEX_FILE, "bytes": len(blob), "crc32c": f"{crc32c.crc32c(blob):08x}",
               "sha256": hashlib.sha256(blob).hexdigest()},
        classes=[synsets.get(k, str(k)) for k in range(nclasses)],
        keys={"image": image_key, "label": label_key, "height": KEY_HEIGHT, "width": KEY_WIDTH,
              "filename": KEY_FILENAME},
        source={"kind": "ofrecord-scan", "path": root}, skipped=skipped,
        tool={"name": "recordtool", "version": _version()})
    # index first, manifest last: a dataset is finished when its manifest exists
    files.replace_tmp(os.path.join(root, ix.INDEX_FILE), blob)
    mf.write(root, manifest)
    return manifest


def _version():
    from ..version import __version__

    return __version__
