"""`recordtool verify`: re-read everything and prove shards, index and manifest agree.

Checks, per shard: size and CRC32C against the manifest, framing, every record parses as
an OFRecord (with protobuf itself, not our walker), and its label / image span agree with the
index, and its JPEG header with the index's width, height, chroma, colour space, channels and
progressive flag (and the decoders' cost limits); then the index's own invariants (rows inside
the shards and the class list, size order); a dataset without records fails. Optionally a full
decode of every image. Problems are reported with shard file and byte offset.
"""
from __future__ import annotations

import mmap
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import crc32c
import numpy as np

from .util import cores
from .errors import FormatError, RecordtoolError
from .format.jpeg import BadJPEG, NotJPEG, decode_refusal, probe
from .format.ofrecord import iter_records
from .format.scan import record_fields
from .io import files
from .io.fs import is_url


@dataclass
class VerifyResult:
    records: int = 0
    decoded: int = 0
    errors: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def verify(root: str, decode: bool = False, threads: int | None = None, max_errors: int = 20,
           progress: bool = False, **remote) -> VerifyResult:
    """Re-read the dataset at root; `.ok` only if shards, index and manifest all agree.

    Args:
        root: the dataset directory, or an object-store URL (its index is downloaded once, its
            shards one after the other through the local shard cache: see recordtool.remote).
        decode: also decode every image fully and compare its size with the index.
        threads: decode threads (default: cores).
        max_errors: stop after this many problems.
        progress: show a tqdm bar.
        remote: cache_dir, cache_limit, storage_options, retry for an object-store URL.
    """
    from .datasets import open_dataset

    try:  # manifest and index loaded and checked (every row in bounds) once, as any reader does
        ds = open_dataset(root, **remote)
    except (FormatError, OSError) as e:
        return VerifyResult(errors=[str(e)])
    try:
        return _verify(ds, is_url(root), decode, threads, max_errors, progress)
    finally:
        try:
            ds.close()
        except BufferError:  # a view of the decode pass still alive: the mappings go with ds
            pass


def _verify(ds, remote: bool, decode: bool, threads, max_errors: int, progress: bool) -> VerifyResult:
    """verify() of an open dataset (local directory, or remote through its cache)."""
    res = VerifyResult()

    def bad(msg):
        res.errors.append(msg)
        return len(res.errors) >= max_errors

    root, manifest, index = ds.root, ds.manifest, ds.index
    idx_info = manifest["index"]
    idx_path = ds.cache.url(idx_info["file"]) if remote else files.inside(root, idx_info["file"], "index file")
    blob = index.buffer  # checksum the same mapping the columns come from: one read
    if len(blob) != idx_info["bytes"] or f"{crc32c.crc32c(blob):08x}" != idx_info["crc32c"]:
        res.errors.append(f"{idx_path}: size/CRC32C differ from the manifest (index damaged)")
        return res
    from .format import ofrecord_pb2

    c = index.columns
    n = len(index)
    keys = manifest.get("keys", {})
    image_key, label_key = keys.get("image", "encoded"), keys.get("label", "class/label")
    skipped = {(s["shard"], s["offset"]) for s in manifest.get("skipped", []) if "shard" in s}
    # `recordtool index` leaves out records too short to hold an image as one entry per part
    short = {s["shard"]: s["shorter_than"] for s in manifest.get("skipped", [])
             if isinstance(s.get("shorter_than"), int) and "shard" in s}
    if n == 0:
        bad(f"{idx_path}: the dataset holds no record"
            + (f" ({len(manifest['skipped'])} left out, see the manifest's 'skipped')" if manifest.get("skipped") else ""))
    # rows of each shard, in file order
    rows_by_shard = {}
    if n:
        order = np.lexsort((c["offset"], c["shard"]))
        if not np.array_equal(order, np.arange(n)):
            bad(f"{idx_path}: rows are not in (shard, offset) order")
        for s in np.unique(c["shard"]):
            rows_by_shard[int(s)] = np.nonzero(c["shard"] == s)[0]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(s["bytes"] for s in manifest["shards"]), unit="B", unit_scale=True,
                   desc="verify")
    seen_drops = 0  # bad cached copies dropped since the dataset opened (the index's too)
    for s, info in enumerate(manifest["shards"]):
        path = os.path.join(root, info["name"])  # a plain name: mf.load checked it
        try:
            mm, size, release = _open_shard(path, s, ds if remote else None)
        except RecordtoolError as e:  # damaged or unsafe file; remote: retries exhausted, no room
            if bad(str(e)):
                return res
            continue
        except OSError as e:
            if bad(f"{path}: cannot open ({e.strerror})"):
                return res
            continue
        try:
            if remote:  # what the cache holds is checked first: a bad copy is the cache's, not the store's
                for msg in ds.cache.dropped[seen_drops:]:  # copies found changed when pinned, fetched again
                    if bad(msg):
                        return res
                seen_drops = len(ds.cache.dropped)
                crc = f"{crc32c.crc32c(mm) if size else 0:08x}"
                if crc != info["crc32c"]:
                    msg = ds.cache.drop(info["name"], info["crc32c"], f"CRC32C {crc} differs from the manifest's "
                                        f"{info['crc32c']}")
                    seen_drops = len(ds.cache.dropped)
                    if bad(msg + "; run verify again to check the store's copy"):
                        return res
                    continue
            if size != info["bytes"]:
                if bad(f"{path}: offset {min(size, info['bytes'])}: file is {size} bytes, manifest says "
                       f"{info['bytes']} (truncated or appended to)"):
                    return res
            rows = rows_by_shard.get(s, np.empty(0, dtype=np.int64))
            k = 0
            try:
                for rec in iter_records(mm, path):
                    where = f"{path}: offset {rec.offset}"
                    if (info["name"], rec.offset) in skipped or rec.length < short.get(info["name"], 0):
                        continue
                    if k >= len(rows):
                        raise FormatError(f"{where}: record not in the index")
                    r = int(rows[k])
                    k += 1
                    if int(c["offset"][r]) != rec.offset or int(c["length"][r]) != rec.length:
                        raise FormatError(f"{where}: index row {r} says offset {int(c['offset'][r])}, "
                                          f"length {int(c['length'][r])}; shard has length {rec.length}")
                    msg = ofrecord_pb2.OFRecord()
                    try:
                        msg.ParseFromString(mm[rec.data_offset:rec.data_offset + rec.length])
                    except Exception as e:  # protobuf's DecodeError and friends
                        raise FormatError(f"{where}: record does not parse as oneflow.OFRecord ({e})") \
                            from None
                    (a, b), _, _ = record_fields(mm, rec, image_key, label_key)
                    label = list(msg.feature[label_key].int32_list.value) or \
                        list(msg.feature[label_key].int64_list.value)
                    if (a, b - a) != (int(c["jpeg_offset"][r]), int(c["jpeg_length"][r])):
                        raise FormatError(f"{where}: image bytes at {a}+{b - a}, index row {r} says "
                                          f"{int(c['jpeg_offset'][r])}+{int(c['jpeg_length'][r])}")
                    if label != [int(c["label"][r])]:
                        raise FormatError(f"{where}: label {label}, index row {r} says {int(c['label'][r])}")
                    _check_header(mm[a:b], c, r, where)
                    res.records += 1
                if k != len(rows):
                    raise FormatError(f"{path}: offset {size}: index lists {len(rows)} records in this "
                                      f"shard, file holds {k}")
                if info.get("records") is not None and info["records"] != k:
                    raise FormatError(f"{path}: manifest says {info['records']} records, file holds {k}")
                crc = f"{crc32c.crc32c(mm) if size else 0:08x}"
                if crc != info["crc32c"]:
                    raise FormatError(f"{path}: offset 0: CRC32C {crc} differs from the manifest's "
                                      f"{info['crc32c']} (bytes changed in place)")
            except FormatError as e:
                if bad(str(e)):
                    return res
        finally:
            release()
        if bar is not None:
            bar.update(info["bytes"])
    if bar is not None:
        bar.close()
    if n:
        so = c["size_order"].astype(np.int64)
        if not np.array_equal(np.sort(so), np.arange(n)):
            bad(f"{idx_path}: size_order is not a permutation of the records")
        elif np.any(np.diff(c["jpeg_length"][so].astype(np.int64)) > 0):
            bad(f"{idx_path}: size_order is not sorted by encoded size, largest first")
    if decode and res.ok:
        _decode_all(ds, threads, res, bad)
    return res


def _open_shard(path: str, shard: int, ds):
    """(mapping, size, release) of a shard: the file itself, or for a remote dataset its
    checked copy in the cache, pinned until release()."""
    if ds is None:
        mm, size = files.map_readonly(path)
        return mm, size, (mm.close if isinstance(mm, mmap.mmap) else lambda: None)
    pinned = ds.shard_file(shard)
    mm = pinned.__enter__()
    return mm, len(mm), lambda: pinned.__exit__(None, None, None)


_HEADER_COLUMNS = ("width", "height", "chroma", "colorspace", "channels", "progressive")


def _check_header(data, c, r: int, where: str) -> None:
    """The record's JPEG header against index row r (what routing and windows rely on), and
    the decoders' cost limits."""
    try:
        info = probe(data)
    except (NotJPEG, BadJPEG) as e:
        raise FormatError(f"{where}: image is not a JPEG the index can describe ({e})") from None
    got = {"width": info.width, "height": info.height, "chroma": info.chroma, "colorspace": info.colorspace,
           "channels": info.channels, "progressive": int(info.progressive)}
    for k in _HEADER_COLUMNS:
        if got[k] != int(c[k][r]):
            raise FormatError(f"{where}: JPEG header says {k} {got[k]}, index row {r} says {int(c[k][r])}")
    why = decode_refusal(info, len(data))
    if why:
        raise FormatError(f"{where}: the decoders refuse this image: {why}")


def _decode_all(ds, threads, res, bad):
    """Decode every image of the open dataset."""
    root = ds.root
    c = ds.index.columns
    dec = _decoder()

    def one(i):
        data, _ = ds[i]
        try:
            h, w = dec(data)
        except Exception as e:  # any decoder failure is a finding, not a crash
            return i, f"does not decode ({type(e).__name__}: {e})"
        if (h, w) != (int(c["height"][i]), int(c["width"][i])):
            return i, f"decodes to {w}x{h}, index says {int(c['width'][i])}x{int(c['height'][i])}"
        return i, None

    # libjpeg's warnings (premature end of data, corrupt entropy data) are damage here
    with warnings.catch_warnings(), ThreadPoolExecutor(threads or cores()) as ex:
        warnings.simplefilter("error")
        for i, err in ex.map(one, range(len(ds))):
            if err is None:
                res.decoded += 1
                continue
            name = ds.shards[int(c["shard"][i])]["name"]
            if bad(f"{os.path.join(root, name)}: offset {int(c['offset'][i])}: record {i}: image {err}"):
                break


def _decoder():
    """Full decode → (height, width); PyTurboJPEG when its library loads, else Pillow."""
    try:
        from . import codec

        codec.turbojpeg()  # loads here: a missing library falls back to Pillow once

        def dec(data):
            return codec.decode_rgb(data).shape[:2]
    except Exception:  # no libturbojpeg: Pillow
        import io

        from PIL import Image

        def dec(data):
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                return im.height, im.width
    return dec
