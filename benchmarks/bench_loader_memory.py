#!/usr/bin/env python3
"""Host RSS (and GPU memory on cuda) per epoch over many epochs of the Loader, plus the cost of
the two example user ops.

  bench_loader_memory.py PACKED [--device cpu|cuda] [--epochs 10] [--images N]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
import recordtool  # noqa: E402
from recordtool.ops import Cutout, RandomGrayscale, ReferenceOp  # noqa: E402


def rss_mb():
    """Anonymous resident memory: the process's own allocations. File-backed pages of the
    mmapped shards (page cache, reclaimable) are left out: they grow as more records are read."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1e3
    return float("nan")


def run(path, device, epochs, batch, user_op=None, images=None):
    ld = recordtool.Loader(path, batch_size=batch, device=device, user_op=user_op,
                           dtype="float16" if device == "cuda" else "float32")
    limit = (images // batch) if images else None
    rows = []
    for e in range(epochs):
        ld.set_epoch(e)
        t = time.perf_counter()
        n = 0
        for k, (x, _) in enumerate(ld):
            n += x.shape[0]
            if limit and k + 1 >= limit:
                break
        if device == "cuda":
            import cupy
            import torch

            torch.cuda.synchronize()
            from recordtool.decode.gpu.buffers import device_memory_used

            gpu = (cupy.get_default_memory_pool().total_bytes() / 1e6, device_memory_used(ld.gpu_id) / 1e6,
                   ld.ring.spills)
        else:
            gpu = (0.0, 0.0, 0)
        rows.append((e, n / (time.perf_counter() - t), rss_mb(), gpu))
    ld.close()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("packed")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--images", type=int, default=None)
    a = ap.parse_args()
    rows = run(a.packed, a.device, a.epochs, a.batch, images=a.images)
    print(f"bench_loader_memory: {a.packed}, device {a.device}, {a.epochs} epochs")
    for e, rate, rss, (pool, used, spills) in rows:
        print(f"  epoch {e}: {rate:8,.0f} img/s  RssAnon {rss:8.1f} MB  CuPy pool {pool:8.1f} MB  "
              f"device used {used:8.1f} MB  ring spills {spills}")
    rss = np.array([r[2] for r in rows[1:]])
    print(f"  RSS after warm-up: min {rss.min():.1f} max {rss.max():.1f} MB "
          f"({100 * (rss.max() - rss.min()) / rss.min():.1f} % spread, goal within ±5 %)")
    if a.device == "cuda":
        used = np.array([r[3][1] for r in rows[1:]])
        print(f"  device memory after warm-up: min {used.min():.1f} max {used.max():.1f} MB "
              f"(growth {used.max() - used.min():.1f} MB, goal 0)")
    base = np.median([r[1] for r in rows[1:]])
    # the ops as array code on the whole batch (no Numba needed)
    for name, op in (("RandomGrayscale(p=0.2)", ReferenceOp(RandomGrayscale(0.2))), ("Cutout(56)", ReferenceOp(Cutout(56)))):
        r = run(a.packed, a.device, 3, a.batch, user_op=op, images=a.images)
        rate = np.median([x[1] for x in r[1:]])
        print(f"  user op {name:<24} {rate:8,.0f} img/s ({100 * (base - rate) / base:+.1f} % cost)")


if __name__ == "__main__":
    main()
