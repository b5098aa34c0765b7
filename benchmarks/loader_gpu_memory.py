"""The GPU memory a cuda Loader holds, alone in its process, and where it goes.

Runs whole epochs of `Loader(PACKED, device="cuda", **OPTIONS)` and reports, as one JSON line:
img/s per epoch, what nvidia-smi says the process holds after the first epoch and at the end
(the CUDA context, torch's and CuPy's included), CuPy's pool, the output ring, each producer's
decoder buffers (arena, pinned staging: `decode.gpu.room` sizes them), buffer growths after
warm-up (0 in steady state), the images sent to the CPU share for want of room
(`Loader.overflow`), the decode split and the peak host RSS.

Usage (on a GPU machine, pinned to a node's share):
  taskset -c 0-3 python benchmarks/loader_gpu_memory.py PACKED --threads 4 --options '{"split": "gpu"}'
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--options", default="{}", help="the Loader's other keywords, as JSON")
    a = ap.parse_args(argv)
    import cupy
    import torch

    from recordtool import Loader
    from recordtool.tools.train_step import gpu_used_mib  # nvidia-smi's figure for this process

    torch.cuda.init()
    kw = dict(batch_size=a.batch, size=a.size, device="cuda", dtype="float16", as_torch=True, threads=a.threads)
    kw.update(json.loads(a.options))
    ld = Loader(a.packed, **kw)
    rates, first = [], None
    for epoch in range(a.epochs):
        ld.set_epoch(epoch)
        t, n = time.perf_counter(), 0
        for x, _ in ld:
            n += x.shape[0]
        torch.cuda.synchronize()
        rates.append(round(n / (time.perf_counter() - t)))
        if epoch == 0:
            first = gpu_used_mib("cuda")
    ring = ld.backend.ring
    decoders = {slot: dict(arena_mib=round(d.buf.arena.nbytes / 2**20, 1),
                           staging_mib=round(d.buf.staging_np.size / 2**20, 1),
                           growths=d.allocations, prealloc_error=d.prealloc_error)
                for slot, d in sorted(ld.backend._decoders.items())}
    report = dict(options=kw, img_s=rates, process_mib_after_epoch0=first, process_mib=gpu_used_mib("cuda"),
                  cupy_pool_mib=round(cupy.get_default_memory_pool().total_bytes() / 2**20),
                  ring_mib=round(ring.nbytes * ring.slots / 2**20), decoders=decoders, overflow=ld.overflow,
                  decoded=ld.decoded, max_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                  commit=os.environ.get("RECORDTOOL_COMMIT"))
    print(json.dumps(report), flush=True)
    ld.close()


if __name__ == "__main__":
    sys.exit(main())
