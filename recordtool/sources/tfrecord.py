"""TFRecord files (tf-slim ImageNet, TFDS) as a pack source — no TensorFlow needed.

A record is uint64 length, uint32 masked CRC32C of the length, data, uint32 masked CRC32C
of the data. Both CRCs are checked (C-accelerated crc32c). GZIP/ZLIB files are inflated into
a scratch file first, and files on object storage (s3://…) downloaded there, so every file is
then read by offset the same way.
"""
from __future__ import annotations

import glob
import mmap
import os
import shutil
import struct
import threading
import zlib
from dataclasses import dataclass, field

import crc32c

from ..errors import FormatError, OnError, PackError, Rejected, TFRecordError, on_error as _on_error, report
from ..io import files as _files
from ..io import transfer
from ..io.fs import get_fs, is_url
from ..io.transfer import Retry
from ..format.ofrecord import MIN_RECORD_BYTES
from ..checks import CLASSES_LIMIT, bounded_int
from ..format.schema import MAX_IMAGE_BYTES
from .base import DEFAULT_MAX_CLASSES, SourceArgs, no_classes

DEFAULT_MAX_INFLATE = 20.0  # a compressed file may inflate to this many times its size …
INFLATE_FLOOR = 256 << 20  # … or to this many bytes, whichever is larger (JPEG records barely compress)

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


def masked_crc(data) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord record (used by tests and tools that write TFRecords)."""
    length = struct.pack("<Q", len(data))
    return length + _U32.pack(masked_crc(length)) + data + _U32.pack(masked_crc(data))


@dataclass(slots=True)
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
    Records too short to hold an image are counted, not listed one by one (one problem per
    file), so millions of tiny records cost neither memory nor a report line each.
    """
    pos, n = 0, len(buf)
    tiny, first_tiny = 0, -1
    while pos < n:
        if n - pos < _HDR.size:
            _problem(out, policy, name, pos, f"truncated: {n - pos} trailing bytes, too few for a record header")
            break
        length, lcrc = _HDR.unpack_from(buf, pos)
        if masked_crc(buf[pos:pos + 8]) != lcrc:
            _problem(out, policy, name, pos, "length CRC mismatch (corrupt record header); rest of file skipped")
            break
        end = pos + 12 + length + 4
        if end > n:
            _problem(out, policy, name, pos, f"truncated: record of {length} bytes needs {end - pos} bytes, "
                                             f"file has {n - pos} left")
            break
        if length < MIN_RECORD_BYTES:
            tiny += 1
            if first_tiny < 0:
                first_tiny = pos
        else:
            (dcrc,) = _U32.unpack_from(buf, pos + 12 + length)
            if masked_crc(buf[pos + 12:pos + 12 + length]) != dcrc:
                _problem(out, policy, name, pos, "data CRC mismatch; record skipped")
            else:
                out.spans.append(Span(file_no, pos, length))
        pos = end
    if tiny:
        _problem(out, policy, name, first_tiny, f"{tiny} record(s) shorter than {MIN_RECORD_BYTES} bytes, too short "
                                                "to hold an image, skipped (the first is here)")


def _problem(out, policy, name, offset, reason):
    report(policy, f"{name}: offset {offset}: {reason}", TFRecordError, stacklevel=4)
    out.problems.append((name, offset, reason))


def expand(patterns, storage_options: dict | None = None) -> list[str]:
    """Globs and plain paths, local or object-store URLs (s3://bucket/train-*) → sorted,
    de-duplicated file list (URLs stay URLs).

    Args:
        patterns: paths, URLs and globs of either.
        storage_options: fsspec options for the URLs.
    """
    files = []
    for p in patterns:
        wild = any(ch in p for ch in "*?[")
        if is_url(p):  # one listing per glob; a plain URL is checked by its download
            fs, path = get_fs(p, **(storage_options or {}))
            hits = [fs.url(h) for h in fs.glob(path)] if wild else [p]
        else:
            hits = sorted(glob.glob(p)) if wild else [p]
            for h in hits:
                if not os.path.isfile(h):
                    raise FileNotFoundError(f"{h}: not a file")
        if not hits:
            raise FileNotFoundError(f"{p}: no file matches")
        files.extend(h for h in hits if h not in files)
    return files


def download(url: str, tmpdir: str, tag: int, storage_options: dict | None = None, retry: Retry | None = None) -> str:
    """A local copy of a remote TFRecord file in the source's scratch folder (removed by
    close()). Refused before it starts when the disk there has no room for it; retried like
    any remote read.

    Args:
        url: the file's URL.
        tmpdir: the scratch folder.
        tag: the file's number in the source (keeps copies of equal names apart).
        storage_options: fsspec options for the URL.
        retry: how the download is retried (recordtool.io.Retry).
    """
    fs, path = get_fs(url, **(storage_options or {}))
    retry = retry or Retry()
    try:
        size = retry.call(lambda: fs.size(path), url)
    except FileNotFoundError:
        raise FileNotFoundError(f"{url}: no such file") from None
    free = shutil.disk_usage(tmpdir).free
    if size > free:
        raise PackError(f"{url}: {size} bytes to download into {tmpdir}, which has {free} bytes free; "
                        f"pass a scratch folder with room (tmpdir)")
    local = os.path.join(tmpdir, f"{tag:05d}-{os.path.basename(path)[:100]}.download")  # within NAME_MAX
    return transfer.download(fs, path, local, size, retry)


def _looks_uncompressed(head: bytes) -> bool:
    return len(head) >= 12 and masked_crc(head[:8]) == _U32.unpack_from(head, 8)[0]


def _looks_zlib(head: bytes) -> bool:
    """RFC 1950 header: deflate method, window ≤ 32K, header check bits."""
    return len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0


def inflate(path: str, tmpdir: str, compression: str, tag: int = 0,
            max_inflate: float = DEFAULT_MAX_INFLATE) -> tuple[str, str | None]:
    """Return a path holding the uncompressed records (the file itself when not compressed),
    and a problem string when the compressed stream was damaged or inflated past
    max(max_inflate × its size, INFLATE_FLOOR) bytes (what came before is kept).
    FormatError when `compression="auto"` finds neither records nor a GZIP/ZLIB stream."""
    fd = _files.open_regular(path, follow=True)  # a FIFO or device is refused, not waited on
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(12)
    if compression == "auto":
        if _looks_uncompressed(head) or not head:
            return path, None
        if head[:2] == b"\x1f\x8b":
            compression = "gzip"
        elif _looks_zlib(head):
            compression = "zlib"
        else:
            raise TFRecordError(f"{path}: offset 0: not a TFRecord file (the first record's length CRC does not "
                                "match) and not GZIP or ZLIB compressed")
    if compression == "none":
        return path, None
    wbits = 31 if compression == "gzip" else 15
    limit = max(int(max_inflate * size), INFLATE_FLOOR)
    os.makedirs(tmpdir, exist_ok=True)
    out_path = os.path.join(tmpdir, f"{tag:05d}-{os.path.basename(path)}.raw")
    d = zlib.decompressobj(wbits)
    problem = None
    consumed = written = 0
    fd = _files.open_regular(path, follow=True)
    with os.fdopen(fd, "rb") as f, open(_files.create_exclusive(out_path), "wb", closefd=True) as o:
        while problem is None and not d.eof:
            chunk = f.read(1 << 20)
            if not chunk:
                problem = f"{compression} stream truncated at compressed offset {consumed}"
                break
            data = chunk
            while data and problem is None:
                try:  # at most 4 MiB out per step: a bomb never sits in memory whole
                    piece = d.decompress(data, 4 << 20)
                except zlib.error as e:
                    problem = f"{compression} stream corrupt near compressed offset {consumed} ({e})"
                    break
                written += len(piece)
                if written > limit:
                    problem = (f"{compression} stream inflates past {limit} bytes ({max_inflate:g}x its {size}; "
                               "--max-inflate): decompression bomb? stopped there")
                    break
                o.write(piece)
                data = d.unconsumed_tail
                if d.eof:
                    break
            consumed += len(chunk)
    return out_path, problem


class TFRecordSource:
    """Records of TFRecord files, by offset; each holds a tf.train.Example (a `Source`).

    Args:
        patterns: file paths or globs.
        keys: feature keys — image, label, label_offset, filename, synset, text (see PRESETS).
        tmpdir: where GZIP/ZLIB files are inflated and remote files downloaded (a fresh
            temporary folder inside it, removed by close()).
        compression: "auto", "none", "gzip" or "zlib".
        on_error: a damaged record or stream: "raise", "warn" or "skip" (listed in the pack
            report either way).
        max_inflate: a GZIP/ZLIB file may inflate to this many times its size (at least
            256 MiB); past that the rest of the file is skipped and reported.
        max_classes: records with a label ≥ this are refused (a class name is stored per label).
        storage_options: fsspec options for URL patterns (s3://bucket/train-*); each remote
            file is downloaded into the scratch folder first, then read like a local one.
    """

    kind = "tfrecord"  # --from tfrecord too

    @classmethod
    def usage(cls, args: SourceArgs) -> str | None:
        """No class folders to number; the feature keys must be known (a preset or both keys)."""
        unknown = args.keys is None and not (args.image_key and args.label_key)
        return no_classes(cls.kind, args) or (
            "--from tfrecord needs --keys or both --image-key and --label-key" if unknown else None)

    @classmethod
    def open(cls, args: SourceArgs) -> "TFRecordSource":
        """`args.paths` (files, globs, URLs), keys: the preset's and those given; scratch beside OUT."""
        keys = {"image": None, "label": None, "label_offset": 0, "filename": None, "synset": None, "text": None,
                **(PRESETS[args.keys] if args.keys else {})}
        given = {"image": args.image_key, "label": args.label_key, "label_offset": args.label_offset,
                 "filename": args.filename_key}
        keys.update({k: v for k, v in given.items() if v is not None}, preset=args.keys)
        parent = None if is_url(args.out) else os.path.dirname(os.path.abspath(args.out))  # remote OUT: $TMPDIR
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        return cls(list(args.paths), keys, tmpdir=parent, compression=args.compression, on_error=args.on_error,
                   max_inflate=args.max_inflate or DEFAULT_MAX_INFLATE, max_classes=args.max_classes)

    def __init__(self, patterns, keys: dict, tmpdir: str | None = None, compression: str = "auto",
                 on_error: OnError | str = "skip", max_inflate: float = DEFAULT_MAX_INFLATE,
                 max_classes: int = DEFAULT_MAX_CLASSES, storage_options: dict | None = None):
        import tempfile

        policy = _on_error(on_error)

        self.files = expand(patterns, storage_options)
        self._owner = True  # a copy unpickled elsewhere (a Ray worker) never removes the scratch folder
        self._lock = threading.Lock()
        self.keys = keys
        self.compression = compression
        self.max_classes = bounded_int("max_classes", max_classes, 1, CLASSES_LIMIT)
        self.skipped, self.warnings = [], []
        self._paths, self._maps = [], []
        self._tmp = tempfile.mkdtemp(prefix="recordtool-tfrecord-", dir=tmpdir)
        try:
            self._list(policy, compression, max_inflate, storage_options)
        except BaseException:  # no scratch file survives a failure
            self.close()
            raise

    def _list(self, policy, compression, max_inflate, storage_options):
        result = ScanResult()
        for k, path in enumerate(self.files):
            local = download(path, self._tmp, k, storage_options) if is_url(path) else path
            raw, problem = inflate(local, self._tmp, compression, k, max_inflate)
            if raw != local and local != path:  # the inflated copy is what is read: drop the download
                os.unlink(local)
            if problem:
                report(policy, f"{path}: {problem}", TFRecordError)
                result.problems.append((path, 0, problem + "; records before it kept"))
            self._paths.append(os.path.abspath(raw))
            fd = _files.open_regular(raw, follow=True)
            try:
                size = os.fstat(fd).st_size
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
            finally:
                os.close(fd)
            self._maps.append(mm)
            name = path if raw in (path, local) else f"{path} (inflated)"
            scan_buffer(mm, name, k, policy, result)
        self.items = result.spans
        self.skipped = [(f"{f}: offset {off}", why) for f, off, why in result.problems]
        self._names: dict = {}  # label → ((file, offset) of the first record naming it, synset, text)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_maps=None, _lock=None, _owner=False)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _map(self, k: int):
        if self._maps is None:  # an unpickled copy maps its files on first use
            with self._lock:
                if self._maps is None:
                    maps = []
                    for path in self._paths:
                        try:
                            fd = _files.open_regular(path, follow=True)
                        except FileNotFoundError:
                            raise FileNotFoundError(
                                f"{path}: not found on this node; compressed TFRecords are inflated into "
                                f"{self._tmp}, which must be on storage every Ray node sees") from None
                        try:
                            size = os.fstat(fd).st_size
                            maps.append(mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b"")
                        finally:
                            os.close(fd)
                    self._maps = maps
        return self._maps[k]

    def where(self, item: Span) -> str:
        return f"{self.files[item.file]}: offset {item.offset}"

    def load(self, item: Span):
        """(image bytes, label, filename bytes) or raise Rejected."""
        from ..format import example_pb2

        if item.length > MAX_IMAGE_BYTES + (1 << 20):  # refused unread: no copy of a huge record
            raise Rejected(f"record of {item.length} bytes, more than an image of at most {MAX_IMAGE_BYTES} needs")
        data = self._map(item.file)[item.offset + 12:item.offset + 12 + item.length]
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
        if label >= self.max_classes:
            raise Rejected(f"label {label} is not below max_classes {self.max_classes} (--max-classes)")
        fn = b""
        if k.get("filename") and k["filename"] in feats and feats[k["filename"]].bytes_list.value:
            fn = feats[k["filename"]].bytes_list.value[0]
        at = [item.file, item.offset]
        known = self._names.get(label)
        if known is None or at < known[0]:  # the first record in file order names the class
            names = []
            for key in ("synset", "text"):
                if k.get(key) and k[key] in feats and feats[k[key]].bytes_list.value:
                    names.append(feats[k[key]].bytes_list.value[0].decode("utf-8", "replace"))
                else:
                    names.append(None)
            self.merge_notes({label: [at, *names]})
        return image, label, fn

    def notes(self) -> dict:
        """{str(label): [[file, offset], synset, text]}: class names met so far."""
        with self._lock:
            return {str(k): list(v) for k, v in self._names.items()}

    def merge_notes(self, notes: dict) -> None:
        """Keep, per label, the names of the record first in file order: the same names
        whatever the order items were loaded in, by whichever threads or workers."""
        with self._lock:
            for label, (at, synset, text) in notes.items():
                label, at = int(label), list(at)
                known = self._names.get(label)
                if known is None or at < known[0]:
                    self._names[label] = (at, synset, text)

    def classes(self, max_label: int) -> tuple[list, list | None]:
        names = [self._names.get(i, (None, None, None))[1:] for i in range(max_label + 1)]
        classes = [s or t or str(i) for i, (s, t) in enumerate(names)]
        texts = [t for _, t in names] if any(t for _, t in names) else None
        return classes, texts

    def describe(self) -> dict:
        return {"kind": self.kind, "files": self.files, "records": len(self.items), "keys": self.keys,
                "compression": self.compression}

    def close(self):
        for mm in self._maps or []:
            if isinstance(mm, mmap.mmap):
                mm.close()
        self._maps = None if not self._owner else []
        if self._owner and getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)
