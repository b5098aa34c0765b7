#!/usr/bin/env python3
"""GPU loader benchmark on one machine, peers and ceilings in the same run.

  bench_gpu.py PACKED [--batch 256] [--epochs 2] [--json FILE]

- recordtool GPU: records → RandomResizedCrop windows → flip → normalize → fp16 NCHW 224² on GPU
  (NVJPG hardware ROI decode + CPU native decode, auto split, one CUDA kernel), producer threads
- peers: nvImageCodec batched decode + torch crop/resize/normalize (when importable);
  torchvision decode_jpeg(device="cuda") batched + resized_crop; Pillow + RandomResizedCrop in a
  process pool (one process per core)
- ceilings: bare NVJPG batched full decode of the hardware-decodable subset; bare CPU full decode
  (OpenCV, one thread per core)
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import recordtool  # noqa: E402
from recordtool.decode import random_flips, random_windows  # noqa: E402
from recordtool.bench import nvimgcodec_peer, torchvision_peer  # noqa: E402,F401
from recordtool.decode.gpu import GPUDecoder, OutputRing, device_memory_used, hardware_decodable, route  # noqa: E402,E501

def log(*a):
    print(*a, flush=True)


def recordtool_gpu(ds, batch, epochs, producers, split="auto", hybrid=True):
    import cupy

    n = len(ds)
    idx_all = ds.index
    hw = route(idx_all.chroma, idx_all.progressive, idx_all.colorspace)
    cpu_threads = max(1, ((os.cpu_count() or 2) - producers) // producers)
    decs = [GPUDecoder(max_batch=batch, dtype="float16", layout="NCHW", split=split, cpu_threads=cpu_threads,
                       pool=k + 1, hybrid=hybrid) for k in range(producers)]
    # outputs alive at once: one being made per producer, 2 per producer queued, the consumer's
    ring = OutputRing(decs[0].output_shape(), "float16", 3 * producers + 2)
    for d in decs:
        d.ring = ring
        d.warmup(idx_all.jpeg_length, idx_all.width, idx_all.height, routes=hw)
    pool = cupy.get_default_memory_pool()
    results = {}
    for epoch in range(epochs):
        order = ds.sampler(seed=0).indices(epoch)
        batches = [order[s:s + batch] for s in range(0, n - batch + 1, batch)]
        q_in: queue.Queue = queue.Queue()
        for k, b in enumerate(batches):
            q_in.put((k, b))
        q_out: queue.Queue = queue.Queue(maxsize=2 * producers)

        def produce(dec):
            while True:
                try:
                    k, b = q_in.get_nowait()
                except queue.Empty:
                    q_out.put(None)
                    return
                bufs = [ds[int(i)][0] for i in b]
                win = random_windows(idx_all.width[b], idx_all.height[b], b, 0, epoch)
                flips = random_flips(b, 0, epoch)
                out = dec(bufs, win, flips, hw[b])
                q_out.put((k, out, dict(dec.last)))

        pool_before = pool.total_bytes()
        used_before, spills_before = device_memory_used(), ring.spills
        allocs_before = sum(d.allocations for d in decs)
        t = time.perf_counter()
        ths = [threading.Thread(target=produce, args=(d,)) for d in decs]
        for th in ths:
            th.start()
        done, finished, splits = 0, 0, []
        while finished < producers:
            item = q_out.get()
            if item is None:
                finished += 1
                continue
            _, out, last = item
            done += out.shape[0]
            splits.append(last)
            del out
        dt = time.perf_counter() - t
        for th in ths:
            th.join()
        cpu_share = float(np.mean([s["cpu"] / s["n"] for s in splits[len(splits) // 2:]]))
        results = {"img_s": done / dt, "images": done, "seconds": dt, "cpu_share": cpu_share,
                   "cpu_forced_share": float(np.mean([s["cpu_forced"] / s["n"] for s in splits])),
                   "gpu_rate": splits[-1]["gpu_rate"], "cpu_rate": splits[-1]["cpu_rate"],
                   "hybrid_share": float(np.mean([s["hybrid"] / s["n"] for s in splits])),
                   "pool_growth_bytes": pool.total_bytes() - pool_before,
                   "device_used_growth_bytes": device_memory_used() - used_before, "ring_spills": ring.spills - spills_before,
                   "buffer_growths": sum(d.allocations for d in decs) - allocs_before,
                   "errors": sum(len(s["errors"]) for s in splits), "hw_error": decs[0].hw_error}
        log(f"  epoch {epoch}: {done / dt:,.0f} img/s, cpu share {cpu_share:.2f}, hybrid share "
            f"{results['hybrid_share']:.3f}, pool growth {results['pool_growth_bytes']} B, device memory growth "
            f"{results['device_used_growth_bytes']} B, ring spills {results['ring_spills']}, buffer growths "
            f"{results['buffer_growths']}, prealloc {decs[0].prealloc_error or 'ok'}")
    for d in decs:
        d.close()
    return results


def nvjpg_ceiling(ds, batch, threads=2, passes=2):
    """Bare full-image hardware decode of the hardware-decodable subset, `threads` submitters,
    each with its own decoder, stream and buffers set up before the clock starts."""
    import cupy

    from recordtool import _native
    from recordtool.decode.nvjpeg import HardwareDecoder

    c = ds.index
    hw = np.nonzero(hardware_decodable(c.chroma, c.progressive, c.colorspace))[0]
    batches = [hw[s:s + batch] for s in range(0, len(hw) - batch + 1, batch)] * passes
    areas = np.sort(c.width[hw].astype(np.int64) * c.height[hw])[::-1][:batch]
    cap = int(np.sort(c.jpeg_length[hw])[::-1][:batch].sum()) + batch * 64
    ctx = []
    for _ in range(threads):
        stage = cupy.cuda.alloc_pinned_memory(cap)
        ctx.append((HardwareDecoder(batch), cupy.cuda.Stream(non_blocking=True),
                    cupy.empty(int(areas.sum() * 3 + batch * 256), np.uint8), stage,
                    np.frombuffer(stage, np.uint8).ctypes.data))

    def worker(k, my_batches):
        dec, stream, arena, _, base = ctx[k]
        for b in my_batches:
            bufs = [ds[int(i)][0] for i in b]
            offs = _native.gather(bufs, base, cap, 64)
            w, h = c.width[b].astype(np.int64), c.height[b].astype(np.int64)
            size = (w * h * 3 + 255) // 256 * 256
            dst = arena.data.ptr + np.concatenate([[0], np.cumsum(size)[:-1]])
            rois = np.stack([np.zeros_like(w), np.zeros_like(w), w, h], 1)
            dec.decode((base + offs).tolist(), [len(x) for x in bufs], rois.tolist(), dst.tolist(),
                       (w * 3).tolist(), stream.ptr)
            stream.synchronize()

    for k in range(threads):
        worker(k, batches[:1])
    t = time.perf_counter()
    ths = [threading.Thread(target=worker, args=(k, batches[k::threads])) for k in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    dt = time.perf_counter() - t
    engines = ctx[0][0].engines
    for d, *_ in ctx:
        d.close()
    return len(batches) * batch / dt, engines


def cpu_ceiling(ds, threads):
    import cv2

    cv2.setNumThreads(1)
    bufs = [ds[i][0] for i in range(len(ds))]

    def one(b):
        cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, bufs[:512]))
        t = time.perf_counter()
        list(ex.map(one, bufs, chunksize=32))
        return len(bufs) / (time.perf_counter() - t)


def pil_peer(path, ds, procs):
    from recordtool.bench import pil_rrc_rate

    idx = np.arange(len(ds))
    return pil_rrc_rate(path, idx, random_windows(ds.index.width, ds.index.height, idx, 0, 0), procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--producers", default="4,6", help="producer-thread counts to try (the first is the headline)")
    ap.add_argument("--splits", default="auto,gpu", help="split modes to try (auto, gpu, cpu or a CPU share)")
    ap.add_argument("--hybrid", default="on,off", help="progressive/gray files to nvJPEG's hybrid decoder (on) "
                    "or the CPU path (off); both are tried")
    ap.add_argument("--peer-images", type=int, default=4096)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ds = recordtool.open(a.packed)
    for i in range(len(ds)):
        bytes(ds[i][0])  # page cache warm
    cores = os.cpu_count()
    r = {"images": len(ds), "cores": cores, "commit": os.environ.get("RECORDTOOL_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
    log(f"bench_gpu: {len(ds)} images, {np.mean(ds.index.jpeg_length) / 1e3:.0f} KB mean, {cores} cores")
    def sweep():
        runs = []
        for hy in a.hybrid.split(","):
            for sp in a.splits.split(","):
                sp = sp if sp in ("auto", "gpu", "cpu") else float(sp)
                for p in [int(x) for x in a.producers.split(",")]:
                    res = recordtool_gpu(ds, a.batch, a.epochs, p, split=sp, hybrid=hy == "on")
                    res.update(producers=p, split=sp, hybrid=hy)
                    log(f"  producers {p} split {sp} hybrid {hy}: {res['img_s']:,.0f} img/s")
                    runs.append(res)
        # the headline is the first configuration (the defaults: hybrid on, auto split), not the
        # best of the sweep; the sweep is reported beside it
        keys = ("producers", "split", "hybrid", "img_s", "cpu_share", "hybrid_share")
        return dict(runs[0], sweep=[{k: x[k] for k in keys} for x in runs])

    steps = [
        ("recordtool_gpu", sweep),
        ("nvjpg_full_decode_ceiling", lambda: nvjpg_ceiling(ds, a.batch)),
        ("cpu_full_decode_ceiling", lambda: cpu_ceiling(ds, cores)),
        ("torchvision_gpu_peer", lambda: torchvision_peer(ds, a.batch, a.peer_images)),
        ("nvimgcodec_peer", lambda: nvimgcodec_peer(ds, a.batch, a.peer_images)),
        ("pil_pool_peer", lambda: pil_peer(a.packed, ds, cores)),
    ]
    for name, fn in steps:
        t = time.perf_counter()
        try:
            r[name] = fn()
        except Exception as e:  # a missing peer is reported, not fatal
            r[name] = {"error": f"{type(e).__name__}: {e}"}
        log(f"{name}: {r[name]}  ({time.perf_counter() - t:.0f} s)")
    ours = r["recordtool_gpu"].get("img_s") if isinstance(r["recordtool_gpu"], dict) else None

    def val(x):
        if isinstance(x, dict):
            return None
        return x[0] if isinstance(x, tuple) else x

    peers = {k: val(r[k]) for k in ("torchvision_gpu_peer", "nvimgcodec_peer", "pil_pool_peer")}
    ceil = [val(r["nvjpg_full_decode_ceiling"]), val(r["cpu_full_decode_ceiling"])]
    log("\n=== bench_gpu summary (img/s)")
    head = r["recordtool_gpu"]
    log(f"  recordtool GPU loader (fp16 NCHW 224, RRC+flip+normalize)  {ours or 0:>10,.0f}")
    for x in head.get("sweep", [])[1:] if isinstance(head, dict) else []:
        log(f"    sweep: producers {x['producers']} split {x['split']} hybrid {x['hybrid']}"
            f"{'':<17} {x['img_s']:>10,.0f}")
    for k, v in peers.items():
        log(f"  {k:<56} {v or 0:>10,.0f}")
    log(f"  ceiling: NVJPG full decode (hw subset)                      {ceil[0] or 0:>10,.0f}")
    log(f"  ceiling: CPU full decode, {cores} threads                          {ceil[1] or 0:>10,.0f}")
    best_peer = max(v for v in peers.values() if v) if any(peers.values()) else None
    if ours and best_peer:
        log(f"  vs best peer {ours / best_peer:.2f}x (goal >= 3)")
    if ours and all(ceil):
        log(f"  vs ceilings' sum {100 * ours / sum(ceil):.0f}% (goal >= 80%)   goal 20,000 img/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1, default=str)


if __name__ == "__main__":
    main()
