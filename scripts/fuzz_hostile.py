"""Long fuzz run: mutated JPEGs, OFRecord parts, TFRecords, index files and manifests.

Every input must be accepted or refused with one of recordtool's named errors — never a crash
(signal), another exception type, or a slow input — and a JPEG the header reader accepts must
be one libjpeg-turbo does not refuse (hostile_data.libjpeg_disagreements). Inputs are mutations of valid seeds (and
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
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

# share of the total per kind
KINDS = {"jpeg": 0.4, "ofrecord": 0.2, "tfrecord": 0.2, "index": 0.1, "manifest": 0.1}
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


RUNNERS = {"jpeg": lambda rng, n, s, t: run_jpeg(rng, n, s), "ofrecord": run_ofrecord, "tfrecord": run_tfrecord,
           "index": run_index, "manifest": run_manifest}


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
            if a.chunk_seed is not None:
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
