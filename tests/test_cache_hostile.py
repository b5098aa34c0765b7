"""Adversarial suite for the storage layer: a hostile shard cache folder (planted links, foreign
files, copies changed after their download), hostile names and manifests, and what a remote
dataset may cost. The cache is reached through memory:// here (the same code as s3://, no
server); tests/test_remote.py covers a real S3 server behind a misbehaving proxy."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import warnings

import numpy as np
import pytest

from conftest import jpeg_bytes, write

fsspec = pytest.importorskip("fsspec")

import recordtool  # noqa: E402
from recordtool.errors import CacheFull, FormatError, RecordtoolError, UnsafePath  # noqa: E402
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
        del entry["sha256"]
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


# ------------------------------------------------------------------ names and keys

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
