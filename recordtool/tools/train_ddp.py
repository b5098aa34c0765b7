"""The DDP form of the training benchmark (`python -m recordtool.tools.train_bench PACKED --ddp`
under torchrun): one rank per GPU, and the Loader's checks across ranks — every sample once per
epoch, a mid-epoch resume identical — whose parts (`digest`, `batches_of`, `cover`,
`resume_matches`) examples/distributed_loader.py uses too."""
from __future__ import annotations

import os
import statistics
import sys
from typing import NoReturn

from .train_pipelines import dali, endless, make_loader, parse_options, synthetic
from .train_step import ARCH_SIZES, release, train


def digest(x) -> tuple:
    """Exact integer checksum of a batch's bits (on its device)."""
    import torch

    v = torch.as_tensor(x).contiguous()
    v = v.view(torch.int16 if v.element_size() == 2 else torch.int32).to(torch.int64).flatten()
    w = torch.arange(v.numel(), device=v.device, dtype=torch.int64) % 65521 + 1
    return int(v.sum().item()), int((v * w).sum().item())


def batches_of(loader, limit=None) -> list:
    """(ids, labels, digest) of each batch of a `with_ids` Loader's epoch (the first `limit`)."""
    import numpy as np
    import torch

    out = []
    for k, (x, y, ids) in enumerate(loader):
        out.append((np.asarray(ids).tolist(), torch.as_tensor(y).cpu().tolist(), digest(x)))
        if limit is not None and k + 1 >= limit:
            break
    return out


def cover(id_lists, n: int, pad: int) -> tuple:
    """(exact, ok, counts) for the sample ids every rank saw in one epoch: exact = each of the n
    samples once; ok = exact, or DistributedSampler-style padding of `pad` repeats with none
    missing; counts = how often each sample was seen."""
    import numpy as np

    union = np.concatenate([np.asarray(x, np.int64) for x in id_lists]) if id_lists else np.zeros(0, np.int64)
    counts = np.bincount(union, minlength=n)
    exact = bool((counts == 1).all())
    return exact, bool(exact or (pad > 0 and (counts >= 1).all() and counts.sum() == n + pad)), counts


def resume_matches(packed: str, epoch: int, **kw) -> tuple:
    """A Loader(packed, **kw) stopped a third into `epoch`, its state_dict loaded into a new
    Loader: (the batches equal an uninterrupted run's, batches in the epoch, batches before
    the stop). kw must include with_ids=True and a bit-identical split."""
    from ..loader import Loader

    def run(limit=None, state=None):
        ld = Loader(packed, **kw)
        ld.set_epoch(epoch)
        if state is not None:
            ld.load_state_dict(state)
        out = batches_of(ld, limit)
        st = ld.state_dict()
        ld.close()
        ld.backend.close()
        return out, st

    ref, _ = run()
    k = max(1, len(ref) // 3)
    got, state = run(k)
    rest, _ = run(state=state)
    return got + rest == ref, len(ref), k


def ddp_run(packed: str, files: str | None, arch: str, size: int | None, batch: int, steps: int, warmup: int,
            repeats: int, pipelines, threads: int | None, device: str, pin: bool = True, log=print) -> dict:
    """The DDP form, in each process torchrun starts: the model wrapped in DistributedDataParallel,
    one rank per GPU (NCCL; gloo on CPU), each pinned to its share of the cores (`pin`), the
    Loader on its rank's share, DALI on its shard of the files. Every run's img/s and wait are
    gathered per rank; then two checks on the Loader: every sample once per epoch across ranks,
    and a mid-epoch resume on every rank equal to the uninterrupted run. Returns rank 0's
    report (other ranks: {})."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from ..loader import Loader

    cuda = device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    if pin and local_world > 1 and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        share = max(1, len(cpus) // local_world)
        os.sched_setaffinity(0, cpus[local * share:(local + 1) * share])
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
        import cupy

        cupy.cuda.Device(local % torch.cuda.device_count()).use()
    backend = "nccl" if cuda and local_world <= torch.cuda.device_count() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    size = size or ARCH_SIZES.get(arch, 224)
    report: dict = {"world": world, "backend": backend, "device": device, "arch": arch, "size": size, "batch": batch,
                    "threads_per_rank": threads, "runs": []}
    for rep in range(repeats):
        for name in pipelines:
            base, _, spec = name.partition(":")
            it, ld, err = None, None, None
            try:
                if base == "synthetic":
                    it = synthetic(batch, size, "cuda" if cuda else "cpu_torch")
                elif base == "recordtool":
                    ld = make_loader(packed, batch, size, device, dict(parse_options(spec), as_torch=True))
                    it = endless(ld)
                elif base == "dali":
                    if files is None:
                        raise ValueError("dali needs the original files (--files)")
                    it = dali(files, batch, size, threads, 0.75, device, rank, world, local)
                else:
                    raise ValueError(f"unknown pipeline {name!r} in the DDP form (synthetic, recordtool, dali)")
                dist.barrier()
                rate, wait, cores = train(it, arch, steps, warmup, False, device, ddp=True)
            except Exception as e:  # reported per rank, never a number
                rate, wait, cores, err = float("nan"), float("nan"), {}, f"{type(e).__name__}: {e}"
            finally:
                if ld is not None:
                    ld.close()
                    ld.backend.close()
                del it
                release(device)
            per_rank = [None] * world
            dist.all_gather_object(per_rank, {"img_s": rate, "wait_ms": wait, "cores": cores, "error": err})
            ok = [r for r in per_rank if r["error"] is None]
            row = {"pipeline": name, "repeat": rep, "ranks": per_rank,
                   "total_img_s": sum(r["img_s"] for r in ok) if len(ok) == world else float("nan")}
            report["runs"].append(row)
            if rank == 0:
                log(f"  run {rep + 1}/{repeats} {name:<24} total {row['total_img_s']:10,.0f} img/s; per rank "
                    + ", ".join(f"{r['img_s']:,.0f} (wait {r['wait_ms']:.1f} ms)" if r["error"] is None
                                else f"failed: {r['error']}" for r in per_rank))
    # every sample once per epoch across ranks, and a mid-epoch resume identical on every rank
    kw = dict(batch_size=batch, size=size, device=device, drop_last=False, with_ids=True, as_torch=True,
              dtype="float16" if cuda else "float32", split="gpu" if cuda else "auto")
    ld = Loader(packed, **kw)
    ids = np.concatenate([np.asarray(i) for _, _, i in ld]) if len(ld) else np.zeros(0, np.int64)
    n, pad = len(ld.ds), world * len(ld.sampler) - len(ld.ds)  # DistributedSampler-style padding
    ld.close()
    ld.backend.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, ids.tolist())
    covered = cover(gathered, n, pad)[1]
    flags = [None] * world
    dist.all_gather_object(flags, resume_matches(packed, 1, **kw)[0])
    report["every_sample_once"] = covered
    report["resume_identical"] = [bool(f) for f in flags]
    dist.barrier()
    dist.destroy_process_group()
    return report if rank == 0 else {}


def end_rank(code: int) -> NoReturn:
    """End a rank's process with `code`, without the interpreter's finalisation. torch's gloo
    worker threads outlive destroy_process_group; one still dropping a finished collective's
    tensors then takes the GIL of a finalising interpreter, which ends that thread by an unwind
    through noexcept frames: std::terminate, SIGABRT at exit (about one run in four on two
    ranks). The caller has written and closed what it reports; the standard streams are
    flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def ddp_table(report: dict) -> str:
    lines = [f"DDP training throughput: {report['arch']} @{report['size']}, batch {report['batch']} per rank, "
             f"{report['world']} ranks ({report['device']}, {report['backend']}, {report['threads_per_rank']} "
             f"threads/rank)", f"{'pipeline':<26}{'total img/s':>13}{'per rank (median of runs)':>40}"]
    rows: dict = {}
    for r in report["runs"]:
        rows.setdefault(r["pipeline"], []).append(r)
    for name, runs in rows.items():
        totals = [r["total_img_s"] for r in runs if r["total_img_s"] == r["total_img_s"]]
        if not totals:
            err = next((x["error"] for r in runs for x in r["ranks"] if x["error"]), "failed")
            lines.append(f"{name:<26} failed: {err}")
            continue
        per = [statistics.median(r["ranks"][k]["img_s"] for r in runs) for k in range(report["world"])]
        waits = [statistics.median(r["ranks"][k]["wait_ms"] for r in runs) for k in range(report["world"])]
        lines.append(f"{name:<26}{statistics.median(totals):13,.0f}   "
                     + ", ".join(f"{p:,.0f} (wait {w:.1f} ms)" for p, w in zip(per, waits)))
    lines.append(f"every sample once per epoch across ranks: {report['every_sample_once']}; "
                 f"mid-epoch resume identical on every rank: {report['resume_identical']}")
    return "\n".join(lines)
