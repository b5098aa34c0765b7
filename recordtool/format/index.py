"""The index file and the manifest: everything a reader needs without touching a shard.

Layout (see FORMAT.md): magic, a JSON header naming the columns, then each column as a
little-endian array at a 64-byte-aligned offset. Opening = one mmap + np.frombuffer per
column, so 1.28M records open in well under a millisecond of parsing.
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass

import numpy as np

from .jpeg import JpegInfo
from .ofrecord import FormatError

INDEX_FILE = "index.rtx"
MANIFEST_FILE = "manifest.json"
REPORT_FILE = "pack_report.json"
FORMAT_NAME = "recordtool-ofrecord"
FORMAT_VERSION = 1
MAGIC = b"RTINDEX\x01"
ALIGN = 64

# name → numpy dtype (little-endian). Order here is the on-disk order.
COLUMNS = {
    "shard": "<u4",          # part file number
    "offset": "<u8",         # byte offset of the record's int64 length prefix in the shard
    "length": "<u4",         # length of the serialized OFRecord (record = 8 + length bytes)
    "jpeg_offset": "<u8",    # byte offset of the encoded image bytes in the shard file
    "jpeg_length": "<u4",    # their length
    "label": "<i4",
    "width": "<i4",
    "height": "<i4",
    "chroma": "i1",          # nvJPEG chroma subsampling code, -1 unknown (recordtool.format.jpeg)
    "colorspace": "u1",      # jpeg.CS_*
    "channels": "u1",        # components in the JPEG
    "progressive": "u1",     # 1 if progressive (multi-scan) JPEG
    "size_order": "<u4",     # record numbers by jpeg_length, largest first (ties: lower number first)
}


@dataclass
class Index:
    """Column arrays, one row per record in shard order (record i of the dataset)."""

    columns: dict
    buffer: object = None  # the file mapping the columns view (read_index), for checksums

    def __getattr__(self, name):
        try:
            return self.__dict__["columns"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self):
        return len(self.columns["offset"])


class IndexBuilder:
    """Collects per-record metadata in append order; `finish()` gives the columns."""

    def __init__(self):
        self._rows = {k: [] for k in COLUMNS if k != "size_order"}

    def __len__(self):
        return len(self._rows["offset"])

    def add(self, shard: int, offset: int, length: int, jpeg_offset: int, jpeg_length: int,
            label: int, info: JpegInfo):
        r = self._rows
        r["shard"].append(shard)
        r["offset"].append(offset)
        r["length"].append(length)
        r["jpeg_offset"].append(jpeg_offset)
        r["jpeg_length"].append(jpeg_length)
        r["label"].append(label)
        r["width"].append(info.width)
        r["height"].append(info.height)
        r["chroma"].append(info.chroma)
        r["colorspace"].append(info.colorspace)
        r["channels"].append(info.channels)
        r["progressive"].append(int(info.progressive))

    def labels(self) -> list:
        return self._rows["label"]

    def extend(self, other: "IndexBuilder") -> None:
        for k, v in other._rows.items():
            self._rows[k].extend(v)

    def finish(self) -> Index:
        cols = {k: np.asarray(v, dtype=COLUMNS[k]) for k, v in self._rows.items()}
        cols["size_order"] = size_order(cols["jpeg_length"])
        return Index(cols)


def size_order(jpeg_length: np.ndarray) -> np.ndarray:
    """Largest first, stable: decode schedulers start the biggest images first."""
    return np.argsort(-jpeg_length.astype(np.int64), kind="stable").astype(COLUMNS["size_order"])


def write_index(path: str, index: Index) -> None:
    n = len(index)
    cols = []
    offset = 0
    for name, dtype in COLUMNS.items():
        arr = np.ascontiguousarray(index.columns[name], dtype=dtype)
        if arr.shape != (n,):
            raise ValueError(f"column {name} has shape {arr.shape}, expected ({n},)")
        cols.append((name, dtype, arr))
    # header size depends on offsets, which depend on the header size: fix the header length first
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "count": n,
              "columns": [{"name": nm, "dtype": dt, "offset": 0} for nm, dt, _ in cols]}
    probe = json.dumps(header).encode()
    hdr_len = len(probe) + 32 * len(cols)  # room for offsets' digits
    offset = _align(len(MAGIC) + 4 + hdr_len)
    for entry, (_, _, arr) in zip(header["columns"], cols):
        entry["offset"] = offset
        offset = _align(offset + arr.nbytes)
    blob = json.dumps(header).encode()
    blob += b" " * (hdr_len - len(blob))
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(len(blob).to_bytes(4, "little"))
        f.write(blob)
        for entry, (_, _, arr) in zip(header["columns"], cols):
            f.write(b"\0" * (entry["offset"] - f.tell()))
            f.write(arr.tobytes())


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def read_index(path: str) -> Index:
    """Map the index file read-only; columns are zero-copy views of the mapping."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(MAGIC) + 4:
                raise FormatError(f"{path}: {size} bytes, too short for an index")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise FormatError(f"{path}: index file missing") from None
    if mm[:len(MAGIC)] != MAGIC:
        raise FormatError(f"{path}: offset 0: not a recordtool index (bad magic)")
    hdr_len = int.from_bytes(mm[8:12], "little")
    try:
        header = json.loads(mm[12:12 + hdr_len])
    except ValueError as e:
        raise FormatError(f"{path}: offset 12: unreadable header ({e})") from None
    if header.get("version") != FORMAT_VERSION:
        raise FormatError(f"{path}: index version {header.get('version')} not supported "
                          f"(this recordtool reads {FORMAT_VERSION})")
    n = header["count"]
    cols = {}
    for entry in header["columns"]:
        dt = np.dtype(entry["dtype"])
        end = entry["offset"] + n * dt.itemsize
        if end > size:
            raise FormatError(f"{path}: offset {entry['offset']}: column {entry['name']} runs past "
                              f"the end of the file ({size} bytes; truncated?)")
        cols[entry["name"]] = np.frombuffer(mm, dtype=dt, count=n, offset=entry["offset"])
    missing = set(COLUMNS) - set(cols)
    if missing:
        raise FormatError(f"{path}: columns missing: {sorted(missing)}")
    return Index(cols, mm)


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST_FILE)
    try:
        with open(path, "rb") as f:
            m = json.load(f)
    except FileNotFoundError:
        hint = ""
        if os.path.isdir(os.path.join(root, ".partial")):
            hint = " (an unfinished pack is there: re-run `recordtool pack` to finish it)"
        elif any(n.startswith("part-") for n in _listdir(root)):
            hint = " (part files without an index: run `recordtool index` on them)"
        raise FormatError(f"{path}: no manifest, so {root} is not a finished recordtool dataset{hint}") \
            from None
    except ValueError as e:
        raise FormatError(f"{path}: unreadable JSON ({e})") from None
    if m.get("format") != FORMAT_NAME or m.get("format_version") != FORMAT_VERSION:
        raise FormatError(f"{path}: format {m.get('format')!r} v{m.get('format_version')} "
                          f"is not {FORMAT_NAME} v{FORMAT_VERSION}")
    return m


def dump_json(obj) -> bytes:
    """Stable JSON: same content ⇒ same bytes, so re-runs are byte-identical."""
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _listdir(root):
    try:
        return os.listdir(root)
    except OSError:
        return []
