#!/usr/bin/env python3
"""One loader per process under torch.distributed: per-rank img/s, total img/s, and a check that
the ranks together see every sample exactly once per epoch.

  torchrun --nproc_per_node=N scripts/distributed_loader.py PACKED [--device cuda|cpu] [--epochs 2]

NCCL with one GPU per rank; gloo on CPU and when ranks share a GPU (NCCL refuses two ranks on
one device). The machine's NCCL environment variables are left as they are. Rank 0 prints the
table; exit 1 if coverage fails.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import recordtool  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--producers", type=int, default=None, help="loader producer threads per rank")
    ap.add_argument("--backend", default=None, help="nccl or gloo (default: nccl when each rank has a GPU)")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    shared = cuda and local_world > torch.cuda.device_count()
    backend = a.backend or ("nccl" if cuda and not shared else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        dev = local % torch.cuda.device_count()  # ranks share a device when there are fewer GPUs
        torch.cuda.set_device(dev)
        import cupy

        cupy.cuda.Device(dev).use()
    threads = a.threads or max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    loader = recordtool.Loader(a.packed, batch_size=a.batch, device=a.device, drop_last=False, threads=threads,
                               with_ids=True, dtype="float16" if cuda else "float32", producers=a.producers)
    assert (loader.rank, loader.world_size) == (rank, world)
    n = len(loader.ds)
    ok = True
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        dist.barrier()
        t = time.perf_counter()
        seen = []
        for x, y, ids in loader:
            seen.append(np.asarray(ids))
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        mine = np.concatenate(seen) if seen else np.zeros(0, np.int64)
        rates = [None] * world
        all_ids = [None] * world
        dist.all_gather_object(rates, (len(mine), dt))
        dist.all_gather_object(all_ids, mine.tolist())
        if rank == 0:
            union = np.concatenate([np.asarray(x, np.int64) for x in all_ids])
            counts = np.bincount(union, minlength=n)
            exact = bool((counts == 1).all())
            pad = world * len(loader.sampler) - n  # DistributedSampler-style padding when n % world
            ok &= exact or (pad > 0 and (counts >= 1).all() and counts.sum() == n + pad)
            gpus = torch.cuda.device_count() if cuda else 0
            print(f"epoch {epoch}: {n} samples, {world} ranks, device {a.device} ({gpus} GPUs"
                  f"{', shared by the ranks' if shared else ''}), backend {backend}, {threads} threads/rank")
            for r, (cnt, secs) in enumerate(rates):
                print(f"  rank {r}: {cnt} images in {secs:.2f} s = {cnt / secs:,.0f} img/s")
            total = sum(c for c, _ in rates) / max(s for _, s in rates)
            print(f"  total {total:,.0f} img/s; every sample exactly once: {exact}"
                  + ("" if exact else f" (missing {(counts == 0).sum()}, repeated {(counts > 1).sum()}, "
                                      f"padding {pad})"))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("coverage OK" if ok else "coverage FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
