"""The index file: per-record metadata a reader needs without touching a shard.

Layout (see FORMAT.md): magic, a JSON header naming the columns, then each column as a
little-endian array at a 64-byte-aligned offset. Opening = one mmap + np.frombuffer per
column, so 1.28M records open in well under a millisecond of parsing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..errors import FormatError
from ..io import files
from .jpeg import JpegInfo
from .manifest import FORMAT_NAME, FORMAT_VERSION

INDEX_FILE = "index.rtx"
MAGIC = b"RTINDEX\x01"
ALIGN = 64
MAX_HEADER = 1 << 20

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

    def rows(self) -> dict:
        """The rows as plain lists (JSON-able): a shard task's result, a finished shard's record."""
        return {k: list(v) for k, v in self._rows.items()}

    @classmethod
    def from_rows(cls, rows, where: str = "index rows") -> "IndexBuilder":
        """The builder `rows()` came from; FormatError when `rows` is not such a table of integers."""
        b = cls()
        if not isinstance(rows, dict) or set(rows) != set(b._rows):
            raise FormatError(f"{where}: columns {sorted(rows) if isinstance(rows, dict) else rows!r} "
                              f"are not {sorted(b._rows)}")
        n = len(rows["offset"]) if isinstance(rows["offset"], list) else -1
        for k, v in rows.items():
            if not (isinstance(v, list) and len(v) == n and all(isinstance(x, int) and not isinstance(x, bool)
                                                                  for x in v)):
                raise FormatError(f"{where}: column {k} is not a list of {n} integers")
            b._rows[k] = list(v)
        return b

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


def encode_index(index: Index) -> bytearray:
    """The bytes of index.rtx for these columns (FORMAT.md); callers write them through
    `files` (exclusive create or temp + rename) and checksum the same bytes."""
    n = len(index)
    cols = []
    for name, dtype in COLUMNS.items():
        arr = np.ascontiguousarray(index.columns[name], dtype=dtype)
        if arr.shape != (n,):
            raise ValueError(f"column {name} has shape {arr.shape}, expected ({n},)")
        cols.append((name, dtype, arr))
    # header size depends on offsets, which depend on the header size: fix the header length first
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "count": n,
              "columns": [{"name": nm, "dtype": dt, "offset": 0} for nm, dt, _ in cols]}
    hdr_len = len(json.dumps(header).encode()) + 32 * len(cols)  # room for offsets' digits
    offset = end = _align(len(MAGIC) + 4 + hdr_len)
    for entry, (_, _, arr) in zip(header["columns"], cols):
        entry["offset"] = offset
        end = offset + arr.nbytes
        offset = _align(end)
    blob = json.dumps(header).encode()
    blob += b" " * (hdr_len - len(blob))
    out = bytearray(end)  # no padding after the last column
    head = MAGIC + len(blob).to_bytes(4, "little") + blob
    out[:len(head)] = head
    for entry, (_, _, arr) in zip(header["columns"], cols):
        out[entry["offset"]:entry["offset"] + arr.nbytes] = memoryview(arr).cast("B")  # no intermediate copy
    return out


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def read_index(path: str, mapping=None) -> Index:
    """Map the index file read-only; columns are zero-copy views of the mapping. The header is
    checked (types, dtypes, column extents) before any column is made.

    Args:
        path: the index file (named in errors).
        mapping: its bytes already mapped (a checked cached copy), instead of mapping `path`.
    """
    if mapping is not None:
        mm, size = mapping, len(mapping)
    else:
        try:
            mm, size = files.map_readonly(path)
        except FileNotFoundError:
            raise FormatError(f"{path}: index file missing") from None
    if size < len(MAGIC) + 4:
        raise FormatError(f"{path}: {size} bytes, too short for an index")
    if mm[:len(MAGIC)] != MAGIC:
        raise FormatError(f"{path}: offset 0: not a recordtool index (bad magic)")
    hdr_len = int.from_bytes(mm[8:12], "little")
    if hdr_len > MAX_HEADER:  # real headers are under 1 KB: never copy gigabytes to parse them
        raise FormatError(f"{path}: offset 8: header of {hdr_len} bytes, more than the {MAX_HEADER} an index has")
    if 12 + hdr_len > size:
        raise FormatError(f"{path}: offset 8: header of {hdr_len} bytes runs past the end ({size} bytes)")
    try:
        header = json.loads(mm[12:12 + hdr_len])
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: offset 12: unreadable header ({e})") from None
    except RecursionError:
        raise FormatError(f"{path}: offset 12: header nested too deeply to be an index header") from None
    if not isinstance(header, dict) or header.get("version") != FORMAT_VERSION:
        raise FormatError(f"{path}: index version {header.get('version') if isinstance(header, dict) else None!r} "
                          f"not supported (this recordtool reads {FORMAT_VERSION})")
    n = header.get("count")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise FormatError(f"{path}: offset 12: header count {n!r} is not a non-negative integer")
    entries = header.get("columns")
    if not isinstance(entries, list):
        raise FormatError(f"{path}: offset 12: header 'columns' is not a list")
    cols = {}
    for entry in entries:
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("offset"), int)
                and not isinstance(entry.get("offset"), bool) and entry["offset"] >= 0):
            raise FormatError(f"{path}: offset 12: bad column entry {entry!r}")
        name = entry["name"]
        if name in COLUMNS and entry.get("dtype") != COLUMNS[name]:
            raise FormatError(f"{path}: column {name} has dtype {entry.get('dtype')!r}, format says {COLUMNS[name]!r}")
        if name not in COLUMNS:
            continue  # readers ignore columns they do not know (FORMAT.md)
        dt = np.dtype(COLUMNS[name])
        end = entry["offset"] + n * dt.itemsize
        if end > size:
            raise FormatError(f"{path}: offset {entry['offset']}: column {name} runs past "
                              f"the end of the file ({size} bytes; truncated?)")
        if entry["offset"] % dt.itemsize:
            raise FormatError(f"{path}: offset {entry['offset']}: column {name} is not aligned")
        cols[name] = np.frombuffer(mm, dtype=dt, count=n, offset=entry["offset"]) if n else np.zeros(0, dt)
    missing = set(COLUMNS) - set(cols)
    if missing:
        raise FormatError(f"{path}: columns missing: {sorted(missing)}")
    return Index(cols, mm)
