#!/usr/bin/env python3
"""Loader throughput from an S3 server on this machine against the same dataset on local disk.

  bench_remote.py PACKED [--epochs 3] [--batch 64] [--threads T] [--limit-blocks 2]

Starts moto's S3 server (`moto_server`, its own process) on 127.0.0.1, uploads PACKED, then
times `recordtool.Loader(device="cpu")` epochs (after epoch 0, local and cached-remote
epochs alternate, which goes first swapping each time, so load from elsewhere hits both alike;
best and median are reported):
- local: Loader(PACKED) — global shuffle, shards mmapped in place;
- remote, cache holds all: Loader("s3://…", cache_limit=dataset) — epoch 0 downloads every shard
  once (while decoding), later epochs read the cache;
- remote, bounded: Loader("s3://…", cache_limit=two blocks) — every epoch fetches each shard
  again; the cache folder's size is sampled every 20 ms and must stay ≤ cache_limit.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
import recordtool  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto():
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shard_bytes(cache_dir: str) -> int:
    total = 0
    for d, _, names in os.walk(cache_dir):
        if os.path.basename(d) == "shards":
            for n in names:
                try:
                    total += os.path.getsize(os.path.join(d, n))
                except FileNotFoundError:
                    pass
    return total


def epoch(loader, e: int) -> tuple:
    """(images per second, CPU seconds of this process per 1000 images) of one epoch."""
    loader.set_epoch(e)
    n = 0
    t, c = time.perf_counter(), time.process_time()
    for x, _ in loader:
        n += x.shape[0]
    return n / (time.perf_counter() - t), 1000 * (time.process_time() - c) / max(n, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("packed")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--limit-blocks", type=int, default=2,
                    help="bounded run: cache_limit in blocks of the largest shards")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import s3fs

    proc, endpoint = start_moto()
    try:
        opts = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("bench")
        t = time.perf_counter()
        for name in sorted(os.listdir(args.packed)):
            fs.put_file(os.path.join(args.packed, name), f"bench/ds/{name}")
        upload_s = time.perf_counter() - t
        import fsspec.config

        fsspec.config.conf["s3"] = opts  # Loader(url) reaches the server as a CLI user's config would
        url = "s3://bench/ds"
        local = recordtool.open(args.packed)
        total = sum(s["bytes"] for s in local.shards)
        largest = sorted((s["bytes"] for s in local.shards), reverse=True)
        kw = dict(batch_size=args.batch, device="cpu", threads=args.threads, seed=0, rank=0, world_size=1,
                  as_torch=False)
        tmp = tempfile.mkdtemp(prefix="recordtool-bench-cache-")
        full = recordtool.Loader(url, cache_dir=os.path.join(tmp, "full"), cache_limit=total, **kw)
        blocks = full.sampler.block_shards
        limit = sum(largest[:args.limit_blocks * blocks])
        bounded = recordtool.Loader(url, cache_dir=os.path.join(tmp, "bounded"), cache_limit=limit, **kw)
        loc = recordtool.Loader(args.packed, **kw)
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], shard_bytes(os.path.join(tmp, "bounded")))
                time.sleep(0.02)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        rows = []

        def record(e, name, ld):
            server = cpu_seconds(proc.pid)
            rate, cpu = epoch(ld, e)
            server = 1000 * (cpu_seconds(proc.pid) - server) / len(local)
            rows.append({"epoch": e, "run": name, "img_s": rate, "cpu_s_per_1k": cpu, "server_cpu_s_per_1k": server})
            print(f"epoch {e}: {name:<15} {rate:7.0f} img/s  {cpu:5.2f} CPU-s per 1000 images "
                  f"(+ {server:4.2f} in the S3 server)", flush=True)

        # epoch 0: the local pages come into the page cache, the remote shards into the cache
        record(0, "local", loc)
        record(0, "remote_first", full)
        record(0, "remote_bounded", bounded)
        # later epochs alternate local and cached-remote first, so load from elsewhere hits both
        for e in range(1, args.epochs):
            pair = [("local", loc), ("remote_cached", full)]
            for name, ld in (pair if e % 2 else pair[::-1]):
                record(e, name, ld)
            record(e, "remote_bounded", bounded)
        stop.set()
        w.join()
        def stats(name):
            v = sorted(r["img_s"] for r in rows if r["run"] == name)
            return {"best": v[-1], "median": v[len(v) // 2], "all": v} if v else None

        out = {"images": len(local), "shards": len(local.shards), "dataset_bytes": total, "upload_s": upload_s,
               "block_shards": blocks, "bounded_cache_limit": limit, "bounded_cache_peak": peak[0],
               "full_cache_bytes": shard_bytes(os.path.join(tmp, "full")), "threads": loc.threads,
               "batch": args.batch, "rows": rows,
               "summary": {k: stats(k) for k in ("local", "remote_first", "remote_cached", "remote_bounded")}}
        sm = out["summary"]
        loc_s = {k: v for k, v in sm["local"].items() if k != "all"}
        if sm["remote_cached"]:
            # epoch 0 of local is a page-cache warm-up: compare later epochs only
            later = sorted(r["img_s"] for r in rows if r["run"] == "local" and r["epoch"] > 0)
            loc_s = {"best": later[-1], "median": later[len(later) // 2]}
            c = sm["remote_cached"]
            print(f"cached remote / local: best {100 * c['best'] / loc_s['best']:.0f} %, "
                  f"median {100 * c['median'] / loc_s['median']:.0f} % "
                  f"(local best {loc_s['best']:.0f}, median {loc_s['median']:.0f} img/s)")
            by = {(r["epoch"], r["run"]): r["img_s"] for r in rows}
            paired = sorted(by[e, "remote_cached"] / by[e, "local"] for e in range(1, args.epochs))
            out["ratio_cached"] = {"best": c["best"] / loc_s["best"], "median": c["median"] / loc_s["median"],
                                   "paired_median": paired[len(paired) // 2]}
            print(f"cached remote / local, same epoch (back to back): median {100 * paired[len(paired) // 2]:.0f} %, "
                  f"range {100 * paired[0]:.0f}–{100 * paired[-1]:.0f} %")
            cpu = {k: sorted(r["cpu_s_per_1k"] for r in rows if r["run"] == k and r["epoch"] > 0)
                   for k in ("local", "remote_cached")}
            print(f"CPU per 1000 images (median): local {cpu['local'][len(cpu['local']) // 2]:.2f} s, cached remote "
                  f"{cpu['remote_cached'][len(cpu['remote_cached']) // 2]:.2f} s")
        print(f"first remote epoch {sm['remote_first']['best']:.0f} img/s; bounded cache: epochs "
              f"{', '.join(f'{x:.0f}' for x in sm['remote_bounded']['all'])} img/s, peak {peak[0]} bytes of shards, "
              f"limit {limit} ({'within' if peak[0] <= limit else 'OVER'}); full cache {out['full_cache_bytes']} "
              f"bytes; upload {upload_s:.1f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        for ld in (full, bounded, loc):
            ld.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
