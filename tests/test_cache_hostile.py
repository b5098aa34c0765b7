"""Adversarial suite for the storage layer: a hostile shard cache folder (planted links, foreign
files, copies changed after their download, lock files and .part files tampered with), hostile
names and manifests, and what a remote dataset may cost. The cache is reached through memory://
here (the same code as s3://, no server), but for the Loader at the smallest cache limit, which
runs against a real S3 server (tests/s3server.py); tests/test_remote.py covers that server
behind a misbehaving proxy."""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import pickle
import threading
import warnings

import crc32c
import numpy as np
import pytest

import hostile_data as hd
from conftest import jpeg_bytes, write

fsspec = pytest.importorskip("fsspec")

import recordtool  # noqa: E402
from recordtool.errors import CacheFull, FormatError, RecordtoolError, RemoteError, UnsafePath  # noqa: E402
from recordtool.io import Retry  # noqa: E402
from recordtool.io import cache as rcache  # noqa: E402

FAST = Retry(attempts=2, backoff=0.01, max_backoff=0.02)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """24 small images in 4 shards."""
    tmp = tmp_path_factory.mktemp("cachehostile")
    for c in range(2):
        for i in range(12):
            write(str(tmp / "src" / f"c{c}" / f"{i}.jpg"), jpeg_bytes(40 + 4 * (i % 3), 32, seed=50 * c + i))
    from recordtool.pack import pack

    pack(str(tmp / "src"), str(tmp / "out"), shards=4, progress=False)
    return str(tmp / "out")


_names = iter(range(10**6))


def _upload(local: str) -> str:
    """A memory:// copy of a local dataset; its URL."""
    mem = fsspec.filesystem("memory")
    url = f"memory://hostile-{next(_names)}/train"
    mem.put(local, url[len("memory://"):], recursive=True)
    return url


@pytest.fixture
def remote(packed):
    url = _upload(packed)
    yield url
    fsspec.filesystem("memory").rm(url[len("memory://"):].split("/")[0], recursive=True)


def _open(url, tmp_path, **kw):
    kw.setdefault("retry", FAST)
    return recordtool.open(url, cache_dir=str(tmp_path / "cache"), **kw)


def _read_all(ds) -> list:
    return [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def _copy(packed, tmp_path, name="copy") -> str:
    import shutil

    out = str(tmp_path / name)
    shutil.copytree(packed, out)
    return out


def _without_digests(packed, tmp_path) -> str:
    """A copy of the dataset whose manifest has no `sha256` (as manifests written before it)."""
    root = _copy(packed, tmp_path, "old-manifest")
    m = json.load(open(os.path.join(root, "manifest.json")))
    for entry in m["shards"] + [m["index"]]:
        entry.pop("sha256", None)
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(m, f)
    return root


def _small_limit(packed) -> int:
    """Room for two of the largest shards: reading everything evicts."""
    return sum(sorted((s["bytes"] for s in recordtool.open(packed).shards), reverse=True)[:2])


# ------------------------------------------------------------------ planted links and foreign files

@pytest.mark.parametrize("where", ["shards", "meta", "locks", "<key>"])
def test_planted_folder_link_is_refused_and_never_followed(remote, packed, tmp_path, where):
    """A link planted for one of the cache's folders (to a folder of the user's) is an error
    naming it; nothing in the folder it points to is counted, written or deleted."""
    ds = _open(remote, tmp_path)
    _read_all(ds)
    folder = ds.cache.dir
    ds.close()
    victim = tmp_path / "precious"
    victim.mkdir()
    for s in recordtool.open(packed).shards:  # files the old eviction would count and delete
        write(str(victim / f"{s['name']}.{s['crc32c']}"), b"the user's data " * 100)
    write(str(victim / "notes.txt"), b"mine")
    before = {n: (victim / n).read_bytes() for n in os.listdir(victim)}
    target = folder if where == "<key>" else os.path.join(folder, where)
    os.rename(target, str(tmp_path / "moved"))
    os.symlink(str(victim), target)
    with pytest.raises(UnsafePath, match="symbolic link"):
        ds = _open(remote, tmp_path, cache_limit=_small_limit(packed))
        _read_all(ds)  # (never reached: the open refuses)
    assert {n: (victim / n).read_bytes() for n in os.listdir(victim)} == before


def test_foreign_files_in_the_cache_are_never_counted_or_deleted(remote, packed, tmp_path):
    """Files the cache did not write (other names, hard links to the user's files) stay, and do
    not count against the limit, while eviction goes on around them."""
    ds = _open(remote, tmp_path, cache_limit=_small_limit(packed))
    outside = tmp_path / "outside.bin"
    write(str(outside), b"x" * 5000)
    notes = os.path.join(ds.cache.shards_dir, "notes.txt")
    write(notes, b"mine")
    linked = os.path.join(ds.cache.shards_dir, "zz-other.0badc0de")  # named like a cached file
    os.link(str(outside), linked)
    for p in (notes, linked):
        os.utime(p, (1, 1))  # the least recently used files there, if they counted
    local = recordtool.open(packed)
    for epoch in range(2):
        assert _read_all(ds) == _read_all(local)
    assert open(notes, "rb").read() == b"mine" and os.path.exists(linked) and outside.read_bytes() == b"x" * 5000
    assert ds.cache.used() <= ds.cache.limit
    ds.close()


def test_link_at_a_cached_files_name_is_refused(remote, packed, tmp_path):
    ds = _open(remote, tmp_path)
    info = ds.shards[1]
    secret = tmp_path / "secret"
    write(str(secret), b"s" * info["bytes"])
    os.symlink(str(secret), ds.cache.path(info["name"], info["crc32c"]))
    i = int(np.nonzero(ds.index.shard == 1)[0][0])
    with pytest.raises(UnsafePath, match="not a regular file the cache wrote"):
        ds[i]
    assert secret.read_bytes() == b"s" * info["bytes"]
    ds.close()


# ------------------------------------------------------------------ copies changed after their download

def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def test_cached_shard_changed_in_place_is_dropped_and_fetched_again(remote, packed, tmp_path):
    local = recordtool.open(packed)
    ds = _open(remote, tmp_path)
    _read_all(ds)
    ds.close()
    for s in local.shards:  # every cached shard altered in place, size unchanged
        _flip(ds.cache.path(s["name"], s["crc32c"]), s["bytes"] // 2)
    again = _open(remote, tmp_path)
    with pytest.warns(RuntimeWarning, match="cached copy changed after its download"):
        got = _read_all(again)
    assert got == _read_all(local)
    assert len(again.cache.dropped) == len(local.shards)
    assert again.cache.path(local.shards[0]["name"], local.shards[0]["crc32c"]) in again.cache.dropped[0] or \
        any(again.cache.shards_dir in m for m in again.cache.dropped)
    again.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fetched copies are good: no more warnings
        third = _open(remote, tmp_path)
        assert _read_all(third) == _read_all(local)
        third.close()


@pytest.mark.parametrize("manifest", ["sha256", "crc32c only"])
def test_cached_shard_replaced_by_another_file_is_caught(remote, packed, tmp_path, manifest):
    """A different file renamed into a cached shard's place (new inode, same size and mtime):
    caught by the manifest's SHA-256, or by its CRC32C for a manifest written before digests."""
    if manifest != "sha256":
        remote = _upload(_without_digests(packed, tmp_path))
    local = recordtool.open(packed)
    ds = _open(remote, tmp_path)
    _read_all(ds)
    ds.close()
    s = local.shards[2]
    path = ds.cache.path(s["name"], s["crc32c"])
    st = os.stat(path)
    fake = path + ".fake"
    write(fake, bytes(reversed(open(path, "rb").read())))
    os.utime(fake, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(fake, path)
    again = _open(remote, tmp_path)
    with pytest.warns(RuntimeWarning, match="SHA-256" if manifest == "sha256" else "CRC32C"):
        assert _read_all(again) == _read_all(local)
    again.close()


def _records_of(local, shard: int) -> list:
    return [i for i in range(len(local)) if int(local.index.shard[i]) == shard]


@pytest.mark.parametrize("manifest", ["sha256", "crc32c only"])
def test_cached_shard_written_in_place_while_mapped_is_never_served(remote, packed, tmp_path, manifest):
    """A cached shard written in place after its reader mapped it (size kept, one byte of a
    record changed): the reader compares the file's identity with the one the cache checked
    before each record it serves, so it pins the shard again — the copy is dropped (a warning)
    and downloaded again — and serves the record's own bytes, never the changed ones."""
    if manifest != "sha256":
        remote = _upload(_without_digests(packed, tmp_path))
    local = recordtool.open(packed)
    ds = _open(remote, tmp_path)
    first, second = _records_of(local, 1)[:2]
    assert bytes(ds[first][0]) == bytes(local[first][0])  # mapped now
    s = local.shards[1]
    _flip(ds.cache.path(s["name"], s["crc32c"]), int(local.index.columns["jpeg_offset"][second]) + 20)
    with pytest.warns(RuntimeWarning, match="cached copy changed after its download"):
        got = bytes(ds[second][0])
    assert got == bytes(local[second][0])
    assert _read_all(ds) == _read_all(local)
    ds.close()


_TRUNCATED = """
import os, sys, warnings
import fsspec, recordtool
packed, cache = sys.argv[1:3]
fsspec.filesystem("memory").put(packed, "truncated/train", recursive=True)
local, ds = recordtool.open(packed), recordtool.open("memory://truncated/train", cache_dir=cache)
records = [i for i in range(len(local)) if int(local.index.shard[i]) == 1]
assert bytes(ds[records[0]][0]) == bytes(local[records[0]][0])  # mapped now
s = local.shards[1]
os.truncate(ds.cache.path(s["name"], s["crc32c"]), 0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    print([bytes(ds[i][0]) for i in records] == [bytes(local[i][0]) for i in records])
"""


def test_cached_shard_truncated_while_mapped_is_downloaded_again_not_a_crash(packed, tmp_path):
    """A cached shard truncated after its reader mapped it: the next record from it finds the
    file's size changed before touching the mapping, so it is pinned again (dropped, downloaded
    again) instead of reading pages that are gone — SIGBUS, which kills the process (run in a
    subprocess)."""
    import subprocess
    import sys

    home = os.path.dirname(os.path.dirname(os.path.abspath(recordtool.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([home] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p]))
    p = subprocess.run([sys.executable, "-c", _TRUNCATED, packed, str(tmp_path / "cache")], capture_output=True,
                       text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert p.returncode == 0 and p.stdout.strip() == "True", (p.returncode, p.stdout, p.stderr[-2000:])


def test_cached_index_changed_in_place_is_dropped(remote, packed, tmp_path):
    local = recordtool.open(packed)
    ds = _open(remote, tmp_path)
    ds.close()
    meta = os.path.join(ds.cache.meta_dir, f"index.rtx.{local.manifest['index']['crc32c']}")
    _flip(meta, os.path.getsize(meta) - 3)
    with pytest.warns(RuntimeWarning, match="index.rtx"):
        again = _open(remote, tmp_path)
    assert bytes(again.index.buffer) == bytes(local.index.buffer)
    again.close()


def test_verify_names_and_drops_a_bad_cached_copy(remote, packed, tmp_path):
    from recordtool.verify import verify

    local = recordtool.open(packed)
    ds = _open(remote, tmp_path)
    _read_all(ds)
    ds.close()
    s = local.shards[3]
    cached = ds.cache.path(s["name"], s["crc32c"])
    _flip(cached, 100)
    with pytest.warns(RuntimeWarning):
        res = verify(remote, cache_dir=str(tmp_path / "cache"), retry=FAST)
    assert len(res.errors) == 1 and res.errors[0].startswith(cached) and "dropped" in res.errors[0]
    assert "failed" not in res.errors[0]  # the store is not blamed
    assert res.records == len(local)  # the copy fetched again was verified as well
    res = verify(remote, cache_dir=str(tmp_path / "cache"), retry=FAST)
    assert res.ok, res.errors


# ------------------------------------------------------------------ copies that keep their CRC32C

def _forge_crc(data: bytearray, at: int, want: int) -> None:
    hd.forge_crc(data, at, want)
    assert crc32c.crc32c(bytes(data)) == want


def _index_padding(blob: bytes) -> int:
    """An offset of 4 padding bytes between two columns of an index file."""
    hdr = json.loads(blob[12:12 + int.from_bytes(blob[8:12], "little")])
    cols = sorted((c["offset"], c["offset"] + hdr["count"] * np.dtype(c["dtype"]).itemsize) for c in hdr["columns"])
    for (_, end), (nxt, _) in zip(cols, cols[1:]):
        if nxt - end >= 4:
            return end
    raise AssertionError("no padding between the columns")


def test_cached_index_rewritten_with_its_crc_kept_is_dropped(remote, packed, tmp_path):
    """Every label of the cached index changed, and 4 padding bytes chosen to keep its size and
    CRC32C: the manifest's SHA-256 catches it; the store's labels are served."""
    local = recordtool.open(packed)
    info = local.manifest["index"]
    ds = _open(remote, tmp_path)
    ds.close()
    meta = os.path.join(ds.cache.meta_dir, f"{info['file']}.{info['crc32c']}")
    blob = bytearray(open(meta, "rb").read())
    hdr = json.loads(blob[12:12 + int.from_bytes(blob[8:12], "little")])
    col = next(c for c in hdr["columns"] if c["name"] == "label")
    labels = np.frombuffer(blob, "<i4", hdr["count"], col["offset"])
    blob[col["offset"]:col["offset"] + 4 * hdr["count"]] = ((labels + 1) % len(local.classes)).astype("<i4").tobytes()
    _forge_crc(blob, _index_padding(bytes(blob)), int(info["crc32c"], 16))
    with open(meta, "r+b") as f:
        f.write(blob)
    with pytest.warns(RuntimeWarning, match="SHA-256"):
        again = _open(remote, tmp_path)
    assert np.array_equal(again.labels, local.labels)
    assert [again[i][1] for i in range(len(again))] == [local[i][1] for i in range(len(local))]
    again.close()


def _forge_image(path: str, ds, shard: int) -> int:
    """Change the image bytes of the shard's first record in the file at `path`, its CRC32C
    kept; the record's number."""
    i = int(np.nonzero(ds.index.shard == shard)[0][0])
    at, n = int(ds.index.jpeg_offset[i]), int(ds.index.jpeg_length[i])
    data = bytearray(open(path, "rb").read())
    data[at + n // 2:at + n // 2 + 16] = bytes(16)
    _forge_crc(data, at + n // 2 + 16, int(ds.shards[shard]["crc32c"], 16))
    with open(path, "wb") as f:
        f.write(data)
    return i


def test_cached_shard_rewritten_with_its_crc_kept_is_dropped(remote, packed, tmp_path):
    """Image bytes of a cached shard changed in place, size and CRC32C kept: caught when the
    shard is taken into use, dropped, fetched again; the store's bytes are served."""
    local = recordtool.open(packed)
    ds = _open(remote, tmp_path)
    _read_all(ds)
    ds.close()
    s = local.shards[1]
    cached = ds.cache.path(s["name"], s["crc32c"])
    i = _forge_image(cached, local, 1)
    assert open(cached, "rb").read() != open(os.path.join(packed, s["name"]), "rb").read()
    again = _open(remote, tmp_path)
    with pytest.warns(RuntimeWarning, match="SHA-256") as w:
        assert bytes(again[i][0]) == bytes(local[i][0])
    assert cached in str(w[0].message) and again.cache.dropped
    assert _read_all(again) == _read_all(local)
    again.close()


def test_store_copy_with_its_crc_kept_is_refused_on_download(packed, tmp_path):
    """A shard on the store altered with its CRC32C kept is Damaged (SHA-256) on every try:
    RemoteError naming it, nothing cached."""
    url = _upload(packed)
    local = recordtool.open(packed)
    s = local.shards[2]
    obj = f"{url[len('memory://'):]}/{s['name']}"
    mem = fsspec.filesystem("memory")
    tmp = str(tmp_path / "altered")
    mem.get(obj, tmp)
    _forge_image(tmp, local, 2)
    mem.put(tmp, obj)
    ds = _open(url, tmp_path)
    i = int(np.nonzero(ds.index.shard == 2)[0][0])
    with pytest.raises(RemoteError, match="SHA-256") as e:
        ds[i]
    assert s["name"] in str(e.value)
    assert not any(n.startswith(s["name"]) for n in os.listdir(ds.cache.shards_dir))
    ds.close()


@pytest.mark.parametrize("where", ["shards", "index"])
def test_malformed_digest_in_a_manifest_is_a_named_error(packed, tmp_path, where):
    root = _copy(packed, tmp_path)
    m = json.load(open(os.path.join(root, "manifest.json")))
    (m["shards"][1] if where == "shards" else m["index"])["sha256"] = "Z" * 64
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(m, f)
    with pytest.raises(FormatError, match=r"shards\[1\]\.sha256" if where == "shards" else r"index\.sha256"):
        recordtool.open(root)


@pytest.mark.parametrize("how", ["local", "process", "index"])
def test_manifests_carry_each_files_sha256(tmp_path, how):
    """pack (threads or worker processes; Ray's output is byte-identical to the threads',
    tests/test_pack_ray.py) and `recordtool index` record each part file's and the index's
    SHA-256."""
    for i in range(8):
        write(str(tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=i))
    from recordtool.pack import pack

    out = tmp_path / "out"
    pack(str(tmp_path / "src"), str(out), shards=3, progress=False, engine="process" if how == "process" else "local")
    if how == "index":
        from recordtool.format.scan import index_parts

        for name in ("manifest.json", "index.rtx", "pack_report.json"):
            os.unlink(out / name)
        index_parts(str(out), progress=False)
    m = json.load(open(out / "manifest.json"))
    for entry in m["shards"] + [m["index"]]:
        name = entry.get("name") or entry["file"]
        assert entry["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    assert len(m["shards"]) == 3


def test_manifest_without_digests_reads_as_before(packed, tmp_path):
    """Manifests written before `sha256` existed: read through the cache, checked by CRC32C."""
    url = _upload(_without_digests(packed, tmp_path))
    local = recordtool.open(packed)
    ds = _open(url, tmp_path)
    assert _read_all(ds) == _read_all(local)
    ds.close()


# ------------------------------------------------------------------ lock files and .part files

def _lock_path(ds, packed, which: str) -> str:
    """The cache's lock file of a shard, of the index, or the cache's own `.lock`."""
    local = recordtool.open(packed)
    s, ix_ = local.shards[1], local.manifest["index"]
    name = {"shard": os.path.join("locks", f"{s['name']}.{s['crc32c']}"),
            "index": os.path.join("locks", f"meta-{ix_['file']}.{ix_['crc32c']}"), "cache": ".lock"}[which]
    if which == "index":  # the index's lock is taken to download it: drop the cached copy
        os.unlink(os.path.join(ds.cache.meta_dir, f"{ix_['file']}.{ix_['crc32c']}"))
    return name


@pytest.mark.parametrize("which", ["shard", "index", "cache"])
def test_hard_link_at_a_lock_file_is_refused_and_never_written(remote, packed, tmp_path, which):
    """A hard link to a file outside the cache, planted where a lock file goes: UnsafePath naming
    it; the linked file keeps every byte (the identity stamp is never written into it)."""
    ds = _open(remote, tmp_path)
    ds.close()
    path = os.path.join(ds.cache.dir, _lock_path(ds, packed, which))
    victim = tmp_path / "precious.bin"
    write(str(victim), b"the user's data, not a lock " * 8)
    before = victim.read_bytes()
    if os.path.exists(path):
        os.unlink(path)
    os.link(str(victim), path)
    with pytest.raises(UnsafePath, match="hard link") as e:
        again = _open(remote, tmp_path)
        _read_all(again)
    assert path in str(e.value)
    assert victim.read_bytes() == before


@pytest.mark.parametrize("which", ["shard", "index", "cache"])
def test_directory_at_a_lock_files_name_is_unsafe_path(remote, packed, tmp_path, monkeypatch, which):
    """A directory planted at a lock file's name: UnsafePath naming its absolute path, also when
    the cache folder was given as a relative path."""
    monkeypatch.chdir(tmp_path)
    ds = recordtool.open(remote, cache_dir="cache", retry=FAST)
    ds.close()
    path = os.path.join(str(tmp_path), "cache", os.path.basename(ds.cache.dir), _lock_path(ds, packed, which))
    if os.path.exists(path):
        os.unlink(path)
    os.mkdir(path)
    with pytest.raises(UnsafePath, match="directory") as e:
        again = recordtool.open(remote, cache_dir="cache", retry=FAST)
        _read_all(again)
    assert path in str(e.value)


def _cleaner(monkeypatch, suffix: str, every: bool) -> list:
    """Downloads whose .part file another program deletes as the last byte arrives (the first
    one only, or `every` one) for objects whose path ends with `suffix`: the .part paths."""
    real = rcache.download_into
    deleted = []

    def download_into(fs, path, fd, size, retry, *args, **kw):
        real(fs, path, fd, size, retry, *args, **kw)
        if path.endswith(suffix) and (every or not deleted):
            part = os.readlink(f"/proc/self/fd/{fd}")
            os.unlink(part)
            deleted.append(part)

    monkeypatch.setattr(rcache, "download_into", download_into)
    return deleted


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds the .part through /proc")
@pytest.mark.parametrize("what", ["shard", "index"])
def test_part_file_deleted_during_its_download_is_downloaded_again(remote, packed, tmp_path, monkeypatch, what):
    local = recordtool.open(packed)
    deleted = _cleaner(monkeypatch, local.shards[1]["name"] if what == "shard" else "/index.rtx", every=False)
    ds = _open(remote, tmp_path)
    assert _read_all(ds) == _read_all(local)
    assert len(deleted) == 1 and deleted[0].endswith(".part")
    ds.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds the .part through /proc")
@pytest.mark.parametrize("what", ["shard", "index"])
def test_part_file_deleted_at_every_download_is_a_named_error(remote, packed, tmp_path, monkeypatch, what):
    local = recordtool.open(packed)
    deleted = _cleaner(monkeypatch, local.shards[1]["name"] if what == "shard" else "/index.rtx", every=True)
    with pytest.raises(RecordtoolError) as e:
        ds = _open(remote, tmp_path)
        _read_all(ds)
    assert deleted and os.path.join(str(tmp_path), "cache") in str(e.value)
    if what == "shard":
        assert deleted[0] in str(e.value)


# ------------------------------------------------------------------ the Loader at the smallest cache limit

@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    s3fs = pytest.importorskip("s3fs")
    from s3server import S3

    server = S3()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(s3fs.S3FileSystem, "retries", 1)
        yield server
    server.stop()


@pytest.fixture(scope="module")
def packed8(tmp_path_factory):
    """48 small images in 8 shards: 4 blocks of 2 shards."""
    tmp = tmp_path_factory.mktemp("cacheminimum")
    for c in range(3):
        for i in range(16):
            write(str(tmp / "src" / f"c{c}" / f"{i}.jpg"), jpeg_bytes(48 + 4 * (i % 5), 40, seed=100 * c + i))
    from recordtool.pack import pack

    pack(str(tmp / "src"), str(tmp / "out"), shards=8, progress=False)
    return str(tmp / "out")


def test_loader_at_the_smallest_cache_limit_never_waits_on_itself(s3, packed8, tmp_path, monkeypatch):
    """Loader on an S3 URL with cache_limit at its documented minimum (two blocks of the largest
    shards), cold then warm cache: batches that straddle two blocks pin the old block's shards
    while they wait for the next block's, which the read-ahead is fetching and finds no room
    for. The read-ahead waits for room without holding the shard's download lock, so the batch
    takes the lock and makes room itself. A download ahead here waits for room as long as it
    takes: holding the lock meanwhile would be a hang, which the deadline turns into a failure."""
    import s3fs

    from recordtool import remote as rremote
    from recordtool.loader import Loader

    monkeypatch.setattr(rremote, "AHEAD_WAIT", 3600.0)
    fs = s3fs.S3FileSystem(**s3.options)
    fs.mkdir("minimum")
    for name in sorted(os.listdir(packed8)):
        fs.put_file(os.path.join(packed8, name), f"minimum/train/{name}")
    local = recordtool.open(packed8)
    limit = sum(sorted((s["bytes"] for s in local.shards), reverse=True)[:4])  # two blocks of 2
    kw = dict(batch_size=5, size=32, as_torch=False, with_ids=True, block_shards=2, drop_last=False, rank=0,
              world_size=1)
    loaders, got, failed = [], [], []

    def run():
        try:
            for seed in range(3):  # a cold cache, then warm ones (what earlier loaders left)
                ld = Loader("s3://minimum/train", cache_dir=str(tmp_path / "cache"), cache_limit=limit,
                            storage_options=s3.options, seed=seed, **kw)
                loaders.append(ld)
                ref = Loader(local, seed=seed, **kw)
                for epoch in range(2):
                    ld.set_epoch(epoch)
                    ref.set_epoch(epoch)
                    a = [(np.asarray(x).copy(), np.asarray(y).copy(), ids) for x, y, ids in ld]
                    b = [(np.asarray(x).copy(), np.asarray(y).copy(), ids) for x, y, ids in ref]
                    got.append(len(a) == len(b) and all(np.array_equal(p, q) for u, v in zip(a, b)
                                                          for p, q in zip(u, v)))
                    got[-1] = got[-1] and sorted(np.concatenate([g[2] for g in a]).tolist()) == list(range(48))
                ld.close()
                ref.close()
                ld.ds.close()
        except BaseException as e:  # noqa: BLE001 — reported by the test's thread
            failed.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=300)
    hung = t.is_alive()
    for ld in loaders:  # a hung loader's downloads end with Cancelled: the thread can finish
        ld.ds.cache.closed.set()
    assert not hung, "the Loader stopped making batches (waiting on its own read-ahead)"
    assert not failed, failed
    assert got == [True] * 6


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
@pytest.mark.parametrize("how", ["close", "drop"])
def test_loaders_closed_or_dropped_let_go_of_their_shards(s3, packed8, tmp_path, monkeypatch, how):
    """Loaders on one cache at its smallest cache_limit, one after another, each closed after
    an epoch (and kept) or dropped: each lets go of its shards — pins ended, fds closed — so
    the next finds room (before, a closed Loader kept its pins until exit: the next waited
    ROOM_WAIT for them, 120 s, then CacheFull; here shortened, so that fails fast)."""
    import gc

    import s3fs

    from recordtool.loader import Loader

    monkeypatch.setattr(rcache, "ROOM_WAIT", 10.0)
    fs = s3fs.S3FileSystem(**s3.options)
    bucket = f"letgo-{how}"
    fs.mkdir(bucket)
    for name in sorted(os.listdir(packed8)):
        fs.put_file(os.path.join(packed8, name), f"{bucket}/train/{name}")
    limit = sum(sorted((s["bytes"] for s in recordtool.open(packed8).shards), reverse=True)[:4])  # two blocks of 2
    kept = []
    for seed in range(3):
        ld = Loader(f"s3://{bucket}/train", batch_size=5, size=32, as_torch=False, with_ids=True, block_shards=2,
                    drop_last=False, seed=seed, rank=0, world_size=1, cache_dir=str(tmp_path / "cache"),
                    cache_limit=limit, storage_options=s3.options)
        assert sorted(np.concatenate([ids for _, _, ids in ld]).tolist()) == list(range(48))
        shards = ld.ds.cache.shards_dir
        if how == "close":
            ld.close()
            kept.append(ld)
        else:
            del ld
            gc.collect()
            for t in threading.enumerate():  # a download thread holds the dataset while it downloads
                if t.name == "recordtool-fetch":
                    t.join(60)
            gc.collect()
        assert _open_below(shards) == []


def test_a_record_being_read_keeps_its_shard_needed(packed, tmp_path, monkeypatch):
    """A record counts as served only once its reader holds its bytes. Counted before (when the
    read began), a reader that is still fetching a shard while others read that shard's other
    records made the shard look done for the epoch: it was unmapped and evicted under the
    reader, which then had to download it again — at the smallest cache_limit, into room that
    the other blocks in use held, waiting until CacheFull."""
    from recordtool import remote as rremote

    monkeypatch.setattr(rremote, "FETCH_THREADS", 0)  # no read-ahead: only the readers download
    local = recordtool.open(packed)
    ds = _open(_upload(packed), tmp_path, cache_limit=sum(sorted(s["bytes"] for s in local.shards)[-3:]))
    ds.sampler(seed=0, block_shards=1, shuffle=False).indices(0)  # the epoch's plan: shards in turn
    of = {k: [i for i in range(len(ds)) if int(ds.index.shard[i]) == k] for k in range(4)}
    first = ds.shards[0]["name"]
    downloads, fetched, go = [], threading.Event(), threading.Event()
    download, fetch = rcache.ShardCache._download, rcache.ShardCache.fetch

    def counted(self, dir_fd, fd, fname, name, *a, **k):
        downloads.append(name)
        return download(self, dir_fd, fd, fname, name, *a, **k)

    def paused(self, name, *a, **k):  # the slow reader: fetched, not yet pinned
        got = fetch(self, name, *a, **k)
        if threading.current_thread().name == "slow" and name == first and not fetched.is_set():
            fetched.set()
            go.wait(10)
        return got

    monkeypatch.setattr(rcache.ShardCache, "_download", counted)
    monkeypatch.setattr(rcache.ShardCache, "fetch", paused)
    held = []
    slow = threading.Thread(target=lambda: held.append(bytes(ds.jpeg_views(of[0][-1:])[0])), name="slow")
    slow.start()
    assert fetched.wait(10)
    for k in range(4):  # the other records of shard 0, then shards 1..3 whole: room is made by eviction
        got = [bytes(v) for v in ds.jpeg_views(of[k][:-1] if k == 0 else of[k])]
        assert got == [bytes(local[i][0]) for i in (of[k][:-1] if k == 0 else of[k])]
    go.set()
    slow.join(30)
    assert held == [bytes(local[of[0][-1]][0])]
    assert downloads.count(first) == 1, downloads
    ds.close()


# ------------------------------------------------------------------ names and keys

def _open_below(folder: str) -> list:
    """The files and folders below `folder` this process has open (/proc/self/fd)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(folder + os.sep):
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_closed_or_dropped_dataset_lets_go_of_its_shards(remote, packed, tmp_path):
    """close() unmaps every shard, closes its fd and ends its pin (another reader of the cache
    sees nothing pinned); the dataset stays usable (a later read maps again). Dropped without
    close(), a dataset lets go of the same when it is collected, and of its cache folder's
    fds: nothing of it stays open."""
    import gc

    local = recordtool.open(packed)
    total = sum(s["bytes"] for s in local.shards)
    ds = _open(remote, tmp_path)
    assert _read_all(ds) == _read_all(local)
    shards = ds.cache.shards_dir
    other = _open(remote, tmp_path)
    assert _open_below(shards) and other.cache.pinned() == total
    ds.close()
    assert _open_below(shards) == [] and other.cache.pinned() == 0
    assert _read_all(ds) == _read_all(local)  # maps again
    assert other.cache.pinned() == total
    del ds
    gc.collect()
    assert _open_below(shards) == [] and other.cache.pinned() == 0
    other.close()
    del other
    gc.collect()
    assert _open_below(str(tmp_path / "cache")) == []


def test_cache_key_depends_on_the_store():
    a = rcache.key("s3://b/x/train", 's3:{"endpoint_url": "http://a"}')
    b = rcache.key("s3://b/x/train", 's3:{"endpoint_url": "http://b"}')
    assert a != b and a.endswith("-train") and b.endswith("-train")
    from recordtool.io.fs import FsspecFS

    one, _ = FsspecFS.from_url("memory://k/x")
    assert one.store_id() == FsspecFS.from_url("memory://k/x")[0].store_id()


def _rename_shard(root: str, k: int, new: str) -> None:
    m = json.load(open(os.path.join(root, "manifest.json")))
    os.rename(os.path.join(root, m["shards"][k]["name"]), os.path.join(root, new))
    m["shards"][k]["name"] = new
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(m, f)




def test_shard_name_of_250_bytes_reads_locally_and_through_the_cache(packed, tmp_path):
    root = _copy(packed, tmp_path)
    long = "p" * 250
    _rename_shard(root, 1, long)
    local = recordtool.open(root)
    want = _read_all(local)
    url = _upload(root)
    ds = _open(url, tmp_path)
    assert _read_all(ds) == want
    assert all(len(n) <= 255 for n in os.listdir(ds.cache.shards_dir) + os.listdir(ds.cache.locks_dir))
    ds.close()


@pytest.mark.parametrize("what", ["shard", "index"])
def test_names_over_255_bytes_are_a_named_error(packed, tmp_path, what):
    root = _copy(packed, tmp_path)
    m = json.load(open(os.path.join(root, "manifest.json")))
    if what == "shard":
        m["shards"][0]["name"] = "s" * 300
    else:
        m["index"]["file"] = "i" * 300
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(m, f)
    with pytest.raises(FormatError, match="more than the 255"):
        recordtool.open(root)
    from recordtool.verify import verify

    res = verify(root)
    assert not res.ok and "more than the 255" in res.errors[0]
    with pytest.raises(FormatError, match="more than the 255"):
        _open(_upload(root), tmp_path)


def test_deeply_nested_manifest_is_a_named_error(packed, tmp_path):
    from recordtool.inspect import summarize
    from recordtool.verify import verify

    root = _copy(packed, tmp_path)
    write(os.path.join(root, "manifest.json"), b"[" * 100_000)
    with pytest.raises(FormatError, match="nested too deeply"):
        recordtool.open(root)
    res = verify(root)
    assert not res.ok and "nested too deeply" in res.errors[0]
    with pytest.raises(FormatError, match="nested too deeply"):
        summarize(root)
    with pytest.raises(FormatError, match="nested too deeply"):
        _open(_upload(root), tmp_path)
    from click.testing import CliRunner

    from recordtool.cli import main

    r = CliRunner().invoke(main, ["inspect", root])
    assert r.exit_code == 1 and "nested too deeply" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------ the dataset object

def test_dataset_url_goes_through_open(packed):
    with pytest.raises(ValueError, match="recordtool.open"):
        recordtool.Dataset("memory://x/y")
    assert isinstance(recordtool.open(packed), recordtool.Dataset)


def test_datasets_pickle_by_path_and_options(remote, packed, tmp_path):
    local = recordtool.open(packed)
    again = pickle.loads(pickle.dumps(local))
    assert again.root == local.root and _read_all(again) == _read_all(local)
    ds = _open(remote, tmp_path, cache_limit=_small_limit(packed))
    assert bytes(ds[0][0])
    back = pickle.loads(pickle.dumps(ds))
    assert type(back) is type(ds) and back.root == ds.root and back.cache_limit == ds.cache_limit
    assert back.cache.dir == ds.cache.dir and _read_all(back) == _read_all(local)
    back.close()
    ds.close()


def test_unpickled_local_dataset_refuses_another_dataset_at_its_path(packed, tmp_path):
    """A pickled dataset carries its manifest's fingerprint: unpickled after its folder was
    re-packed (other records and labels under the same indices), DatasetChanged names it."""
    import shutil

    from recordtool.errors import DatasetChanged
    from recordtool.pack import pack

    root = _copy(packed, tmp_path, "repacked")
    blob = pickle.dumps(recordtool.open(root))
    assert pickle.loads(blob).fingerprint == recordtool.open(root).fingerprint
    for i in range(6):
        write(str(tmp_path / "src" / f"k{i % 2}" / f"{i}.jpg"), jpeg_bytes(44, 36, seed=2000 + i))
    pack(str(tmp_path / "src"), str(tmp_path / "other"), shards=2, progress=False)
    shutil.rmtree(root)
    shutil.copytree(tmp_path / "other", root)
    with pytest.raises(DatasetChanged, match=f"{root}: holds another dataset than the one pickled"):
        pickle.loads(blob)


def _child(ds, out):
    out.put([(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))])


def test_dataset_crosses_a_spawned_process(packed):
    local = recordtool.open(packed)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_child, args=(local, out))
    p.start()
    got = out.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0 and got == _read_all(local)


def test_block_of_one_shard_is_not_told_to_lower_block_shards(remote, packed, tmp_path):
    largest = max(s["bytes"] for s in recordtool.open(packed).shards)
    ds = _open(remote, tmp_path, cache_limit=largest)
    with pytest.raises(CacheFull) as e:
        ds.sampler(block_shards=1)
    assert "lower block_shards" not in str(e.value) and "raise cache_limit to at least" in str(e.value)
    with pytest.raises(CacheFull, match="or lower block_shards"):
        ds.sampler(block_shards=2)
    ds.close()
    assert issubclass(CacheFull, RecordtoolError)
