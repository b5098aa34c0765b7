"""Datasets on object storage: a real S3 server (moto) on 127.0.0.1 behind a fault-injecting
proxy (tests/s3server.py); the client is s3fs, unpatched (its own retry count set to 1, so the
retries under test are recordtool's)."""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import pickle
import socket
import threading

import numpy as np
import pytest

from conftest import jpeg_bytes, write

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import recordtool  # noqa: E402
from recordtool.io import cache as rcache  # noqa: E402
from recordtool.errors import CacheFull, FormatError, RemoteError  # noqa: E402
from recordtool.io import Retry  # noqa: E402
from recordtool.sampler import BlockSampler, Sampler  # noqa: E402
from s3server import S3, Fault  # noqa: E402

FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05)
_buckets = itertools.count()


@pytest.fixture(scope="module")
def s3():
    import s3fs

    server = S3()
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setattr(s3fs.S3FileSystem, "retries", 1)  # s3fs's own retry knob: recordtool's retries are tested
        yield server
    server.stop()


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """48 small images in 8 shards."""
    tmp = tmp_path_factory.mktemp("remote")
    for c in range(3):
        for i in range(16):
            write(str(tmp / "src" / f"c{c}" / f"{i}.jpg"), jpeg_bytes(48 + 4 * (i % 5), 40, seed=100 * c + i))
    from recordtool.pack import pack

    pack(str(tmp / "src"), str(tmp / "out"), shards=8, progress=False)
    return str(tmp / "out")


@pytest.fixture
def remote(s3, packed):
    """(url, s3fs filesystem) of a fresh bucket holding the packed dataset."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3.options)
    bucket = f"rt-{next(_buckets)}"
    fs.mkdir(bucket)
    for name in sorted(os.listdir(packed)):
        fs.put_file(os.path.join(packed, name), f"{bucket}/data/train/{name}")
    s3.proxy.clear()
    yield f"s3://{bucket}/data/train", fs
    s3.proxy.clear()


def open_remote(s3, url, tmp_path, **kw):
    kw.setdefault("retry", FAST)
    kw.setdefault("storage_options", s3.options)
    return recordtool.open(url, cache_dir=str(tmp_path / "cache"), **kw)


def shard_files(ds) -> list:
    return sorted(os.listdir(ds.cache.shards_dir))


def test_remote_dataset_reads_like_local(s3, remote, packed, tmp_path):
    url, _ = remote
    local = recordtool.open(packed)
    ds = open_remote(s3, url, tmp_path)
    assert isinstance(ds, recordtool.Dataset) and ds.root == url
    assert ds.manifest == local.manifest and len(ds) == len(local) == 48
    for k in local.index.columns:
        assert np.array_equal(ds.index.columns[k], local.index.columns[k])
    for i in range(len(ds)):
        a, la = local[i]
        b, lb = ds[i]
        assert isinstance(b, memoryview) and bytes(a) == bytes(b) and la == lb
        assert bytes(ds.record(i)) == bytes(local.record(i))
        del a, b
    # each shard downloaded once, checked, named by its CRC32C; nothing half-done left
    assert shard_files(ds) == sorted(f"{s['name']}.{s['crc32c']}" for s in local.shards)
    for s in local.shards:
        assert s3.proxy.count("GET", f"/data/train/{s['name']}") == 1
    assert isinstance(ds.sampler(), BlockSampler) and type(local.sampler()) is Sampler
    ds.close()
    # a second open finds the index and shards in the cache: only the manifest is fetched again
    s3.proxy.clear()
    again = open_remote(s3, url, tmp_path)
    assert bytes(again[5][0]) == bytes(local[5][0])
    gets = [p for m, p in s3.proxy.requests if m == "GET"]
    assert gets == [f"/{url[5:]}/manifest.json"]
    again.close()


def test_epoch_fetches_each_shard_once_and_cache_stays_bounded(s3, remote, packed, tmp_path):
    url, _ = remote
    local = recordtool.open(packed)
    sizes = sorted((s["bytes"] for s in local.shards), reverse=True)
    limit = sum(sizes[:4])  # two blocks of two shards
    ds = open_remote(s3, url, tmp_path, cache_limit=limit)
    sampler = ds.sampler(seed=3, block_shards=2)
    peak = 0
    for epoch in range(2):
        s3.proxy.clear()
        for i in sampler.indices(epoch):
            data, label = ds[int(i)]
            assert bytes(data) == bytes(local[int(i)][0])
            del data
            peak = max(peak, ds.cache.used())
        for s in local.shards:  # once per epoch (or not at all: still cached from the last epoch)
            assert s3.proxy.count("GET", f"/data/train/{s['name']}") in ((1,) if epoch == 0 else (0, 1)), s["name"]
    assert 0 < peak <= limit and ds.cache.used() <= limit
    assert len(shard_files(ds)) < len(local.shards)  # evicted along the way
    with pytest.raises(CacheFull, match="two blocks"):
        ds.sampler(block_shards=4)
    ds.close()


def test_pinned_shard_is_never_evicted(s3, remote, packed, tmp_path):
    url, _ = remote
    local = recordtool.open(packed)
    limit = sum(sorted((s["bytes"] for s in local.shards), reverse=True)[:3])
    ds = open_remote(s3, url, tmp_path, cache_limit=limit)
    other = open_remote(s3, url, tmp_path, cache_limit=limit)  # another reader of the same cache folder
    first = int(np.nonzero(local.index.shard == 0)[0][0])
    held, _ = other[first]  # its view of shard 0 stays alive while every other shard passes through ds
    expect = bytes(held)
    for i in range(len(ds)):
        if local.index.shard[i] != 0:
            _ = bytes(ds[i][0])
        assert ds.cache.used() <= limit
    assert bytes(held) == expect and f"part-00000.{local.shards[0]['crc32c']}" in shard_files(ds)
    del held
    other.close()
    # without the view, shard 0 can go: the next shards evict it
    for i in range(len(ds)):
        if local.index.shard[i] != 0:
            _ = bytes(ds[i][0])
    assert ds.cache.used() <= limit
    ds.close()


@pytest.mark.parametrize("kind,last", [("503", "injected"), ("stall", "[Tt]imeout"), ("truncate", ""),
                                       ("flip", "CRC32C")])
def test_faults_are_retried_then_named(s3, remote, packed, tmp_path, kind, last):
    """5xx answers and stalls past the read timeout are retried; a truncated or altered body is
    caught (size, CRC32C) and fetched again; persistent faults raise RemoteError naming the
    object after the retries, and nothing half-downloaded stays in the cache."""
    url, _ = remote
    local = recordtool.open(packed)
    options = s3.options
    times = 2
    if kind == "stall":  # a stall of 2 s against a read timeout of 0.7 s
        options = dict(options, config_kwargs=dict(options["config_kwargs"], read_timeout=0.7))
        times = 1  # (a loaded machine may time out once more: one try to spare)
    ds = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=options, retry=FAST)
    info = local.shards[5]
    fault = dict(seconds=2.0, keep=info["bytes"] // 2, offset=info["bytes"] // 3)
    s3.proxy.add(Fault("part-00005", kind, times=times, **fault))
    i = int(np.nonzero(local.index.shard == 5)[0][0])
    assert bytes(ds[i][0]) == bytes(local[i][0])
    gets = s3.proxy.count("GET", "part-00005")  # the faulty answers, then the good one
    assert gets == times + 1 or (kind == "stall" and gets == times + 2)
    s3.proxy.add(Fault("part-00006", kind, times=100, **fault))
    j = int(np.nonzero(local.index.shard == 6)[0][0])
    with pytest.raises(RemoteError, match=rf"{url}/part-00006: failed 3 times.*{last}"):
        ds[j]
    assert not [f for f in shard_files(ds) if f.startswith("part-00006")]
    ds.close()


def test_shard_missing_remotely_is_named(s3, remote, packed, tmp_path):
    url, fs = remote
    fs.rm_file(f"{url[5:]}/part-00007")
    ds = open_remote(s3, url, tmp_path)
    i = int(np.nonzero(ds.index.shard == 7)[0][0])
    with pytest.raises(FormatError, match=rf"{url}/part-00007: missing on object storage"):
        ds[i]
    assert bytes(ds[0][0])  # the other shards still read
    ds.close()
    with pytest.raises(FormatError, match="no manifest"):
        open_remote(s3, url + "-nothing", tmp_path)


def test_stale_part_file_is_cleared_and_never_used(s3, remote, packed, tmp_path):
    url, _ = remote
    local = recordtool.open(packed)
    ds = open_remote(s3, url, tmp_path)
    info = local.shards[0]
    stale = os.path.join(ds.cache.shards_dir, f"part-00000.{info['crc32c']}.part")
    write(stale, b"\0" * info["bytes"])  # what a killed download leaves: right size, wrong bytes
    i = int(np.nonzero(local.index.shard == 0)[0][0])
    assert bytes(ds[i][0]) == bytes(local[i][0])
    assert not os.path.exists(stale)
    ds.close()


def _reader(url, cache_dir, options, rank, barrier, out):
    ds = recordtool.open(url, cache_dir=cache_dir, storage_options=options, retry=FAST)
    ids = ds.sampler(seed=4, rank=rank, world_size=2, block_shards=2).indices(0)  # fetches ahead too
    barrier.wait()
    out.put((rank, [(int(i), bytes(ds[int(i)][0])) for i in ids]))
    ds.close()


def test_processes_share_the_cache_one_download_per_shard(s3, remote, packed, tmp_path):
    url, _ = remote
    local = recordtool.open(packed)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    s3.proxy.add(*[Fault(s["name"], "stall", seconds=0.3) for s in local.shards[:3]])  # widen the race
    procs = [ctx.Process(target=_reader, args=(url, str(tmp_path / "cache"), s3.options, rank, barrier, out))
             for rank in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    got = results[0] + results[1]  # two ranks: every sample once, the bytes of the local dataset
    assert sorted(i for i, _ in got) == list(range(len(local)))
    assert all(data == bytes(local[i][0]) for i, data in got)
    for s in local.shards:  # readers and downloads ahead of both processes: one download each
        assert s3.proxy.count("GET", f"/data/train/{s['name']}") == 1, s["name"]


def test_cache_key_and_default_dir(monkeypatch, tmp_path):
    assert rcache.key("s3://b/x/train") != rcache.key("s3://c/x/train")
    assert rcache.key("s3://b/x/train/").endswith("-train") and "/" not in rcache.key("s3://b/../..")
    monkeypatch.setenv("RECORDTOOL_CACHE_DIR", str(tmp_path))
    assert rcache.default_dir() == str(tmp_path)


@pytest.fixture
def s3_config(s3, monkeypatch):
    """The server reached through fsspec's configuration, as a user's CLI would (FSSPEC_S3_* variables)."""
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", dict(s3.options))


def test_cli_inspect_and_verify_remote(s3, s3_config, remote, packed, tmp_path):
    import json

    from click.testing import CliRunner

    from recordtool.cli import main

    url, fs = remote
    cache = str(tmp_path / "cache")
    r = CliRunner().invoke(main, ["inspect", url, "--json", "--cache-dir", cache])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["path"] == url and s["records"] == 48 and len(s["shards"]) == 8
    assert s3.proxy.count("GET", "part-") == 0  # the manifest and the index only
    r = CliRunner().invoke(main, ["verify", url, "--decode", "-q", "--cache-dir", cache, "--cache-limit", "10KB"])
    assert r.exit_code == 0, r.output
    assert "OK: 48 records verified, 48 decoded" in r.output
    assert sum(os.path.getsize(os.path.join(d, f)) for d, _, fs_ in os.walk(os.path.join(cache)) if
               d.endswith("shards") for f in fs_) <= 10 * 1024
    r = CliRunner().invoke(main, ["verify", url.replace("train", "nothing"), "-q", "--cache-dir", cache])
    assert r.exit_code == 1 and "no manifest" in r.output


def test_verify_remote_names_a_damaged_shard(s3, remote, packed, tmp_path):
    from recordtool.verify import verify

    url, fs = remote
    key = f"{url[5:]}/part-00003"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 1  # altered on the store itself: every download is caught by CRC32C
    fs.pipe_file(key, bytes(data))
    res = verify(url, cache_dir=str(tmp_path / "cache"), storage_options=s3.options, retry=FAST)
    assert not res.ok and len(res.errors) == 1
    assert res.errors[0].startswith(f"{url}/part-00003: failed 3 times") and "CRC32C" in res.errors[0]
    assert res.records == 48 - recordtool.open(packed).shards[3]["records"]


def test_pack_tfrecords_from_s3(s3, s3_config, remote, tmp_path):
    """`pack --from tfrecord 's3://…/slim-*'`: the same dataset as from the local files; damage
    named with the URL; the downloads live in the scratch folder only while pack runs."""
    from click.testing import CliRunner

    from recordtool.cli import main

    _, fs = remote
    fix = os.path.join(os.path.dirname(__file__), "fixtures", "tfrecord")
    bucket = f"tf-{next(_buckets)}"
    fs.mkdir(bucket)
    for name in ("slim-00000-of-00002", "slim-00001-of-00002", "slim.gz", "truncated"):
        fs.put_file(os.path.join(fix, name), f"{bucket}/tf/{name}")
    s3.proxy.add(Fault("slim-00001-of-00002", "503", times=1))  # retried
    args = ["pack", "--from", "tfrecord", "--keys", "tf-slim", "--shards", "2", "-q"]
    r = CliRunner().invoke(main, args + [f"s3://{bucket}/tf/slim-0000*", str(tmp_path / "remote")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, args + [os.path.join(fix, "slim-0000*"), str(tmp_path / "local")])
    assert r.exit_code == 0, r.output
    a, b = recordtool.open(str(tmp_path / "remote")), recordtool.open(str(tmp_path / "local"))
    assert len(a) == len(b) == 12
    assert [(bytes(a[i][0]), a[i][1]) for i in range(12)] == [(bytes(b[i][0]), b[i][1]) for i in range(12)]
    assert a.manifest["source"]["files"] == [f"s3://{bucket}/tf/slim-00000-of-00002",
                                             f"s3://{bucket}/tf/slim-00001-of-00002"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith("recordtool-tfrecord-")]
    # compressed and damaged remote files: inflated after the download, damage named by URL
    r = CliRunner().invoke(main, args + [f"s3://{bucket}/tf/slim.gz", f"s3://{bucket}/tf/truncated",
                                         str(tmp_path / "mixed")])
    assert r.exit_code == 0, r.output
    assert f"s3://{bucket}/tf/truncated: offset" in r.output and "packed 17 records" in r.output
    r = CliRunner().invoke(main, args + [f"s3://{bucket}/tf/nothing-*", str(tmp_path / "none")])
    assert r.exit_code != 0 and "no file matches" in r.output
    r = CliRunner().invoke(main, args + [f"s3://{bucket}/tf/nothing", str(tmp_path / "none")])
    assert r.exit_code != 0 and f"s3://{bucket}/tf/nothing: no such file" in r.output


def test_pack_to_s3_all_or_nothing(s3, s3_config, remote, packed, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from recordtool.cli import main
    from recordtool.format import upload

    monkeypatch.setattr(upload, "Retry", lambda: FAST)  # the default backoff, shortened

    _, fs = remote
    src = tmp_path / "src"
    for c in range(2):
        for i in range(6):
            write(str(src / f"k{c}" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=10 * c + i))
    bucket = f"out-{next(_buckets)}"
    fs.mkdir(bucket)
    url = f"s3://{bucket}/sets/small"
    run = CliRunner().invoke
    r = run(main, ["pack", str(src), url, "--shards", "4", "-q"])
    assert r.exit_code == 0, r.output
    assert "packed 12 records into 4 shards" in r.output
    puts = [p.rsplit("/", 1)[-1] for m, p in s3.proxy.requests if m == "PUT" and "/sets/small/" in p]
    assert puts[-1] == "manifest.json" and puts[0] == "pack.json"  # marker first, manifest last
    assert not fs.exists(f"{bucket}/sets/small/.partial/pack.json")
    assert run(main, ["pack", str(src), str(tmp_path / "local"), "--shards", "4", "-q"]).exit_code == 0
    ds = recordtool.open(url, cache_dir=str(tmp_path / "cache"), retry=FAST)
    for name in [s["name"] for s in ds.shards] + ["index.rtx"]:
        assert fs.cat_file(f"{bucket}/sets/small/{name}") == open(tmp_path / "local" / name, "rb").read()
    assert run(main, ["verify", url, "-q", "--cache-dir", str(tmp_path / "cache")]).exit_code == 0
    ds.close()
    # a finished dataset is kept unless --overwrite
    r = run(main, ["pack", str(src), url, "--shards", "2", "-q"])
    assert r.exit_code != 0 and "--overwrite" in r.output
    # a publish that fails half-way: no manifest, so nothing looks finished; the re-run cleans up
    s3.proxy.add(Fault("/sets/small/part-00001", "503", times=1000, method="PUT"))
    r = run(main, ["pack", str(src), url, "--shards", "2", "--overwrite", "-q"])
    assert r.exit_code != 0 and "part-00001: failed 3 times" in r.output
    assert not fs.exists(f"{bucket}/sets/small/manifest.json")
    with pytest.raises(FormatError, match="no manifest"):
        recordtool.open(url, cache_dir=str(tmp_path / "cache"), retry=FAST)
    s3.proxy.clear()
    r = run(main, ["pack", str(src), url, "--shards", "2", "-q"])  # ours (the marker says so): no --overwrite needed
    assert r.exit_code == 0, r.output
    fs.invalidate_cache()
    assert sorted(fs.ls(f"{bucket}/sets/small", detail=False)) == \
        [f"{bucket}/sets/small/{n}" for n in ["index.rtx", "manifest.json", "pack_report.json", "part-00000",
                                              "part-00001"]]
    ds = recordtool.open(url, cache_dir=str(tmp_path / "cache2"), retry=FAST)
    assert len(ds) == 12 and len(ds.shards) == 2
    ds.close()
    # a prefix holding something else is refused
    fs.pipe_file(f"{bucket}/other/notes.txt", b"mine")
    r = run(main, ["pack", str(src), f"s3://{bucket}/other", "-q"])
    assert r.exit_code != 0 and "not empty and holds no recordtool dataset" in r.output
    assert fs.cat_file(f"{bucket}/other/notes.txt") == b"mine"


def test_loader_over_s3_gives_the_local_batches(s3, s3_config, remote, packed, tmp_path):
    """Loader("s3://…") with cache options: the same batches as the local dataset read in the
    same block order; every sample once per epoch; the cache within its limit."""
    from recordtool.loader import Loader

    url, _ = remote
    local = recordtool.open(packed)
    limit = sum(sorted((s["bytes"] for s in local.shards), reverse=True)[:4])  # two blocks of 2
    # batches of 4: the two producers' batches in flight (8 records) stay within a block of two
    # shards (12 records), so at most two blocks are wanted at once and each shard is downloaded
    # once per epoch (with more in flight than a block holds, a third block's shard may evict one
    # of the next block's before it is read: downloaded again, README: Reliability)
    kw = dict(batch_size=4, size=32, seed=2, as_torch=False, with_ids=True, rank=0, world_size=1)
    with pytest.raises(CacheFull, match="lower block_shards"):
        Loader(url, cache_dir=str(tmp_path / "cache"), cache_limit=limit, **kw)  # default: 4 shards a block
    ld = Loader(url, cache_dir=str(tmp_path / "cache"), cache_limit=limit, block_shards=2, **kw)
    assert isinstance(ld.sampler.order, BlockSampler) and ld.ds.cache_limit == limit
    assert not ld.continuous  # the cache's fetch-ahead follows one epoch's plan: no run into the next
    ref = Loader(local, block_shards=2, **kw)
    for epoch in range(2):
        s3.proxy.clear()
        ld.set_epoch(epoch)
        ref.set_epoch(epoch)
        got = [(np.asarray(x).copy(), np.asarray(y).copy(), ids) for x, y, ids in ld]
        want = [(np.asarray(x).copy(), np.asarray(y).copy(), ids) for x, y, ids in ref]
        assert len(got) == len(want) == 12
        for (a, la, ia), (b, lb, ib) in zip(got, want):
            assert np.array_equal(ia, ib) and np.array_equal(la, lb) and np.array_equal(a, b)
        assert sorted(np.concatenate([g[2] for g in got]).tolist()) == list(range(48))
        assert ld.ds.cache.used() <= limit
        for s in local.shards:  # each shard fetched once per epoch (or still cached from the last)
            # counted by this test's bucket: the server and its log are the module's, and a dataset an
            # earlier test dropped may still be fetching from its own bucket's same-named shards
            assert s3.proxy.count("GET", f"/{url[len('s3://'):]}/{s['name']}") in ((1,) if epoch == 0 else (0, 1))
    ld.close()


def test_any_fsspec_url_and_file_urls(packed, tmp_path):
    """memory:// goes through the same cache as s3://; file:// is a local path (no cache)."""
    import fsspec

    mem = fsspec.filesystem("memory")
    mem.put(packed, "/rt-mem/train", recursive=True)
    local = recordtool.open(packed)
    ds = recordtool.open("memory://rt-mem/train", cache_dir=str(tmp_path / "cache"), retry=FAST)
    assert type(ds).__name__ == "RemoteDataset"
    assert [bytes(ds[i][0]) for i in range(0, 48, 5)] == [bytes(local[i][0]) for i in range(0, 48, 5)]
    ds.close()
    mem.rm("/rt-mem", recursive=True)
    f = recordtool.open("file://" + packed)
    assert type(f) is recordtool.Dataset and f.root == packed and bytes(f[3][0]) == bytes(local[3][0])


def test_downloads_refused_when_the_disk_has_no_room(s3, s3_config, remote, tmp_path, monkeypatch):
    """The index and TFRecord sources are sized before they are fetched: a disk without room for
    them is an error naming the file, not a filled disk."""
    import shutil as _shutil
    from collections import namedtuple

    from recordtool.errors import PackError
    from recordtool.sources.tfrecord import PRESETS, TFRecordSource

    url, fs = remote
    fs.put_file(os.path.join(os.path.dirname(__file__), "fixtures", "tfrecord", "slim.gz"), f"{url[5:]}-tf/slim.gz")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(_shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 100, 100))
    with pytest.raises(CacheFull, match=rf"{url}/index.rtx: \d+ bytes, the disk of .* has 100 free"):
        recordtool.open(url, cache_dir=str(tmp_path / "cache"), cache_limit=10**6, retry=FAST)
    with pytest.raises(PackError, match=rf"{url}-tf/slim.gz: \d+ bytes to download into .*100 bytes free"):
        TFRecordSource([f"{url}-tf/slim.gz"], dict(PRESETS["tf-slim"]), tmpdir=str(tmp_path))
    assert not [n for n in os.listdir(tmp_path) if n.startswith("recordtool-tfrecord-")]


# ------------------------------------------------------------------ hostile stores and options

def test_cache_key_includes_the_endpoint(s3, remote, tmp_path):
    """The same s3:// URL on two endpoints (here: through the proxy and straight to the server)
    gets two cache folders: data from one store is never served for another."""
    url, _ = remote
    host, port = s3.moto.get_host_and_port()
    direct = dict(s3.options, endpoint_url=f"http://{host}:{port}")
    a = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=s3.options, retry=FAST)
    b = recordtool.open(url, cache_dir=str(tmp_path / "cache"), storage_options=direct, retry=FAST)
    assert a.root == b.root and a.cache.dir != b.cache.dir
    a.close()
    b.close()


_BOUNDED = """
import os, resource, sys
sys.path.insert(0, {tests!r})
import recordtool
from recordtool.format import manifest as mf
from recordtool.io import Retry
from recordtool.errors import RecordtoolError
def vm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) // 1024
opts = {options!r}
fast = Retry(attempts=2, backoff=0.01, max_backoff=0.02)
ds = recordtool.open({url!r}, cache_dir={cache!r}, storage_options=opts, retry=fast)  # warm: threads, pools
assert bytes(ds[{warm}][0])
ds.close()
lim = (vm_mb() + 150) << 20  # the padding (400 MB) would not fit
resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
mf.MAX_BYTES = 1 << 20
try:
    {action}
except RecordtoolError as e:
    print("REFUSED", type(e).__name__, e)
"""


@pytest.mark.parametrize("what", ["manifest", "shard"])
def test_a_server_answering_with_more_bytes_costs_bounded_memory(s3, remote, packed, tmp_path, what):
    """Every read stops at the size expected (a shard: the manifest's size; a manifest:
    MAX_BYTES): a GET answered with 400 MB more than the object has is refused, in a process
    that could not hold them."""
    import subprocess
    import sys

    url, _ = remote
    local = recordtool.open(packed)
    i = int(np.nonzero(local.index.shard == 4)[0][0])
    j = int(np.nonzero(local.index.shard != 4)[0][0])  # the warm-up reads another shard
    cache = str(tmp_path / "cache")
    opened = f"recordtool.open({url!r}, cache_dir={cache!r}, storage_options=opts, retry=fast)"
    action = opened if what == "manifest" else f"{opened}[{i}]"
    code = _BOUNDED.format(tests=os.path.dirname(__file__), options=s3.options, url=url, cache=cache, action=action,
                           warm=j)
    s3.proxy.clear()
    if what == "manifest":  # the warm-up's GET of the manifest passes untouched, every later one is padded
        s3.proxy.add(Fault("manifest.json", "stall", times=1, seconds=0.0),
                     Fault("manifest.json", "pad", times=100, keep=400 << 20))
    else:
        s3.proxy.add(Fault("part-00004", "pad", times=100, keep=400 << 20))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    s3.proxy.clear()
    assert p.returncode == 0, p.stderr[-3000:]
    assert "REFUSED" in p.stdout and "MemoryError" not in p.stdout + p.stderr, p.stdout
    if what == "manifest":
        assert "manifest.json: more than the 1048576 bytes allowed" in p.stdout, p.stdout
    else:
        assert "part-00004: failed 2 times" in p.stdout and "more than the" in p.stdout, p.stdout


def test_loader_takes_storage_options(s3, remote, packed, tmp_path):
    """Loader(url, storage_options=…) reaches the store as recordtool.open does (no fsspec config)."""
    from recordtool.loader import Loader

    url, _ = remote
    local = recordtool.open(packed)
    kw = dict(batch_size=8, size=32, seed=2, as_torch=False, with_ids=True, block_shards=2)
    ld = Loader(url, cache_dir=str(tmp_path / "cache"), storage_options=s3.options, **kw)
    ref = Loader(local, **kw)
    got = [(np.asarray(x).copy(), ids) for x, _, ids in ld]
    want = [(np.asarray(x).copy(), ids) for x, _, ids in ref]
    assert len(got) == len(want) == 6
    assert all(np.array_equal(a, b) and np.array_equal(ia, ib) for (a, ia), (b, ib) in zip(got, want))
    ld.close()


def _remote_child(ds, out):
    out.put([(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))])
    ds.close()


def test_remote_dataset_crosses_a_spawned_process(s3, remote, packed, tmp_path):
    """recordtool.open(url)'s dataset pickles as URL + options: a spawned process reopens it
    (through the same cache folder) and reads the same records."""
    url, _ = remote
    local = recordtool.open(packed)
    ds = open_remote(s3, url, tmp_path)
    assert bytes(ds[0][0])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_remote_child, args=(ds, out))
    p.start()
    got = out.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0 and got == [(bytes(local[i][0]), local[i][1]) for i in range(len(local))]
    ds.close()


def test_pack_to_a_missing_bucket_fails_first_naming_it(s3, s3_config, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from recordtool.cli import main
    from recordtool.format import upload

    monkeypatch.setattr(upload, "Retry", lambda: FAST)  # the default backoff, shortened

    src = tmp_path / "src"
    for i in range(4):
        write(str(src / "k" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=i))
    s3.proxy.clear()
    r = CliRunner().invoke(main, ["pack", str(src), "s3://no-such-bucket/sets/a", "-q"])
    assert r.exit_code != 0 and "s3://no-such-bucket: no such bucket" in r.output and "create it first" in r.output, r.output
    assert "packed" not in r.output and not [m for m, _ in s3.proxy.requests if m in ("PUT", "POST")]


@pytest.mark.skipif(not os.path.isdir("/proc/self"),
                    reason="staging folders are named after their owner where /proc tells")
def test_a_killed_pack_to_a_url_leaves_its_stage_to_the_next_pack(s3, remote, tmp_path):
    """A pack to a URL SIGKILLed while it uploads leaves its staging folder in $TMPDIR; the next
    pack removes it — and nothing else: not a folder of the same name pattern without the
    marker, not a link named like a stage, not a stage whose owner lives, not other files."""
    import signal
    import subprocess
    import sys
    import time

    from recordtool.format import upload

    _, fs = remote
    src = tmp_path / "src"
    for c in range(2):
        for i in range(6):
            write(str(src / f"k{c}" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=10 * c + i))
    bucket = f"stage-{next(_buckets)}"
    fs.mkdir(bucket)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), FSSPEC_S3_ENDPOINT_URL=s3.proxy.url, FSSPEC_S3_KEY="testing",
               FSSPEC_S3_SECRET="testing")
    cli = [sys.executable, "-m", "recordtool.cli", "pack", "-q", "--shards", "2", str(src)]
    s3.proxy.add(Fault(f"/{bucket}/killed/part-", "stall", method="PUT", seconds=10))  # holds the upload
    p = subprocess.Popen(cli + [f"s3://{bucket}/killed"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not s3.proxy.count("PUT", f"/{bucket}/killed/part-"):
            assert p.poll() is None, p.stderr.read().decode()
            assert time.monotonic() < deadline, "the pack never started its upload"
            time.sleep(0.02)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        p.stderr.close()
    left = os.listdir(tmp)
    assert len(left) == 1 and left[0].startswith(upload.STAGE_PREFIX), left
    stage = tmp / left[0]
    assert (stage / "dataset").is_dir()  # the packed dataset it was uploading
    gone_owner = left[0][:left[0].rindex("-")]  # recordtool-stage-<ns>.<pid>.<start>: a process now gone
    foreign = {f"{gone_owner}-nomarker": "dir", f"{gone_owner}-link": "link", "notes": "dir",
               f"{gone_owner}-othermark": "marked"}
    (tmp / f"{gone_owner}-nomarker" / "keep").mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / upload.STAGE_MARKER).write_bytes((stage / upload.STAGE_MARKER).read_bytes())
    os.symlink(target, tmp / f"{gone_owner}-link")
    (tmp / "notes").mkdir()
    (tmp / f"{gone_owner}-othermark").mkdir()
    (tmp / f"{gone_owner}-othermark" / upload.STAGE_MARKER).write_text(
        '{"tool": "recordtool", "owner": ["1", "2", "3"]}')  # another owner's marker
    with pytest.MonkeyPatch.context() as m:
        m.setattr("tempfile.tempdir", str(tmp))
        live = upload.new_stage()  # this process's: alive
    try:
        r = subprocess.run(cli + [f"s3://{bucket}/next"], env=env, capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()
        assert not os.path.lexists(stage)
        assert sorted(os.listdir(tmp)) == sorted(list(foreign) + [os.path.basename(live)])
        assert os.listdir(target) == [upload.STAGE_MARKER] and (tmp / f"{gone_owner}-nomarker" / "keep").is_dir()
    finally:
        import shutil

        shutil.rmtree(live)


def test_classes_from_and_inspect_classes_of_a_dataset_url(s3, s3_config, remote, tmp_path):
    """The class list of a dataset on the object store (its URL, or its manifest.json's): only
    its manifest is read; a folder packed with it gets its labels."""
    from recordtool.format.manifest import classes_of
    from recordtool.inspect import summarize
    from recordtool.pack import pack

    url, _ = remote
    ref = classes_of(url, storage_options=s3.options)
    assert ref.names == ("c0", "c1", "c2") and ref.origin == url
    assert classes_of(url + "/manifest.json").names == ref.names  # fsspec's configuration (s3_config)
    assert s3.proxy.count("GET", "/index.rtx") == 0 and s3.proxy.count("GET", "/part-") == 0
    val = tmp_path / "val"
    for i in range(3):
        write(str(val / "c2" / f"{i}.jpg"), jpeg_bytes(40, 32, seed=i))
    s = pack(str(val), str(tmp_path / "out"), classes_from=url, progress=False)
    ds = recordtool.open(str(tmp_path / "out"))
    assert ds.classes == ["c0", "c1", "c2"] and {ds[i][1] for i in range(len(ds))} == {2}
    assert s.missing_classes == [(0, "c0"), (1, "c1")]
    c = summarize(str(tmp_path / "out"), classes_of=url)["classes_of"]
    assert c["same"] and c["reference"] == url


# ------------------------------------------------------------------ stores that never answer

class _Quiet:
    """A TCP server on 127.0.0.1 that accepts connections and answers nothing, or (drip) an
    HTTP answer one byte every tenth of a second: no socket read ever waits long enough for a
    client's read timeout, and no answer ever completes."""

    def __init__(self, drip: bool):
        self.drip, self.stop, self.conns = drip, threading.Event(), []
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.sock.getsockname()[1]

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"{" * 100000
        for k in range(len(answer) if self.drip else 0):
            if self.stop.wait(0.1):
                return
            try:
                conn.sendall(answer[k:k + 1])
            except OSError:
                return

    def close(self):
        self.stop.set()
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.mark.parametrize("kind", ["silent", "drip"])
def test_a_store_that_never_answers_fails_within_the_deadline(tmp_path, kind):
    """A store that accepts connections and never answers, or drips its answer: each request
    is cancelled after `deadline` seconds and retried as a timeout, so opening fails with a
    RemoteError saying so (before: the client's read timeout times its and its library's
    retries, half an hour with s3fs's defaults; a drip never timed out). Bounded: a thread
    still in recordtool.open after 120 s fails the test."""
    server = _Quiet(drip=kind == "drip")
    options = {"endpoint_url": server.url, "key": "testing", "secret": "testing"}
    got = []

    def run():
        try:
            recordtool.open("s3://quiet/train", cache_dir=str(tmp_path / "cache"), storage_options=options,
                            retry=FAST, deadline=1.0)
        except Exception as e:  # noqa: BLE001 — checked by the test's thread
            got.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    server.close()
    assert not t.is_alive(), "recordtool.open still waits on a store that does not answer"
    assert isinstance(got[0], RemoteError) and "failed 3 times" in str(got[0]), got
    assert "timed out: no complete answer within 1 s" in str(got[0]), got


def test_deadline_is_checked_once_and_reaches_the_client(s3, remote, tmp_path):
    """RemoteOptions.deadline (and recordtool.open's) is a number of seconds in 0.01..86400,
    60 by default; a Loader hands it to the store's client."""
    from recordtool.errors import ConfigError
    from recordtool.loader import Loader, RemoteOptions

    url, _ = remote
    for bad in (0, -1, float("nan"), float("inf"), "60", True, 10**6):
        with pytest.raises(ConfigError, match="deadline"):
            RemoteOptions(deadline=bad)
        with pytest.raises(ConfigError, match="deadline"):
            recordtool.open(url, storage_options=s3.options, deadline=bad)
    assert RemoteOptions().deadline == 60.0 and RemoteOptions(deadline=7).deadline == 7.0
    ld = Loader(url, batch_size=4, as_torch=False, cache_dir=str(tmp_path / "cache"), storage_options=s3.options,
                deadline=7)
    assert ld.ds.fs.deadline == 7.0 and pickle.loads(pickle.dumps(ld.ds)).fs.deadline == 7.0
    ld.close()


# ------------------------------------------------------------------ a dataset re-packed at its URL

def test_unpickled_dataset_refuses_another_dataset_at_its_url(s3, remote, tmp_path):
    """A pickled remote dataset carries its manifest's fingerprint: unpickled after the URL was
    re-packed (other images, labels, shards), it raises DatasetChanged naming the URL instead
    of reading other records under the same indices."""
    from recordtool.errors import DatasetChanged
    from recordtool.pack import pack

    url, fs = remote
    ds = open_remote(s3, url, tmp_path)
    blob = pickle.dumps(ds)
    same = pickle.loads(blob)
    assert same.fingerprint == ds.fingerprint and bytes(same[3][0]) == bytes(ds[3][0])
    same.close()
    for i in range(10):
        write(str(tmp_path / "src" / f"k{i % 3}" / f"{i}.jpg"), jpeg_bytes(44, 36, seed=1000 + i))
    pack(str(tmp_path / "src"), str(tmp_path / "other"), shards=3, progress=False)
    for name in sorted(os.listdir(tmp_path / "other")):
        fs.put_file(str(tmp_path / "other" / name), f"{url[len('s3://'):]}/{name}")
    with pytest.raises(DatasetChanged, match=f"{url}: holds another dataset than the one pickled"):
        pickle.loads(blob)
    ds.close()


# ------------------------------------------------------------------ what asking again would only repeat

@pytest.mark.parametrize("endpoint", ["not a url", "http://[::1", "http://127.0.0.1:99999", "ftp://127.0.0.1/",
                                      "http://" + "a" * 5000 + ":9000", "http://" + "b" * 64 + ".example:9000"])
def test_malformed_endpoint_is_a_config_error_at_once(s3, remote, tmp_path, endpoint):
    """An endpoint_url that is not one (no scheme, a broken IPv6 literal, a port out of range,
    another scheme, a 5,000-character host, a label over 63 bytes) is a ConfigError naming it
    before any request (before: a raw ValueError / UnicodeError, or five tries of a request
    that could not be sent)."""
    from recordtool.errors import ConfigError

    url, _ = remote
    with pytest.raises(ConfigError, match="endpoint_url .* is not an endpoint URL") as e:
        open_remote(s3, url, tmp_path, storage_options=dict(s3.options, endpoint_url=endpoint))
    assert len(str(e.value)) < 400


def test_bucket_name_the_client_cannot_send_is_a_config_error_at_once(s3, tmp_path):
    """s3://<5,000 characters>/x: botocore refuses the bucket name before sending anything, the
    same way each time — a ConfigError at once, not five tries and a RemoteError."""
    from recordtool.errors import ConfigError

    with pytest.raises(ConfigError, match="refuses to send this request"):
        recordtool.open("s3://" + "a" * 5000 + "/x", cache_dir=str(tmp_path / "cache"), storage_options=s3.options,
                        retry=Retry(attempts=5, backoff=30))


def test_refused_credentials_are_access_denied_at_once(s3, remote, tmp_path):
    """A store that refuses the key (403 InvalidAccessKeyId), and anonymous access to a private
    bucket: AccessDenied (a RemoteError and a PermissionError) naming the object, asked once —
    before, a raw PermissionError."""
    from recordtool.errors import AccessDenied, RecordtoolError

    url, _ = remote
    s3.proxy.add(Fault("manifest.json", "403", times=100, code="InvalidAccessKeyId"))
    with pytest.raises(AccessDenied, match=f"{url}/manifest.json: access denied by the store") as e:
        open_remote(s3, url, tmp_path, retry=Retry(attempts=5, backoff=30))
    assert isinstance(e.value, RemoteError) and isinstance(e.value, PermissionError)
    assert s3.proxy.count("GET", "manifest.json") == 1
    s3.proxy.clear()
    anonymous = {k: v for k, v in s3.options.items() if k not in ("key", "secret")}
    with pytest.raises(AccessDenied, match="anon=True reaches public buckets only") as e:
        open_remote(s3, url, tmp_path, storage_options=dict(anonymous, anon=True), retry=Retry(attempts=5, backoff=30))
    assert isinstance(e.value, RecordtoolError)


def test_missing_credentials_are_access_denied_at_once(s3, remote, tmp_path, monkeypatch):
    """No credentials anywhere (options, environment, files, instance metadata): AccessDenied
    saying where they come from, at once — before, five tries (8 s) and a RemoteError."""
    from recordtool.errors import AccessDenied

    url, _ = remote
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "FSSPEC_S3_KEY", "FSSPEC_S3_SECRET"):
        monkeypatch.delenv(var, raising=False)
    for var in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(var, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = {k: v for k, v in s3.options.items() if k not in ("key", "secret")}
    with pytest.raises(AccessDenied, match="no credentials to sign the request with"):
        open_remote(s3, url, tmp_path, storage_options=options, retry=Retry(attempts=5, backoff=30))
    assert s3.proxy.count("GET", "manifest.json") == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="gives a folder to another user")
def test_cache_dir_of_another_user_is_a_config_error(s3, remote, tmp_path):
    """A cache_dir owned by another user (uid 12345): a ConfigError naming it and the owner,
    before anything is written there (that user could move or replace the cache's files)."""
    from recordtool.errors import ConfigError

    url, _ = remote
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    with pytest.raises(ConfigError, match=rf"cache_dir '{theirs}': owned by uid 12345, not by this user"):
        recordtool.open(url, cache_dir=str(theirs), storage_options=s3.options, retry=FAST)
    assert os.listdir(theirs) == []
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="cannot be used as the cache folder"):
        recordtool.open(url, cache_dir=str(tmp_path / "a-file"), storage_options=s3.options, retry=FAST)


def test_a_remote_dataset_is_a_dataset_with_other_shard_files():
    """RemoteDataset changes what serves the shards (its CachedShards), not Dataset's internals:
    it defines no private method Dataset has, and both read through the same public methods."""
    from recordtool.reader import Dataset, LocalShards, ShardFiles
    from recordtool.remote import CachedShards, RemoteDataset

    own = {k for k, v in vars(RemoteDataset).items() if k.startswith("_") and not k.startswith("__") and callable(v)}
    assert not own & set(dir(Dataset)), own & set(dir(Dataset))
    for component in (LocalShards, CachedShards):
        assert all(callable(getattr(component, m)) for m in ("slice", "prefetch", "close")), component
        assert set(ShardFiles.__annotations__) == {"lock"}


def test_the_shard_cache_has_its_folder_and_budget_rather_than_inheriting_them(s3, remote, tmp_path):
    """ShardCache is composed of a CacheFolder (the folder, its locks) and a CacheBudget (the
    bytes it may hold), each a class of its own; the cache's lock is the folder's."""
    from recordtool.io.cache import ShardCache
    from recordtool.io.cachebudget import CacheBudget
    from recordtool.io.cachefolder import CacheFolder

    assert ShardCache.__mro__ == (ShardCache, object) and CacheBudget.__mro__ == (CacheBudget, object)
    ds = open_remote(s3, remote[0], tmp_path)
    cache = ds.cache
    assert isinstance(cache.folder, CacheFolder) and isinstance(cache.budget, CacheBudget)
    assert cache.budget.folder is cache.folder and cache.limit == cache.budget.limit == ds.cache_limit
    assert cache.dir == cache.folder.dir and cache.used() == cache.budget.used() == 0
    bytes(ds[0][0])
    assert 0 < cache.used() <= cache.limit
    ds.close()
