"""TFRecord files (tf-slim ImageNet, TFDS) as a pack source — no TensorFlow needed.

A record is uint64 length, uint32 masked CRC32C of the length, data, uint32 masked CRC32C
of the data. Both CRCs are checked (C-accelerated crc32c). GZIP/ZLIB files are inflated into
a scratch file first, so every file is then read by offset the same way.
"""
from __future__ import annotations

import glob
import mmap
import os
import struct
import zlib
from dataclasses import dataclass, field

import crc32c

from ..errors import FormatError, OnError, on_error as _on_error, report
from .image import Rejected

_HDR = struct.Struct("<QI")
_U32 = struct.Struct("<I")

PRESETS = {
    # tf-slim / TF models build_imagenet_data.py: labels 1-based (0 = background)
    "tf-slim": {"image": "image/encoded", "label": "image/class/label", "label_offset": -1,
                "filename": "image/filename", "synset": "image/class/synset", "text": "image/class/text"},
    # tensorflow_datasets imagenet2012
    "tfds": {"image": "image", "label": "label", "label_offset": 0, "filename": "file_name",
             "synset": None, "text": None},
}


class TFRecordError(FormatError):
    """Bad framing or checksum; message names the file and byte offset."""


def masked_crc(data) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord record (used by tests and tools that write TFRecords)."""
    length = struct.pack("<Q", len(data))
    return length + _U32.pack(masked_crc(length)) + data + _U32.pack(masked_crc(data))


@dataclass
class Span:
    file: int  # index into the source's file list
    offset: int  # of the record header, in the (inflated) file
    length: int  # of the data


@dataclass
class ScanResult:
    spans: list = field(default_factory=list)
    problems: list = field(default_factory=list)  # (file, offset, reason)


def scan_buffer(buf, name: str, file_no: int, policy: OnError, out: ScanResult) -> None:
    """Walk one file's records, checking both CRCs.

    A bad data CRC skips that record only (its length was verified, framing holds); a bad
    length CRC or a truncated record ends this file, since nothing after it can be trusted.
    """
    pos, n = 0, len(buf)
    while pos < n:
        if n - pos < _HDR.size:
            _problem(out, policy, name, pos, f"truncated: {n - pos} trailing bytes, too few for a record header")
            return
        length, lcrc = _HDR.unpack_from(buf, pos)
        if masked_crc(buf[pos:pos + 8]) != lcrc:
            _problem(out, policy, name, pos, "length CRC mismatch (corrupt record header); rest of file skipped")
            return
        end = pos + 12 + length + 4
        if end > n:
            _problem(out, policy, name, pos, f"truncated: record of {length} bytes needs {end - pos} bytes, "
                                             f"file has {n - pos} left")
            return
        (dcrc,) = _U32.unpack_from(buf, pos + 12 + length)
        if masked_crc(buf[pos + 12:pos + 12 + length]) != dcrc:
            _problem(out, policy, name, pos, "data CRC mismatch; record skipped")
        else:
            out.spans.append(Span(file_no, pos, length))
        pos = end


def _problem(out, policy, name, offset, reason):
    report(policy, f"{name}: offset {offset}: {reason}", TFRecordError, stacklevel=4)
    out.problems.append((name, offset, reason))


def expand(patterns) -> list[str]:
    """Globs and plain paths → sorted, de-duplicated file list."""
    files = []
    for p in patterns:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else [p]
        if not hits:
            raise FileNotFoundError(f"{p}: no file matches")
        for h in hits:
            if not os.path.isfile(h):
                raise FileNotFoundError(f"{h}: not a file")
            if h not in files:
                files.append(h)
    return files


def _looks_uncompressed(head: bytes) -> bool:
    return len(head) >= 12 and masked_crc(head[:8]) == _U32.unpack_from(head, 8)[0]


def inflate(path: str, tmpdir: str, compression: str, tag: int = 0) -> tuple[str, str | None]:
    """Return a path holding the uncompressed records (the file itself when not compressed),
    and a problem string when the compressed stream was damaged (what came before is kept)."""
    with open(path, "rb") as f:
        head = f.read(12)
    if compression == "auto":
        if _looks_uncompressed(head) or not head:
            return path, None
        compression = "gzip" if head[:2] == b"\x1f\x8b" else "zlib"
    if compression == "none":
        return path, None
    wbits = 31 if compression == "gzip" else 15
    os.makedirs(tmpdir, exist_ok=True)
    out_path = os.path.join(tmpdir, f"{tag:05d}-{os.path.basename(path)}.raw")
    d = zlib.decompressobj(wbits)
    problem = None
    consumed = 0
    with open(path, "rb") as f, open(out_path, "wb") as o:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            try:
                o.write(d.decompress(chunk))
            except zlib.error as e:
                problem = f"{compression} stream corrupt near compressed offset {consumed} ({e})"
                break
            consumed += len(chunk)
            if d.eof:
                break
        if problem is None and not d.eof:
            problem = f"{compression} stream truncated at compressed offset {consumed}"
        if problem is None:
            o.write(d.flush())
    return out_path, problem


class TFRecordSource:
    """Records of TFRecord files, by offset; each holds a tf.train.Example (a `Source`).

    Args:
        patterns: file paths or globs.
        keys: feature keys — image, label, label_offset, filename, synset, text (see PRESETS).
        tmpdir: where GZIP/ZLIB files are inflated (a fresh temporary folder inside it, removed
            by close()).
        compression: "auto", "none", "gzip" or "zlib".
        on_error: a damaged record or stream: "raise", "warn" or "skip" (listed in the pack
            report either way).
    """

    kind = "tfrecord"

    def __init__(self, patterns, keys: dict, tmpdir: str | None = None, compression: str = "auto",
                 on_error: OnError | str = "skip"):
        import tempfile

        policy = _on_error(on_error)

        self.files = expand(patterns)
        self._tmp = tempfile.mkdtemp(prefix="recordtool-tfrecord-", dir=tmpdir)
        tmpdir = self._tmp
        self.keys = keys
        self.compression = compression
        self.skipped, self.warnings = [], []
        self._paths, self._maps = [], []
        result = ScanResult()
        for k, path in enumerate(self.files):
            raw, problem = inflate(path, tmpdir, compression, k)
            if problem:
                report(policy, f"{path}: {problem}", TFRecordError)
                result.problems.append((path, 0, problem + "; records before it kept"))
            self._paths.append(raw)
            with open(raw, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            self._maps.append(mm)
            name = path if raw == path else f"{path} (inflated)"
            scan_buffer(mm, name, k, policy, result)
        self.items = result.spans
        self.skipped = [(f"{f}: offset {off}", why) for f, off, why in result.problems]
        self._names: dict = {}  # label → (synset, text)

    def where(self, item: Span) -> str:
        return f"{self.files[item.file]}: offset {item.offset}"

    def load(self, item: Span):
        """(image bytes, label, filename bytes) or raise Rejected."""
        from ..format import example_pb2

        data = self._maps[item.file][item.offset + 12:item.offset + 12 + item.length]
        ex = example_pb2.Example()
        try:
            ex.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError
            raise Rejected(f"not a tf.train.Example ({e})") from None
        feats = ex.features.feature
        k = self.keys
        if k["image"] not in feats or not feats[k["image"]].bytes_list.value:
            raise Rejected(f"no image bytes under {k['image']!r} (keys: {sorted(feats)})")
        if k["label"] not in feats or not feats[k["label"]].int64_list.value:
            raise Rejected(f"no integer label under {k['label']!r} (keys: {sorted(feats)})")
        image = feats[k["image"]].bytes_list.value[0]
        label = int(feats[k["label"]].int64_list.value[0]) + int(k.get("label_offset", 0))
        if label < 0:
            raise Rejected(f"label {label} after offset {k.get('label_offset', 0)} is negative")
        fn = b""
        if k.get("filename") and k["filename"] in feats and feats[k["filename"]].bytes_list.value:
            fn = feats[k["filename"]].bytes_list.value[0]
        if label not in self._names:
            names = []
            for key in ("synset", "text"):
                if k.get(key) and k[key] in feats and feats[k[key]].bytes_list.value:
                    names.append(feats[k[key]].bytes_list.value[0].decode("utf-8", "replace"))
                else:
                    names.append(None)
            self._names[label] = tuple(names)
        return image, label, fn

    def classes(self, max_label: int) -> tuple[list, list | None]:
        names = [self._names.get(i, (None, None)) for i in range(max_label + 1)]
        classes = [s or t or str(i) for i, (s, t) in enumerate(names)]
        texts = [t for _, t in names] if any(t for _, t in names) else None
        return classes, texts

    def describe(self) -> dict:
        return {"kind": self.kind, "files": self.files, "records": len(self.items), "keys": self.keys,
                "compression": self.compression}

    def close(self):
        import shutil

        for mm in self._maps:
            if isinstance(mm, mmap.mmap):
                mm.close()
        self._maps = []
        shutil.rmtree(self._tmp, ignore_errors=True)
