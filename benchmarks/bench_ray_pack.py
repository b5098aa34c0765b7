#!/usr/bin/env python3
"""`recordtool pack --engine ray` against `--engine local` (threads) and `--engine process` on the
same folder and the same cores.

Both engines run as the command users run (`python -m recordtool.cli pack SRC OUT --shards S`),
in turn, pinned to the same `--cores` CPUs (the local engine with its default 2 × cores
threads, Ray with a `num_cpus=cores` instance started here once and joined with
`--ray-address`, as a user joins a running cluster). Each configuration is run on SRC and on a
tiny slice of it (TINY files): the tiny run is the fixed cost (process start, Ray job and
worker start-up, publish), and (N - TINY) / (t_full - t_tiny) the steady rate that decides
hours at ImageNet scale. With and without `--max-side` transcoding.

    python benchmarks/bench_ray_pack.py SRC --cores 16 [--replicate 8] [--max-side 256] [--json out.json]

`--replicate K` packs SRC's files K times (hard links under K copies of each class folder), so a
small generated set gives runs long enough for the steady rate; all reads come from the page
cache, so this measures pack's CPU work (probe, transcode, framing, CRC, write), not storage.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TINY = 16


def tiny_copy(src: str, dst: str) -> int:
    """The first TINY images of SRC (sorted), hard-linked (or copied) into an ImageFolder at dst."""
    n = 0
    for cls in sorted(os.listdir(src)):
        d = os.path.join(src, cls)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            if n == TINY:
                return n
            os.makedirs(os.path.join(dst, cls), exist_ok=True)
            try:
                os.link(os.path.join(d, name), os.path.join(dst, cls, name))
            except OSError:
                shutil.copy(os.path.join(d, name), os.path.join(dst, cls, name))
            n += 1
    return n


def replicate(src: str, dst: str, k: int) -> None:
    """SRC's class folders k times (`<class>_<i>`), files hard-linked (or copied)."""
    for cls in sorted(os.listdir(src)):
        d = os.path.join(src, cls)
        if not os.path.isdir(d):
            continue
        for i in range(k):
            os.makedirs(os.path.join(dst, f"{cls}_{i}"))
            for name in os.listdir(d):
                try:
                    os.link(os.path.join(d, name), os.path.join(dst, f"{cls}_{i}", name))
                except OSError:
                    shutil.copy(os.path.join(d, name), os.path.join(dst, f"{cls}_{i}", name))


def warm(src: str) -> int:
    """Read every file once (both engines then read from the page cache); total bytes."""
    total = 0
    for root, _, names in os.walk(src):
        for n in names:
            with open(os.path.join(root, n), "rb") as f:
                while chunk := f.read(1 << 22):
                    total += len(chunk)
    return total


def run_pack(src: str, out: str, args: list) -> tuple:
    """(wall seconds, records, pack's own seconds) of one `recordtool pack` command."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "recordtool.cli", "pack", src, out, "-q"] + args
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    m = re.search(r"packed (\d+) records .* in ([\d.]+) s", p.stdout)
    shutil.rmtree(out, ignore_errors=True)
    return wall, int(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="ImageNet-style folder")
    ap.add_argument("--cores", type=int, default=os.cpu_count(), help="CPUs both engines get (pinned)")
    ap.add_argument("--replicate", type=int, default=1, help="pack SRC's files this many times (hard links)")
    ap.add_argument("--shards", type=int, default=None, help="part files (default 4 × cores)")
    ap.add_argument("--max-side", type=int, default=256, help="the transcoding run's --max-side (0: skip it)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per configuration (best kept)")
    ap.add_argument("--tmp", default=None, help="where OUT folders go (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write the numbers here")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))[:a.cores]
    os.sched_setaffinity(0, cpus)  # children (pack commands, Ray's processes) inherit it
    shards = a.shards or 4 * a.cores
    tmp = tempfile.mkdtemp(prefix="bench-ray-pack-", dir=a.tmp)
    if a.replicate > 1:
        replicate(a.src, os.path.join(tmp, "src"), a.replicate)
        a.src = os.path.join(tmp, "src")
    tiny = os.path.join(tmp, "tiny")
    tiny_copy(a.src, tiny)
    nbytes = warm(a.src)

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # one machine: Ray on the loopback address
    import ray

    ctx = ray.init(address="local", num_cpus=a.cores, include_dashboard=False, logging_level="WARNING")
    address = ctx.address_info["gcs_address"]
    rows = []
    try:
        configs = [("copy", [])] + ([(f"max-side {a.max_side}", ["--max-side", str(a.max_side)])] if a.max_side else [])
        for label, extra in configs:
            for engine, eargs in (("local", ["--engine", "local"]), ("process", ["--engine", "process"]),
                                  ("ray", ["--engine", "ray", "--ray-address", address])):
                args = ["--shards", str(shards)] + extra + eargs
                best = None
                for _ in range(a.repeat):
                    full = run_pack(a.src, os.path.join(tmp, "out"), args)
                    small = run_pack(tiny, os.path.join(tmp, "out"), ["--shards", "1"] + extra + eargs)
                    if best is None or full[0] < best[0][0]:
                        best = (full, small)
                (wall, n, own), (t_tiny, n_tiny, _) = best
                steady = (n - n_tiny) / max(1e-9, wall - t_tiny)
                rows.append({"transcode": label, "engine": engine, "records": n, "wall_s": round(wall, 3),
                             "pack_s": round(own, 3), "tiny_wall_s": round(t_tiny, 3),
                             "rec_per_s": round(n / wall, 1), "steady_rec_per_s": round(steady, 1)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(cpus)} cores, {shards} shards, {rows[0]['records']} images, {nbytes / 1e6:.0f} MB")
    print(f"{'transcode':14} {'engine':6} {'wall s':>8} {'rec/s':>8} {'fixed s':>8} {'steady rec/s':>13} {'vs local':>13}")
    for r in rows:
        peer = next(x for x in rows if x["transcode"] == r["transcode"] and x["engine"] == "local")
        vs = (peer["steady_rec_per_s"] / r["steady_rec_per_s"] - 1) * 100
        print(f"{r['transcode']:14} {r['engine']:6} {r['wall_s']:8.2f} {r['rec_per_s']:8.0f} {r['tiny_wall_s']:8.2f} "
              f"{r['steady_rec_per_s']:13.0f} {'' if r is peer else f'{vs:+.0f} % time':>13}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cores": len(cpus), "shards": shards, "bytes": nbytes, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
