"""Long fuzz run: mutated JPEGs, OFRecord parts, TFRecords, index files and manifests; a
hostile shard cache folder; a remote dataset behind a misbehaving S3 server.

Every input must be accepted or refused with one of recordtool's named errors — never a crash
(signal), another exception type, or a slow input — and a JPEG the header reader accepts must
be one libjpeg-turbo does not refuse (hostile_data.libjpeg_disagreements). The cache and remote
kinds check more: whatever was done to the cache folder or the store, a record served is the
record's true bytes, and nothing outside the cache folder changes. Inputs are mutations of valid seeds (and
of the hostile seeds in tests/hostile_data.py): byte flips, truncation, inserted garbage,
length-field rewrites. Each chunk runs in a child process with an address-space cap, so a
crash or a memory blow-up is recorded (kind, chunk seed) instead of ending the run.

    python scripts/fuzz_hostile.py --total 1000000 --json fuzz.json

Reproduce a finding: `--only KIND --chunk-seed S --chunk 1` re-runs the chunk that failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import stat
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

# share of the total per kind (the cache and remote kinds are slow per input: run them with --only)
KINDS = {"jpeg": 0.4, "ofrecord": 0.2, "tfrecord": 0.2, "index": 0.1, "manifest": 0.1, "cache": 0.0, "remote": 0.0}
SLOW_S = 1.0  # one input taking longer than this is a finding


def mutate(rng, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 6))
        if not b:
            b = bytearray(rng.bytes(int(rng.integers(1, 64))))
        if kind == 0:  # flip bytes
            for p in rng.integers(0, len(b), int(rng.integers(1, 8))):
                b[p] ^= int(rng.integers(1, 256))
        elif kind == 1:  # truncate
            b = b[:int(rng.integers(0, len(b)))]
        elif kind == 2:  # insert garbage
            p = int(rng.integers(0, len(b) + 1))
            b[p:p] = rng.bytes(int(rng.integers(1, 64)))
        elif kind == 3:  # 0xFF / 0x00 runs (markers, lengths)
            p = int(rng.integers(0, len(b)))
            b[p:p + int(rng.integers(1, 5))] = bytes([0xFF if rng.integers(0, 2) else 0]) * int(rng.integers(1, 5))
        elif kind == 4:  # rewrite a 2/4/8-byte field with an extreme value
            w = int(rng.choice([2, 4, 8]))
            p = int(rng.integers(0, max(1, len(b) - w)))
            vals = [0, 1, 2**(8 * w - 1) - 1, 2**(8 * w) - 1, int(rng.integers(0, 2**16))]
            v = vals[int(rng.integers(0, len(vals)))]
            b[p:p + w] = v.to_bytes(w, "little" if rng.integers(0, 2) else "big")
        else:  # duplicate a slice (repeated markers, scans, records)
            a = int(rng.integers(0, len(b)))
            e = min(len(b), a + int(rng.integers(1, 200)))
            b[a:a] = b[a:e] * int(rng.integers(1, 5))
    return bytes(b)


# ------------------------------------------------------------------ seeds and per-kind checks

def jpeg_seeds():
    import hostile_data as hd
    from conftest import jpeg_bytes

    return [jpeg_bytes(96, 72, seed=1, subsampling=2), jpeg_bytes(64, 80, seed=2, subsampling=0, progressive=True),
            jpeg_bytes(50, 40, seed=3, mode="L"), jpeg_bytes(72, 40, seed=4, subsampling=1, progressive=True),
            jpeg_bytes(40, 40, seed=5, mode="CMYK"), hd.bomb_progressive(), hd.many_scans(150, 64, 64),
            hd.corrupt_entropy(3), hd.two_frames(), hd.duplicate_component_id(in_scan=True),
            hd.sampling(((4, 2), (1, 1), (1, 1))), hd.tiny_baseline_declaring(1400, 1400)]


def run_jpeg(rng, n, stats):
    import numpy as np

    import hostile_data as hd

    from recordtool.decode import decode_crop_resize, native_available
    from recordtool.format.jpeg import BadJPEG, NotJPEG, probe

    assert native_available(), "fuzzing the native decoder needs it built"
    seeds = jpeg_seeds()
    batch = 64
    done = 0
    while done < n:
        k = min(batch, n - done)
        inputs = [mutate(rng, seeds[int(rng.integers(0, len(seeds)))]) for _ in range(k)]
        win = np.zeros((k, 4))
        for j, d in enumerate(inputs):
            w = h = 64.0
            try:
                info = probe(d)
                w, h = float(info.width), float(info.height)
                stats["accepted"] += 1
            except (NotJPEG, BadJPEG):
                stats["refused"] += 1
            # a window inside the declared image (mostly): the decode path, not the bounds check
            ww, wh = w * rng.uniform(0.05, 1.0), h * rng.uniform(0.05, 1.0)
            win[j] = (rng.uniform(0, h - wh + 1e-9), rng.uniform(0, w - ww + 1e-9), wh, ww)
        errors = []
        t = time.perf_counter()
        decode_crop_resize(inputs, win, size=(32, 32), threads=1, on_error="skip", errors=errors)
        slow = time.perf_counter() - t
        if slow > SLOW_S * k / 8:
            stats["slow"].append(f"jpeg batch of {k}: {slow:.2f} s")
        stats["decode_failures"] += len(errors)
        # what the header reader and the decodable rule accept, libjpeg must not refuse
        for data, why in hd.libjpeg_disagreements(inputs):
            stats["errors"].append(f"header reader accepts what libjpeg refuses ({why}): {data[:700].hex()}")
        done += k
    return done


def ofrecord_seed():
    import hostile_data as hd
    from conftest import jpeg_bytes

    return hd.ofrecord_part([(jpeg_bytes(40, 30, seed=i), i) for i in range(3)])


def run_ofrecord(rng, n, stats, tmp):
    from recordtool.errors import RecordtoolError
    from recordtool.format.ofrecord import decode_ofrecord, iter_records
    from recordtool.format.scan import index_parts, record_fields

    seed = ofrecord_seed()
    root = os.path.join(tmp, "parts")
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        d = mutate(rng, seed)
        try:
            for rec in iter_records(d, "fuzz"):
                try:
                    decode_ofrecord(d, rec.data_offset, rec.data_offset + rec.length)
                    record_fields(d, rec, "encoded", "class/label", 1000)
                except (RecordtoolError, ValueError, UnicodeDecodeError):
                    stats["refused"] += 1
            stats["accepted"] += 1
        except RecordtoolError:
            stats["refused"] += 1
        if i % 50 == 0:  # the whole `recordtool index` path on some of them (files on disk)
            for name in os.listdir(root):
                os.unlink(os.path.join(root, name))
            with open(os.path.join(root, "part-00000"), "wb") as f:
                f.write(d)
            try:
                index_parts(root, progress=False)
            except RecordtoolError:
                pass
    return n


def tfrecord_seed():
    import hostile_data as hd
    from conftest import jpeg_bytes

    return hd.tfrecord([hd.example(jpeg_bytes(40, 30, seed=i), i) for i in range(3)])


def run_tfrecord(rng, n, stats, tmp):
    import gzip

    from recordtool.errors import OnError, RecordtoolError
    from recordtool.errors import Rejected
    from recordtool.sources.tfrecord import ScanResult, TFRecordSource, scan_buffer

    seed = tfrecord_seed()
    gz = gzip.compress(seed)
    path = os.path.join(tmp, "f.tfrecord")
    keys = {"image": "image", "label": "label", "label_offset": 0}
    for i in range(n):
        if i % 20 == 0:  # the whole source (inflate, scan, load) on a mutated GZIP file
            with open(path, "wb") as f:
                f.write(mutate(rng, gz))
            try:
                src = TFRecordSource([path], keys, tmpdir=tmp)
                for it in src.items:
                    try:
                        src.load(it)
                    except Rejected:
                        pass
                src.close()
                stats["accepted"] += 1
            except RecordtoolError:
                stats["refused"] += 1
            continue
        d = mutate(rng, seed)
        res = ScanResult()
        scan_buffer(d, "fuzz", 0, OnError.SKIP, res)
        stats["accepted" if not res.problems else "refused"] += 1
    left = [n for n in os.listdir(tmp) if n.startswith("recordtool-tfrecord-")]
    if left:
        stats["errors"].append(f"scratch folders left: {left}")
    return n


def index_seed(tmp):
    from recordtool.pack import pack
    from conftest import jpeg_bytes, write

    src = os.path.join(tmp, "src")
    for i in range(6):
        write(os.path.join(src, f"c{i % 2}", f"{i}.jpg"), jpeg_bytes(40 + i, 32, seed=i))
    out = os.path.join(tmp, "ds")
    pack(src, out, shards=2, progress=False)
    return out


def run_index(rng, n, stats, tmp):
    from recordtool.errors import RecordtoolError
    from recordtool.format import index as ix
    from recordtool.format import manifest as mf
    from recordtool.reader import check_rows

    ds = index_seed(tmp)
    seed = open(os.path.join(ds, "index.rtx"), "rb").read()
    shards = mf.load(ds)["shards"]
    path = os.path.join(tmp, "fuzz.rtx")
    for _ in range(n):
        if os.path.exists(path):
            os.unlink(path)  # truncating a file still mapped by the last round is slow
        with open(path, "wb") as f:
            f.write(mutate(rng, seed))
        try:
            idx = ix.read_index(path)
            check_rows(idx, shards, path, 2)
            stats["accepted"] += 1
        except RecordtoolError:
            stats["refused"] += 1
    return n


def run_manifest(rng, n, stats, tmp):
    from recordtool.errors import RecordtoolError
    from recordtool.format import manifest as mf
    from recordtool.reader import Dataset

    ds = index_seed(tmp)
    seed = open(os.path.join(ds, "manifest.json"), "rb").read()
    obj = json.loads(seed)
    for i in range(n):
        if i % 2:  # structural: a key replaced by a value of another JSON type
            m = json.loads(seed)
            keys = list(m)
            k = keys[int(rng.integers(0, len(keys)))]
            choices = [None, 7, -1, "x", "../../etc/passwd", [], {}, [1, "a"], {"name": "/abs"}, 2**70, 1.5, True]
            target = m
            if isinstance(m[k], (dict, list)) and m[k] and rng.integers(0, 2):
                target = m[k] if isinstance(m[k], dict) else m[k][0] if isinstance(m[k][0], dict) else m
                if isinstance(target, dict) and target:
                    k = list(target)[int(rng.integers(0, len(target)))]
            target[k] = choices[int(rng.integers(0, len(choices)))]
            data = json.dumps(m).encode()
        else:
            data = mutate(rng, seed)
        os.unlink(os.path.join(ds, "manifest.json"))
        with open(os.path.join(ds, "manifest.json"), "wb") as f:
            f.write(data)
        try:
            mf.load(ds)
            Dataset(ds).close()
            stats["accepted"] += 1
        except RecordtoolError:
            stats["refused"] += 1
    del obj
    return n


def _served(ds) -> list:
    return [(bytes(ds[i][0]), ds[i][1]) for i in range(len(ds))]


def _tree(root: str) -> dict:
    """Every file under root with its bytes (links as their target), to show nothing changed."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(d, n)
            out[p] = ("link", os.readlink(p)) if os.path.islink(p) else open(p, "rb").read() if os.path.isfile(p) \
                else "dir"
    return out


def _keep_crc(data: bytearray, at: int, want: int) -> None:
    """Set data[at:at+4] so that the CRC32C of `data` is `want` (a CRC is affine in the bits:
    32 free bits reach any value), as anyone who can write a file can."""
    import crc32c

    data[at:at + 4] = bytes(4)
    base = crc32c.crc32c(bytes(data))
    pivots = {}
    for bit in range(32):
        d = bytearray(data)
        d[at + bit // 8] ^= 1 << (bit % 8)
        v, m = crc32c.crc32c(bytes(d)) ^ base, 1 << bit
        while v:
            h = v.bit_length() - 1
            if h not in pivots:
                pivots[h] = (v, m)
                break
            v, m = v ^ pivots[h][0], m ^ pivots[h][1]
    x, t = 0, want ^ base
    while t:
        v, m = pivots[t.bit_length() - 1]
        t, x = t ^ v, x ^ m
    data[at:at + 4] = x.to_bytes(4, "little")


def _hostile_cache(rng, cache_dir: str, victim: str) -> str:
    """One random act against a cache folder (see run_cache); what it did."""
    entries = []
    for d, dirs, names in os.walk(cache_dir):
        entries += [os.path.join(d, n) for n in dirs + names]
    if not entries:
        return "nothing cached"
    p = entries[int(rng.integers(0, len(entries)))]
    act = int(rng.integers(0, 12))
    plain = os.path.isfile(p) and not os.path.islink(p) and os.stat(p).st_nlink == 1  # (never the user's, linked)
    if plain and act <= 3:
        data = open(p, "rb").read()
        if act == 0:  # in place, size kept (cache poisoning)
            m = mutate(rng, data)
            m = (m + bytes(len(data)))[:len(data)]
        elif act == 1:  # truncated or extended
            m = mutate(rng, data)
        elif act == 2:  # another cached file's bytes, cut to this one's size
            other = [e for e in entries if os.path.isfile(e) and not os.path.islink(e) and not stat.S_ISFIFO(os.stat(e).st_mode)]
            o = open(other[int(rng.integers(0, len(other)))], "rb").read()
            m = (o + bytes(len(data)))[:len(data)]
        else:  # replaced by a new inode of the same size and mtime
            st = os.stat(p)
            tmp = p + ".new"
            with open(tmp, "wb") as f:
                f.write(bytes(reversed(data)))
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, p)
            return f"replaced {p}"
        with open(p, "r+b") as f:
            f.write(m)
            f.truncate(len(m))
        return f"rewrote {p} (act {act})"
    if act in (4, 5):  # a link to the user's folder or file in its place
        target = victim if act == 4 else os.path.join(victim, "precious")
        if os.path.isdir(p) and not os.path.islink(p):
            import shutil

            shutil.rmtree(p)
        else:
            os.unlink(p)
        os.symlink(target, p)
        return f"linked {p} -> {target}"
    if act == 6:  # a FIFO in its place
        if os.path.isfile(p) or os.path.islink(p):
            os.unlink(p)
            os.mkfifo(p)
            return f"fifo {p}"
        return "no-op"
    if act == 7:  # a hard link to the user's file, named like a cached file
        d = p if os.path.isdir(p) and not os.path.islink(p) else os.path.dirname(p)
        os.link(os.path.join(victim, "precious"), os.path.join(d, f"zz{int(rng.integers(0, 1 << 30))}.0badc0de"))
        return f"hard link in {d}"
    if act == 8 and plain and os.path.getsize(p) >= 16:  # bytes changed, size and CRC32C kept
        import crc32c

        data = bytearray(open(p, "rb").read())
        want = crc32c.crc32c(bytes(data))
        m = bytearray((mutate(rng, bytes(data)) + bytes(len(data)))[:len(data)])
        _keep_crc(m, int(rng.integers(0, len(m) - 3)), want)
        with open(p, "r+b") as f:
            f.write(m)
        return f"rewrote {p}, CRC32C kept"
    is_lock = os.path.basename(os.path.dirname(p)) == "locks" or os.path.basename(p) == ".lock"
    if act in (9, 10) and is_lock and os.path.isfile(p) and not os.path.islink(p):
        os.unlink(p)
        if act == 9:  # a hard link to the user's file where a lock file goes
            os.link(os.path.join(victim, "precious"), p)
            return f"hard link at {p}"
        os.mkdir(p)  # a directory where a lock file goes
        return f"directory at {p}"
    if os.path.isfile(p) and not os.path.islink(p):  # deleted (a lock file, a shard, the index)
        os.unlink(p)
        return f"deleted {p}"
    return "no-op"


def run_cache(rng, n, stats, tmp):
    """A memory:// dataset read through a cache folder that is attacked between opens: each
    input does 1–3 random acts (bytes changed in place — also with the CRC32C kept —, truncated,
    swapped, replaced; a link to the user's folder or file, a FIFO, a hard link planted; a hard
    link to the user's file or a directory where a lock file goes; files deleted), then opens the
    dataset with a small cache_limit and reads every record. Each record served must be its
    true bytes; nothing in the user's folder may change; errors must be RecordtoolErrors."""
    import shutil
    import warnings

    import fsspec

    import recordtool
    from recordtool.errors import RecordtoolError, UnsafePath
    from recordtool.io import Retry

    local_root = index_seed(tmp)
    local = recordtool.open(local_root)
    want = _served(local)
    mem = fsspec.filesystem("memory")
    mem.put(local_root, "/fuzz-cache/ds", recursive=True)
    url = "memory://fuzz-cache/ds"
    victim = os.path.join(tmp, "user")
    os.makedirs(victim)
    with open(os.path.join(victim, "precious"), "wb") as f:
        f.write(b"the user's data")
    snapshot = _tree(victim)
    limit = sum(sorted((s["bytes"] for s in local.shards), reverse=True)[:2])
    cache_dir = os.path.join(tmp, "cache")
    fast = Retry(attempts=2, backoff=0.001, max_backoff=0.001)
    for i in range(n):
        if i % 50 == 0 and os.path.exists(cache_dir):
            shutil.rmtree(cache_dir)  # start clean now and then: attacks on a fresh folder too
        acts = []
        if os.path.exists(cache_dir):
            for _ in range(int(rng.integers(1, 4))):
                acts.append(_hostile_cache(rng, cache_dir, victim))
        t = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # bad copies dropped: warned, and expected here
                ds = recordtool.open(url, cache_dir=cache_dir, cache_limit=limit, retry=fast)
                try:
                    got = _served(ds)
                finally:
                    ds.close()
            if got != want:
                stats["errors"].append(f"served other bytes after {acts}")
            stats["accepted"] += 1
        except UnsafePath:  # a planted link or FIFO stays refused until removed: the user starts clean
            stats["refused"] += 1
            shutil.rmtree(cache_dir)
        except RecordtoolError:
            stats["refused"] += 1
        if time.time() - t > 5 * SLOW_S:
            stats["slow"].append(f"{time.time() - t:.1f} s after {acts}")
        if _tree(victim) != snapshot:
            stats["errors"].append(f"the user's folder changed after {acts}")
            return n
    return n


def run_remote(rng, n, stats, tmp):
    """A dataset on a local S3 server (moto) behind the fault proxy of tests/s3server.py: each
    input adds 0–3 faults on random objects (503 answers, short stalls against a short read
    timeout, truncated, altered and padded bodies) and, every 4th, damages an object on the
    store itself (bytes changed, cut, extended); then opens the dataset (fresh cache folder
    every 10th input) and reads every record. Served records must be their true bytes (unless
    the manifest itself was damaged: then only named errors count); errors must be RecordtoolErrors."""
    import shutil
    import warnings

    import s3fs
    from s3server import S3, Fault

    import recordtool
    from recordtool.errors import RecordtoolError
    from recordtool.io import Retry

    local_root = index_seed(tmp)
    local = recordtool.open(local_root)
    want = _served(local)
    server = S3()
    try:
        s3fs.S3FileSystem.retries = 1
        opts = dict(server.options, config_kwargs=dict(server.options["config_kwargs"], read_timeout=0.5))
        fs = s3fs.S3FileSystem(**server.options)
        fs.mkdir("fuzz")
        names = sorted(os.listdir(local_root))
        originals = {n: open(os.path.join(local_root, n), "rb").read() for n in names}

        def upload():
            for name in names:
                fs.pipe_file(f"fuzz/ds/{name}", originals[name])

        upload()
        cache_dir = os.path.join(tmp, "cache")
        fast = Retry(attempts=2, backoff=0.001, max_backoff=0.001)
        kinds = ["503", "stall", "truncate", "flip", "pad"]
        for i in range(n):
            server.proxy.clear()
            if i % 10 == 0 and os.path.exists(cache_dir):
                shutil.rmtree(cache_dir)
            faults = []
            for _ in range(int(rng.integers(0, 4))):
                key = names[int(rng.integers(0, len(names)))]
                kind = kinds[int(rng.integers(0, len(kinds)))]
                size = len(originals[key])
                faults.append(Fault(key, kind, times=int(rng.integers(1, 4)), seconds=0.8,
                                    keep=int(rng.integers(0, max(1, size))) if kind == "truncate" else
                                    int(rng.integers(1, 4 << 20)), offset=int(rng.integers(0, max(1, size)))))
            server.proxy.add(*faults)
            damaged = None
            if i % 4 == 3:
                damaged = names[int(rng.integers(0, len(names)))]
                fs.pipe_file(f"fuzz/ds/{damaged}", mutate(rng, originals[damaged]))
            t = time.time()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ds = recordtool.open("s3://fuzz/ds", cache_dir=cache_dir, storage_options=opts, retry=fast)
                    try:
                        got = _served(ds)
                    finally:
                        ds.close()
                if got != want and damaged != "manifest.json":
                    stats["errors"].append(f"served other bytes with faults {faults}, damaged {damaged}")
                stats["accepted"] += 1
            except RecordtoolError:
                stats["refused"] += 1
            if time.time() - t > 30:
                stats["slow"].append(f"{time.time() - t:.1f} s with faults {faults}, damaged {damaged}")
            if damaged is not None:
                server.proxy.clear()
                upload()
    finally:
        server.stop()
    return n


RUNNERS = {"jpeg": lambda rng, n, s, t: run_jpeg(rng, n, s), "ofrecord": run_ofrecord, "tfrecord": run_tfrecord,
           "index": run_index, "manifest": run_manifest, "cache": run_cache, "remote": run_remote}


def child(kind: str, seed: int, n: int, mem_mb: int) -> None:
    """One chunk in this (child) process; prints its stats as JSON on the last line."""
    import numpy as np

    resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    stats = {"accepted": 0, "refused": 0, "decode_failures": 0, "errors": [], "slow": []}
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="rt-fuzz-") as tmp:
        try:
            RUNNERS[kind](rng, n, stats, tmp)
        except Exception:  # anything but our named errors escaping: a finding
            stats["errors"].append(traceback.format_exc(limit=6))
    print(json.dumps(stats))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", type=int, default=1_000_000, help="inputs in all, shared by KINDS")
    ap.add_argument("--chunk", type=int, default=20_000, help="inputs per child process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mem-mb", type=int, default=2048, help="address-space cap of each child")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per chunk before it counts as a hang")
    ap.add_argument("--only", choices=sorted(KINDS), default=None)
    ap.add_argument("--chunk-seed", type=int, default=None, help="run one chunk with this seed (reproduce)")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--seconds", type=float, default=None, help="stop starting chunks after this long")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), int(a.child[2]), int(a.child[3]))
        return
    kinds = {a.only: 1.0} if a.only else KINDS
    t0 = time.time()
    summary = {"total": 0, "kinds": {}, "findings": [], "seed": a.seed}
    chunk_no = 0
    for kind, share in kinds.items():
        want = a.total if a.only else int(a.total * share)
        if not want:
            continue
        agg = {"inputs": 0, "accepted": 0, "refused": 0, "decode_failures": 0, "seconds": 0.0}
        while agg["inputs"] < want:
            n = min(a.chunk, want - agg["inputs"])
            seed = a.chunk_seed if a.chunk_seed is not None else a.seed * 1_000_003 + chunk_no
            chunk_no += 1
            t = time.time()
            try:
                p = subprocess.run([sys.executable, __file__, "--child", kind, str(seed), str(n), str(a.mem_mb)],
                                   capture_output=True, text=True, timeout=a.timeout)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired:
                rc, out, err = "timeout", "", ""
            agg["seconds"] += time.time() - t
            agg["inputs"] += n
            if rc != 0:
                summary["findings"].append({"kind": kind, "chunk_seed": seed, "exit": rc, "stderr": err[-2000:]})
                continue
            stats = json.loads(out.strip().splitlines()[-1])
            for k in ("accepted", "refused", "decode_failures"):
                agg[k] += stats[k]
            for e in stats["errors"] + stats["slow"]:
                summary["findings"].append({"kind": kind, "chunk_seed": seed, "error": e})
            print(f"{kind}: {agg['inputs']}/{want} inputs, {len(summary['findings'])} findings, "
                  f"{time.time() - t0:.0f} s", flush=True)
            if a.chunk_seed is not None or (a.seconds is not None and time.time() - t0 > a.seconds):
                break
        summary["kinds"][kind] = agg
        summary["total"] += agg["inputs"]
    summary["seconds"] = round(time.time() - t0, 1)
    summary["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
    try:
        summary["commit"] = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    except OSError:
        pass
    print(json.dumps({k: v for k, v in summary.items() if k != "findings"}, indent=1))
    print(f"findings: {len(summary['findings'])}")
    for f in summary["findings"][:20]:
        print(json.dumps(f)[:1500])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    sys.exit(1 if summary["findings"] else 0)


if __name__ == "__main__":
    main()
