#!/usr/bin/env python3
"""One Loader per process under torch.distributed: per-rank img/s per epoch, total img/s, a check
that the ranks together see every sample exactly once per epoch, and a mid-epoch resume check.

  torchrun --nproc_per_node=N examples/distributed_loader.py PACKED [--device cuda|cpu] [--epochs 6]
      [--pin/--no-pin] [--resume-check] [--json FILE]

NCCL with one GPU per rank; gloo on CPU and when ranks share a GPU (NCCL refuses two ranks on
one device). The machine's NCCL environment variables are left as they are. With --pin each
rank is pinned to its own share of the cores (the cores this process may use / ranks on this
node) before its Loader starts, so its threads stay there. The first epoch warms up; the table
gives each rank's img/s per timed epoch, its median, the cores it kept busy and where its
producers' time went. --resume-check: in one more epoch (split "gpu", bit-identical pixels) every
rank takes some batches, saves state_dict, stops, and a new Loader resumes from it; the batches
(ids, labels and a checksum of the pixels) must equal an uninterrupted run's. Rank 0 prints the
table; exit 1 if coverage or resume fails.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
import recordtool  # noqa: E402
from recordtool.tools.train_ddp import cover, end_rank, resume_matches  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2, help="epochs run; the first is not timed")
    ap.add_argument("--threads", type=int, default=None, help="decode threads per rank (default: its cores)")
    ap.add_argument("--producers", type=int, default=None, help="loader producer threads per rank")
    ap.add_argument("--backend", default=None, help="nccl or gloo (default: nccl when each rank has a GPU)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="pin each rank to its share of the cores")
    ap.add_argument("--resume-check", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cuda = a.device == "cuda"
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    local = int(os.environ.get("LOCAL_RANK", 0))
    shared = cuda and local_world > torch.cuda.device_count()
    backend = a.backend or ("nccl" if cuda and not shared else "gloo")
    cpus = sorted(os.sched_getaffinity(0))
    if a.pin and local_world > 1:
        share = len(cpus) // local_world
        # more ranks than cores (a 2-core CI machine, 3 ranks): each rank gets one core, shared
        cpus = cpus[local * share:(local + 1) * share] if share else [cpus[local % len(cpus)]]
        os.sched_setaffinity(0, cpus)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        dev = local % torch.cuda.device_count()  # ranks share a device when there are fewer GPUs
        torch.cuda.set_device(dev)
        import cupy

        cupy.cuda.Device(dev).use()
    threads = a.threads or len(os.sched_getaffinity(0))
    kw = dict(batch_size=a.batch, device=a.device, drop_last=False, threads=threads, with_ids=True,
              output=recordtool.Output(dtype="float16" if cuda else "float32"), producers=a.producers)
    loader = recordtool.Loader(a.packed, **kw)
    assert (loader.rank, loader.world_size) == (rank, world)
    n = len(loader.ds)
    ok = True
    epochs = []
    for epoch in range(a.epochs):
        loader.set_epoch(epoch)
        if epoch == 1:
            loader.stage_seconds.clear()
        dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        seen = []
        for x, y, ids in loader:
            seen.append(np.asarray(ids))
        if cuda:
            torch.cuda.synchronize()
        dt, busy = time.perf_counter() - t, (time.process_time() - c) / (time.perf_counter() - t)
        mine = np.concatenate(seen) if seen else np.zeros(0, np.int64)
        rates = [None] * world
        all_ids = [None] * world
        dist.all_gather_object(rates, (len(mine), dt, busy))
        dist.all_gather_object(all_ids, mine.tolist())
        if rank == 0:
            pad = world * len(loader.sampler) - n  # DistributedSampler-style padding when n % world
            exact, covered, counts = cover(all_ids, n, pad)
            ok = ok and covered
            epochs.append({"epoch": epoch, "ranks": [{"images": cnt, "seconds": s, "img_s": cnt / s, "cores_busy": b}
                                                     for cnt, s, b in rates],
                           "total_img_s": sum(r[0] for r in rates) / max(r[1] for r in rates), "exact_cover": exact})
            print(f"epoch {epoch}: " + ", ".join(f"rank {r} {cnt / s:,.0f} img/s ({b:.1f} cores)"
                                                  for r, (cnt, s, b) in enumerate(rates))
                  + f"; total {epochs[-1]['total_img_s']:,.0f}; every sample exactly once: {exact}"
                  + ("" if exact else f" (missing {(counts == 0).sum()}, repeated {(counts > 1).sum()}, padding {pad})"),
                  flush=True)
    stages = [None] * world
    dist.all_gather_object(stages, {k: round(1e3 * v / max(1, n // world * max(1, a.epochs - 1)), 4)
                                    for k, v in loader.stage_seconds.items()})
    loader.close()
    loader.backend.close()
    resume_ok = None
    if a.resume_check:
        if cuda:  # every image the engines take on them: bit-identical pixels run to run
            kw["gpu"] = recordtool.GPUOptions(split="gpu")
        e = a.epochs
        same, n_ref, k = resume_matches(a.packed, e, **kw)
        flags = [None] * world
        dist.all_gather_object(flags, (same, n_ref, k))
        resume_ok = bool(all(f[0] for f in flags))
        ok = ok and resume_ok
        if rank == 0:
            print(f"resume check (epoch {e}{', split gpu' if cuda else ''}): each rank stopped after "
                  f"{[f[2] for f in flags]} of {[f[1] for f in flags]} batches and resumed from state_dict; "
                  f"batches identical to an uninterrupted run: {[f[0] for f in flags]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        timed = epochs[1:] or epochs
        med = [float(np.median([ep["ranks"][r]["img_s"] for ep in timed])) for r in range(world)]
        gpus = torch.cuda.device_count() if cuda else 0
        print(f"\n{n} samples, {world} ranks, device {a.device} ({gpus} GPUs{', shared' if shared else ''}), backend "
              f"{backend}, {threads} threads/rank, pinned {a.pin}, {len(timed)} timed epochs")
        for r in range(world):
            print(f"  rank {r}: median {med[r]:,.0f} img/s; producer ms/image {stages[r]}")
        print(f"  total (median of epochs) {float(np.median([ep['total_img_s'] for ep in timed])):,.0f} img/s")
        print("coverage OK" if ok else "coverage FAILED")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"world": world, "device": a.device, "backend": backend, "threads": threads, "pinned": a.pin,
                           "epochs": epochs, "median_img_s": med, "stages_ms_per_image": stages,
                           "resume_ok": resume_ok, "ok": ok}, f, indent=1)
    end_rank(0 if ok else 1)  # not sys.exit: train_ddp.end_rank says why


if __name__ == "__main__":
    main()
