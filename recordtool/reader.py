"""Random access to a packed dataset: index in memory, shards mmapped, JPEG bytes zero-copy.

`ds[i]` slices the JPEG bytes straight out of the shard mapping at the index's offsets —
no protobuf parse, no copy. `Dataset.sampler` gives a rank's per-epoch order
(recordtool.sampler). `recordtool.open` (recordtool.datasets) picks the kind of dataset for a
path or URL.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np
# imported now, not where first used: NumPy loads numpy.random on first access, and that first
# access (an epoch's order) is on a Loader's producer thread — a fork while it imports would
# leave the forked child the import lock, and the child's first numpy.random never returns
import numpy.random  # noqa: F401

from .checks import MAX_SIDE
from .errors import DatasetChanged, FormatError
from .format import index as ix
from .format import manifest as mf
from .io import files
from .io.fs import get_fs, is_url
from .sampler import BlockSampler, Sampler, check_block_shards
from .util import ForkLock


class ShardFiles(Protocol):
    """How a `Dataset` reaches the bytes of its shards: the local files themselves
    (`LocalShards`), or checked copies in a local cache (recordtool.remote.CachedShards).
    Invariant: a view it returns holds exactly the bytes of the manifest's shard at that
    offset (the shard's size was checked against the manifest before it was first read), and
    stays valid while it is alive.

    Attributes:
        lock: the lock shards are mapped under (a ForkLock: a forked child gets it unlocked).
    """

    lock: ForkLock

    def slice(self, shard: int, offset: int, length: int) -> memoryview:
        """`length` bytes of a shard from `offset`, zero-copy."""

    def prefetch(self, spans) -> None:
        """Start reading these (shard, offset, length) spans ahead."""

    def close(self) -> None:
        """Let go of the mappings (the `Dataset.close` of its dataset)."""


class LocalShards:
    """The shard files of a local dataset directory, each mapped read-only on first use (its
    size checked against the manifest) and kept mapped until close(). Only files inside the
    directory are opened (no links, no special files: io.files)."""

    def __init__(self, root: str, shards: list):
        self.root = root
        self.shards = shards
        self._maps: list = [None] * len(shards)
        self._views: list = [None] * len(shards)
        self.lock = ForkLock()  # producers map shards under it: a forked child gets it unlocked

    def view(self, shard: int) -> memoryview:
        """The shard's whole mapping."""
        v = self._views[shard]
        if v is None:
            with self.lock:
                v = self._views[shard]
                if v is None:
                    v = self._map(shard)
        return v

    def _map(self, shard: int) -> memoryview:
        info = self.shards[shard]
        path = files.inside(self.root, info["name"], "shard name")
        try:
            mm, size = files.map_readonly(path)
        except FileNotFoundError:
            raise FormatError(f"{path}: shard missing") from None
        if size != info["bytes"]:
            if isinstance(mm, mmap.mmap):
                mm.close()
            raise FormatError(f"{path}: {size} bytes, manifest says {info['bytes']} "
                              f"(offset {min(size, info['bytes'])}: truncated or overwritten)")
        self._maps[shard] = mm
        self._views[shard] = memoryview(mm)
        return self._views[shard]

    def slice(self, shard: int, offset: int, length: int) -> memoryview:
        return self.view(shard)[offset:offset + length]

    def prefetch(self, spans) -> None:
        """Ask the kernel to read these spans ahead (madvise WILLNEED)."""
        if not hasattr(mmap, "MADV_WILLNEED"):
            return
        page = mmap.PAGESIZE
        for shard, offset, length in spans:
            self.view(shard)
            mm = self._maps[shard]
            if not isinstance(mm, mmap.mmap):
                continue
            start = offset // page * page
            mm.madvise(mmap.MADV_WILLNEED, start, offset + length - start)

    def close(self) -> None:
        """Unmap the shards. Fails if memoryviews of them are still alive (BufferError)."""
        with self.lock:
            for k, v in enumerate(self._views):
                if v is not None:
                    v.release()
                    self._views[k] = None
            for k, mm in enumerate(self._maps):
                if isinstance(mm, mmap.mmap):
                    mm.close()
                self._maps[k] = None


class Dataset:
    """A finished dataset directory: manifest and index loaded and checked once, shards mapped
    on first use. Every index row is bounds-checked against the manifest's shard sizes when the
    dataset opens, so `ds[i]` can only return bytes of the record the index names.

    The shards' bytes come from a `ShardFiles` component (`shard_files`): the local files
    (`LocalShards`), or for a dataset on object storage the checked copies in the local shard
    cache (recordtool.remote.RemoteDataset is a Dataset built with its `CachedShards`).

    A dataset pickles as the path (and options) it was opened with and its manifest's
    fingerprint: unpickling opens it again (torch DataLoader workers started with "spawn",
    launchers that pickle their arguments), and raises DatasetChanged when the path holds
    another dataset by then (re-packed: other shards, labels or classes)."""

    def __init__(self, root: str):
        """Open a finished local dataset.

        Args:
            root: the dataset directory or a file:// URL. An object-store URL is opened by
                `recordtool.open(url, ...)` (a recordtool.remote.RemoteDataset).
        """
        root = os.fspath(root)
        if is_url(root):
            raise ValueError(f"{root}: Dataset opens a local dataset directory; open a URL with "
                             f"recordtool.open({root!r}, cache_dir=…, storage_options=…)")
        self._opened_as = (root, {})
        _, self.root = get_fs(root)
        manifest = mf.load(self.root)
        index_path = files.inside(self.root, manifest["index"]["file"], "index file")
        index = ix.read_index(index_path)
        check_index_file(index.buffer, manifest["index"], index_path)
        self._setup(manifest, index, index_path, LocalShards(self.root, manifest["shards"]))

    def _setup(self, manifest: dict, index, index_path: str, shard_files: ShardFiles) -> None:
        """Checks shared by local and remote datasets (record count, every index row in
        bounds), then the component that serves the shards' bytes."""
        self.manifest = manifest
        self.index = index
        self.classes = list(self.manifest["classes"])
        self.shards = self.manifest["shards"]
        if len(self.index) != self.manifest["records"]:
            raise FormatError(f"{index_path}: index holds {len(self.index)} records, manifest says "
                              f"{self.manifest['records']}")
        check_rows(self.index, self.shards, index_path, len(self.classes))
        self.shard_files = shard_files

    def __reduce__(self):
        root, options = self._opened_as
        return _reopen, (type(self), root, options, self.fingerprint)

    @property
    def fingerprint(self) -> str:
        """A digest of the manifest (its shards, sizes, checksums, classes, index): another
        dataset at the same path has another fingerprint."""
        if getattr(self, "_fingerprint", None) is None:
            text = json.dumps(self.manifest, sort_keys=True, separators=(",", ":"), default=str)
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()[:32]
        return self._fingerprint

    @property
    def labels(self) -> np.ndarray:
        """Per-record labels; every index column is a numpy array on `ds.index` (ds.index.width, …)."""
        return self.index.label

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        """(JPEG bytes as a zero-copy memoryview into the shard mapping, label)."""
        n = len(self.index)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for {n} records")
        i = int(i) % n
        c = self.index.columns
        return self.shard_files.slice(int(c["shard"][i]), int(c["jpeg_offset"][i]), int(c["jpeg_length"][i])), \
            int(c["label"][i])

    def jpeg_views(self, ids) -> list:
        """The JPEG bytes of these records, as zero-copy memoryviews: `[self[i][0] for i in ids]`
        with the index columns gathered once (a batch's worth on the producer thread)."""
        ids = np.asarray(ids)
        if ids.size and ids.dtype.kind not in "iu":
            raise IndexError(f"record ids must be integers, not {ids.dtype}")
        n = len(self.index)
        if ids.size and (ids.min() < -n or ids.max() >= n):  # before the cast: uint64 must not wrap
            bad = ids[(ids < -n) | (ids >= n)][0]
            raise IndexError(f"record {int(bad)} out of range for {n} records")
        ids = ids.astype(np.int64)
        ids = ids % n if len(ids) else ids
        c = self.index.columns
        sl = self.shard_files.slice
        return [sl(s, o, k) for s, o, k in zip(c["shard"][ids].tolist(), c["jpeg_offset"][ids].tolist(),
                                              c["jpeg_length"][ids].tolist())]

    def record(self, i: int) -> memoryview:
        """The serialized OFRecord message of record i (without its length prefix)."""
        c = self.index.columns
        return self.shard_files.slice(int(c["shard"][i]), int(c["offset"][i]) + 8, int(c["length"][i]))

    def info(self, i: int) -> "RecordInfo":
        """What record i holds besides its pixels: label, class name, file name, size, shard and
        offset, the image's length in bytes, and every feature of its OFRecord (FORMAT.md) —
        parsed from the record's bytes on each call (random access for inspection and evaluation
        reports, not for the training loop). Printed, it shows long bytes (the image) as their
        length."""
        from .format.ofrecord import BYTES_LIST, decode_ofrecord

        n = len(self.index)
        if not -n <= i < n:
            raise IndexError(f"record {i} out of range for {n} records")
        i = int(i) % n
        c = self.index.columns
        # a copy (one record): a view into the shard mapping kept alive by the traceback of a
        # refused record would make close() — `with Dataset(...)` leaving on that error — fail
        buf = bytes(self.record(i))
        shard = self.shards[int(c["shard"][i])]["name"]
        try:
            parsed = decode_ofrecord(buf)
        except ValueError as e:
            raise FormatError(f"{os.path.join(self.root, shard)}: record {i} at offset {int(c['offset'][i])}: "
                              f"{e}") from None
        features = {k: [bytes(buf[a:b]) for a, b in v] if kind == BYTES_LIST else list(v)
                    for k, (kind, v) in parsed.items()}
        name = features.get("filename", [b""])
        label = int(c["label"][i])
        return RecordInfo(id=i, label=label, class_name=self.classes[label],
                          filename=(name[0] if name else b"").decode("utf-8", "surrogateescape"),
                          width=int(c["width"][i]), height=int(c["height"][i]), shard=shard,
                          offset=int(c["offset"][i]), jpeg_length=int(c["jpeg_length"][i]), features=features)

    def prefetch(self, indices) -> None:
        """Start reading these records' bytes ahead: the kernel reads them (a local dataset,
        madvise WILLNEED), or their shards are downloaded into the cache (a remote one)."""
        c = self.index.columns
        self.shard_files.prefetch((int(c["shard"][i]), int(c["jpeg_offset"][i]), int(c["jpeg_length"][i]))
                                  for i in indices)

    def sampler(self, seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False,
                shuffle: bool = True, block_shards: int | None = None) -> "Sampler":
        """This rank's per-epoch order (`indices(epoch)`, `len()`).

        Args:
            seed: shuffle seed; the order is a pure function of (seed, epoch, rank, world_size).
            rank, world_size: this process's share (every sample once per epoch across ranks).
            drop_last: cut to a multiple of world_size instead of padding.
            shuffle: False keeps record order.
            block_shards: None (default) — a global permutation for local datasets, a block
                shuffle of DEFAULT_BLOCK_SHARDS shards for remote ones; 0 — a global permutation;
                k ≥ 1 — `BlockSampler` with k shards per block. An integer (ConfigError for a
                bool, a float, a string).
        ConfigError for a bad argument, and for more ranks than records with drop_last (Sampler).
        """
        if block_shards is not None:
            block_shards = check_block_shards(block_shards, 0)
        if block_shards:
            return BlockSampler(self.index.shard, len(self.shards), block_shards, seed=seed, rank=rank,
                                world_size=world_size, drop_last=drop_last, shuffle=shuffle)
        return Sampler(len(self), seed=seed, rank=rank, world_size=world_size,
                       drop_last=drop_last, shuffle=shuffle)

    def close(self) -> None:
        """Let go of the shards (`ShardFiles.close`): a local dataset unmaps them, and fails if
        memoryviews from `ds[i]` are still alive (BufferError)."""
        self.shard_files.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        try:
            self.close()
        except BufferError:
            if exc_type is None:
                raise
            # leaving on an error whose traceback still holds views of the shards: that error
            # is the one to see; the mappings go when the views do

    def __repr__(self):
        return f"<recordtool.Dataset {self.root!r}: {len(self)} records, {len(self.classes)} classes, " \
               f"{len(self.shards)} shards>"


def _reopen(cls, root: str, options: dict, fingerprint: str | None = None):
    """Unpickling a dataset: open it again where it was opened; DatasetChanged when what is
    there now is not the dataset that was pickled (its manifest's `fingerprint`)."""
    ds = cls(root, **options)
    if fingerprint is not None and ds.fingerprint != fingerprint:
        ds.close()
        raise DatasetChanged(f"{ds.root}: holds another dataset than the one pickled (its manifest changed: "
                             "re-packed or replaced since), so its records and labels are not the ones the "
                             "pickling process had; open it anew (recordtool.open) to use what is there now")
    return ds


class _Length:
    """A bytes value as RecordInfo prints it: its length."""

    def __init__(self, n: int):
        self.n = n

    def __repr__(self):
        return f"<{self.n} bytes>"


@dataclass(frozen=True, repr=False)
class RecordInfo:
    """One record's metadata (`Dataset.info(i)`). Its repr (what print shows) is the fields,
    with each bytes value of `features` longer than SHOWN_BYTES as its length (`<48213 bytes>`):
    the image is a feature, and its bytes are no metadata to read."""

    SHOWN_BYTES = 64

    id: int
    label: int
    class_name: str
    filename: str  # as packed (the source's relative path); undecodable bytes as surrogates
    width: int
    height: int
    shard: str  # the part file holding it
    offset: int  # the record's byte offset in that file
    jpeg_length: int  # the image's bytes
    features: dict  # every OFRecord feature: key → list of bytes / ints / floats (the image included)

    def __repr__(self):
        short = {k: [_Length(len(v)) if isinstance(v, bytes) and len(v) > self.SHOWN_BYTES else v for v in vals]
                 for k, vals in self.features.items()}
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.name != "features"]
        return f"RecordInfo({', '.join(shown)}, features={short!r})"



def check_index_file(buffer, info: dict, where: str) -> None:
    """The index file is the one the manifest describes: its size and CRC32C (`index.bytes`,
    `index.crc32c`). Checked at every open (a CRC32C of the index costs milliseconds even for
    a million records): an index damaged or rewritten after the manifest was written would
    otherwise serve labels, or image bytes, that no bounds check can tell from the true ones.
    FormatError names the file."""
    import crc32c

    size = len(buffer) if buffer is not None else 0
    if size != info["bytes"]:
        raise FormatError(f"{where}: {size} bytes, manifest says {info['bytes']} (truncated or rewritten)")
    crc = f"{crc32c.crc32c(buffer) if size else 0:08x}"
    if crc != info["crc32c"]:
        raise FormatError(f"{where}: CRC32C {crc} differs from the manifest's {info['crc32c']} (changed after the "
                          "dataset was written)")


def check_rows(index, shards: list, where: str, classes: int | None = None) -> None:
    """Vectorised bounds check of every index row against the manifest's shards: shard number
    in range, record and image bytes inside the shard file, image inside its record, sides a
    JPEG can have (the decoders size buffers from them before any header is read), label
    inside the class list. FormatError names the first bad row."""
    c = index.columns
    n = len(index)
    if not n:
        return
    nbytes = np.array([s["bytes"] for s in shards] + [0], np.uint64)
    shard = c["shard"].astype(np.int64)
    bad_shard = shard >= len(shards)
    size = nbytes[np.where(bad_shard, len(shards), shard)]
    off, length = c["offset"].astype(np.uint64), c["length"].astype(np.uint64)
    joff, jlen = c["jpeg_offset"].astype(np.uint64), c["jpeg_length"].astype(np.uint64)
    rec_end = off + np.uint64(8) + length
    checks = [
        (bad_shard, lambda r: f"shard {int(shard[r])} but the manifest lists {len(shards)} shards"),
        ((rec_end > size) | (rec_end < off), lambda r: f"record at {int(off[r])}+{int(length[r])} runs past "
                                                       f"the shard's {int(size[r])} bytes"),
        ((joff < off + np.uint64(8)) | (joff > rec_end) | (jlen > rec_end - np.minimum(joff, rec_end)),
         lambda r: f"image bytes {int(joff[r])}+{int(jlen[r])} outside its record {int(off[r])}+{int(length[r])}"),
        ((c["width"] <= 0) | (c["height"] <= 0) | (c["width"] > MAX_SIDE) | (c["height"] > MAX_SIDE),
         lambda r: f"size {int(c['width'][r])}x{int(c['height'][r])} (a JPEG's sides are 1..{MAX_SIDE})"),
        (c["label"] < 0, lambda r: f"negative label {int(c['label'][r])}"),
        # codes the decoders route by (FORMAT.md): anything else is not ours to interpret
        ((c["chroma"] < -1) | (c["chroma"] > 7), lambda r: f"unknown chroma code {int(c['chroma'][r])}"),
        ((c["colorspace"] < 1) | (c["colorspace"] > 5), lambda r: f"unknown colorspace code {int(c['colorspace'][r])}"),
        (~np.isin(c["channels"], (1, 3, 4)), lambda r: f"{int(c['channels'][r])} channels"),
        (c["progressive"] > 1, lambda r: f"progressive flag {int(c['progressive'][r])}"),
        (c["size_order"] >= n, lambda r: f"size_order entry {int(c['size_order'][r])} past the {n} records"),
    ]
    if classes is not None:
        checks.append((c["label"] >= classes, lambda r: f"label {int(c['label'][r])} but the manifest lists "
                                                        f"{classes} classes"))
    for bad, what in checks:
        if bad.any():
            r = int(np.argmax(bad))
            raise FormatError(f"{where}: row {r}: {what(r)} ({int(bad.sum())} bad rows)")
