#!/usr/bin/env python3
"""Benchmark the format layer on one machine, in one run, against plain-file baselines.

  bench_format.py SRC PACKED [--json FILE]

- pack SRC (warm page cache) vs `cp -r SRC` of the same folder: best of 3 each
- index open at 1.28M records (synthetic index + manifest of 1024 shards)
- random-access reads through recordtool.open vs open()+read() of the source files in the
  same random order (what an ImageFolder loader does), and, for scale, Pillow decode +
  RandomResizedCrop(224) on one thread: the reader must never be what a decoder waits on.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import crc32c
import numpy as np

sys.path.append(os.path.join(os.path.dirname(__file__), ".."))  # an installed recordtool first
import recordtool  # noqa: E402
from recordtool.format import index as ix  # noqa: E402
from recordtool.format import manifest as mf  # noqa: E402
from recordtool.pack import pack  # noqa: E402


def best(fn, repeat=3):
    from recordtool.tools.bench import best_of

    return best_of(fn, repeat)


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def bench_pack(src, tmp):
    subprocess.run(["cp", "-r", src, os.path.join(tmp, "warm")], check=True)  # warm the page cache
    shutil.rmtree(os.path.join(tmp, "warm"))

    def cp():
        dst = os.path.join(tmp, "cp")
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["cp", "-r", src, dst], check=True)

    def pk():
        pack(src, os.path.join(tmp, "pk"), shards=8, overwrite=True, progress=False)

    t_cp, t_pack = [], []
    for _ in range(3):  # interleaved so both see the same machine state
        t_cp.append(best(cp, 1))
        t_pack.append(best(pk, 1))
    shutil.rmtree(os.path.join(tmp, "cp"), ignore_errors=True)
    shutil.rmtree(os.path.join(tmp, "pk"), ignore_errors=True)
    return min(t_cp), min(t_pack)


def bench_index_open(tmp, n=1_281_167, shards=1024):
    root = os.path.join(tmp, "big")
    os.makedirs(root)
    rng = np.random.default_rng(0)
    cols = {k: np.zeros(n, dtype=dt) for k, dt in ix.COLUMNS.items()}
    cols["jpeg_length"][:] = rng.integers(2_000, 500_000, n)
    cols["label"][:] = rng.integers(0, 1000, n)
    cols["width"][:] = 500
    cols["height"][:] = 375
    cols["chroma"][:], cols["colorspace"][:], cols["channels"][:] = 2, 3, 3  # baseline YCbCr 4:2:0
    cols["shard"][:] = np.arange(n) * shards // n
    # consistent rows (open() bounds-checks every row against the shard sizes)
    cols["length"][:] = cols["jpeg_length"] + 64
    size = cols["length"].astype(np.int64) + 8
    ends = np.cumsum(size)
    first = np.searchsorted(cols["shard"], np.arange(shards))
    starts = ends - size
    cols["offset"][:] = starts - starts[first][cols["shard"]]
    cols["jpeg_offset"][:] = cols["offset"] + 8 + 32
    shard_bytes = np.bincount(cols["shard"], weights=size, minlength=shards).astype(np.int64)
    cols["size_order"] = ix.size_order(cols["jpeg_length"])
    blob = ix.encode_index(ix.Index(cols))
    with open(os.path.join(root, ix.INDEX_FILE), "wb") as f:
        f.write(blob)
    counts = np.bincount(cols["shard"], minlength=shards)
    # the index's real checksum: open() checks it against the manifest (the shards are not read here)
    manifest = mf.build(records=n, index={"file": ix.INDEX_FILE, "bytes": len(blob),
                                          "crc32c": f"{crc32c.crc32c(blob):08x}"},
                        classes=[f"n{k:08d}" for k in range(1000)],
                        shards=[{"name": f"part-{k:05d}", "records": int(counts[k]), "bytes": int(shard_bytes[k]),
                                 "crc32c": "00000000"} for k in range(shards)],
                        keys={}, source={"kind": "synthetic"}, tool={"name": "bench_format"})
    mf.write(root, manifest)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        ds = recordtool.open(root)
        _ = int(ds.labels[-1]) + int(ds.index.size_order[0])  # touch columns
        times.append(time.perf_counter() - t)
    # a fresh process: what a training script pays, imports excluded
    code = ("import time,recordtool; t=time.perf_counter(); ds=recordtool.open(%r); "
            "print(time.perf_counter()-t)" % root)
    fresh = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout)
    return float(np.median(times)), fresh, os.path.getsize(os.path.join(root, ix.INDEX_FILE))


def bench_reads(src, packed, n_reads=20000):
    ds = recordtool.open(packed)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(ds), n_reads)
    for i in range(len(ds)):  # warm: page cache and mappings
        bytes(ds[i][0])
    t = time.perf_counter()
    nbytes = 0
    for i in idx:
        nbytes += len(bytes(ds[int(i)][0]))
    t_rt = time.perf_counter() - t
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)
    t = time.perf_counter()
    for i in rng.integers(0, len(files), n_reads):
        with open(files[int(i)], "rb") as f:
            f.read()
    t_files = time.perf_counter() - t
    return n_reads / t_rt, nbytes / t_rt, n_reads / t_files


def bench_pil(packed, n=300):
    from PIL import Image

    ds = recordtool.open(packed)
    rng = np.random.default_rng(2)
    t = time.perf_counter()
    for i in rng.integers(0, len(ds), n):
        im = Image.open(io.BytesIO(ds[int(i)][0])).convert("RGB")
        w, h = im.size
        cw, ch = int(w * 0.6), int(h * 0.6)
        im.crop((0, 0, cw, ch)).resize((224, 224), Image.BILINEAR)
    return n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("packed")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(a.packed))) as tmp:
        t_cp, t_pack = bench_pack(a.src, tmp)
        open_warm, open_fresh, idx_bytes = bench_index_open(tmp)
    rps, bps, file_rps = bench_reads(a.src, a.packed)
    pil = bench_pil(a.packed)
    nfiles = sum(len(fs) for _, _, fs in os.walk(a.src))
    commit = os.environ.get("RECORDTOOL_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    r = {
        "machine": f"{platform.node()} {os.cpu_count()} cpu {platform.processor() or platform.machine()}",
        "commit": commit, "files": nfiles, "src_mb": du(a.src) / 1e6,
        "cp_s": t_cp, "pack_s": t_pack, "pack_over_cp": t_pack / t_cp,
        "index_open_1.28M_s": open_warm, "index_open_1.28M_fresh_process_s": open_fresh,
        "index_1.28M_mb": idx_bytes / 1e6,
        "random_read_rec_s": rps, "random_read_mb_s": bps / 1e6, "file_read_rec_s": file_rps,
        "pil_decode_rrc_img_s_1thread": pil,
    }
    rows = [
        ("pack (8 shards)", f"{t_pack:.3f} s", f"{r['src_mb'] / t_pack:.0f} MB/s"),
        ("cp -r (baseline)", f"{t_cp:.3f} s", f"{r['src_mb'] / t_cp:.0f} MB/s"),
        ("pack / cp", f"{t_pack / t_cp:.2f}x", "pack reads, checks and indexes every image; cp only copies"),
        ("index open, 1.28M records", f"{open_warm * 1e3:.2f} ms", f"fresh process {open_fresh * 1e3:.2f} ms"),
        ("random read, recordtool", f"{rps:,.0f} rec/s", f"{bps / 1e6:,.0f} MB/s"),
        ("random read, open()+read() files", f"{file_rps:,.0f} rec/s", f"recordtool: {rps / file_rps:.1f}x this rate"),
        ("PIL decode+crop+resize, 1 thread", f"{pil:,.0f} img/s", "for scale"),
    ]
    print(f"\nbench_format: {nfiles} files, {r['src_mb']:.1f} MB, {r['machine']}, commit {commit}")
    for name, a1, a2 in rows:
        print(f"  {name:<34} {a1:>16}  {a2}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
