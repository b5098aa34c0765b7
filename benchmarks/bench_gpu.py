#!/usr/bin/env python3
"""GPU loader benchmark on one machine: the Loader users run, DALI and other peers, and the
hardware ceilings, in the same run on the same images.

  bench_gpu.py PACKED [--batch 256] [--epochs 3] [--json FILE] [--dali/--no-dali]

- recordtool: `recordtool.Loader(device="cuda")` — records → RandomResizedCrop windows → flip →
  normalize → fp16 NCHW 224² (NVJPG ROI decode + hybrid decoder + CPU share, one CUDA kernel);
  the headline is the default configuration, a sweep of producers / split / hybrid beside it
- peers: NVIDIA DALI (decoders.image_random_crop mixed → resize → crop_mirror_normalize fp16,
  best of hw_decoder_load 0.65/0.75/0.9, same records via external_source, same batch and
  threads); nvImageCodec and torchvision GPU decode + torch crop/resize/normalize; Pillow + RRC
  in a process pool (one process per core)
- ceilings: bare NVJPG batched full decode of the hardware-decodable subset (several submitter
  threads); bare CPU full decode (OpenCV, one thread per core)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # an installed recordtool first
import recordtool  # noqa: E402
from recordtool.tools import peers  # noqa: E402
from recordtool.tools.bench import loader_epochs  # noqa: E402
from recordtool.decode import random_windows  # noqa: E402
from recordtool.decode.gpu.buffers import device_memory_used  # noqa: E402
from recordtool.decode.gpu.plan import hardware_decodable  # noqa: E402


def log(*a):
    print(*a, flush=True)


def recordtool_loader(ds, batch, epochs, producers=None, split="auto", hybrid=True, cpu_threads=None, chroma=None):
    """The Loader, as users build it; memory growth after the warm-up epoch. cpu_threads: the
    native threads of each producer's CPU share (default: the Loader's, every core); chroma:
    the GPU decoders' chroma upsampling (default: the Loader's)."""
    import cupy

    gpu = recordtool.GPUOptions(split=split, hybrid=hybrid, **({} if chroma is None else {"chroma": chroma}))
    ld = recordtool.Loader(ds, batch_size=batch, device="cuda", dtype="float16", producers=producers, gpu=gpu)
    if cpu_threads:
        ld.backend.cpu_threads = cpu_threads
    pool = cupy.get_default_memory_pool()
    r = loader_epochs(ld, 1)  # warm-up epoch: threads, decoders, buffers, kernel build
    pool0, used0, spills0 = pool.total_bytes(), device_memory_used(ld.gpu_id), ld.ring.spills
    allocs0 = sum(d.allocations for d in ld.backend._decoders.values())
    r = loader_epochs(ld, epochs)
    r.update(pool_growth_bytes=pool.total_bytes() - pool0, device_used_growth_bytes=device_memory_used(ld.gpu_id) - used0,
             ring_spills=ld.ring.spills - spills0,
             buffer_growths=sum(d.allocations for d in ld.backend._decoders.values()) - allocs0,
             producers=ld.producers, split=split, hybrid=hybrid, cpu_threads=ld.backend.cpu_threads,
             chroma=ld.gpu.chroma)
    ld.close()
    ld.backend.close()
    return r


def nvjpg_ceiling(ds, batch, threads=2, passes=2):
    """Bare full-image hardware decode of the hardware-decodable subset, `threads` submitters,
    each with its own decoder, stream and buffers set up before the clock starts."""
    import cupy

    from recordtool import _native
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder

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
    idx = np.arange(len(ds))
    return peers.pil_rrc_rate(path, idx, random_windows(ds.index.width, ds.index.height, idx, 0, 0), procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per run (the first warms up)")
    ap.add_argument("--producers", default="4,6", help="producer-thread counts to try (the first is the headline)")
    ap.add_argument("--splits", default="auto,gpu", help="split modes to try (auto, gpu, cpu or a CPU share)")
    ap.add_argument("--hybrid", default="on,off", help="progressive/gray files to nvJPEG's hybrid decoder (on) "
                    "or the CPU path (off); both are tried")
    ap.add_argument("--cpu-threads", default="0", help="native threads of each producer's CPU share to try "
                    "(0: the Loader's default, every core; 'share': cores / producers)")
    ap.add_argument("--chroma", default="", help="GPU chroma upsampling modes to try, in this order (replicate, "
                    "interpolate, nvjpeg; a mode may repeat, for spread); default: the Loader's")
    ap.add_argument("--ceilings", action=argparse.BooleanOptionalAction, default=True,
                    help="bare NVJPG and CPU full-decode ceilings")
    ap.add_argument("--peer-images", type=int, default=4096)
    ap.add_argument("--dali", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--dali-files", default=None, help="also run DALI on this folder's original JPEG files")
    ap.add_argument("--peers", default="nvimgcodec,torchvision,pil", help="other peers to run")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ds = recordtool.open(a.packed)
    for i in range(len(ds)):
        bytes(ds[i][0])  # page cache warm
    cores = recordtool.decode.cpu.cores()
    r = {"images": len(ds), "cores": cores, "commit": os.environ.get("RECORDTOOL_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
    log(f"bench_gpu: {len(ds)} images, {np.mean(ds.index.jpeg_length) / 1e3:.0f} KB mean, {cores} cores")

    def sweep():
        runs = []
        for hy in a.hybrid.split(","):
            for sp in a.splits.split(","):
                sp = sp if sp in ("auto", "gpu", "cpu") else float(sp)
                for p, ct, ch in [(int(x), c, m or None) for x in a.producers.split(",") for c in a.cpu_threads.split(",")
                                  for m in (a.chroma.split(",") if a.chroma else [""])]:
                    ct = max(1, (cores - p) // p) if ct == "share" else int(ct)
                    res = recordtool_loader(ds, a.batch, a.epochs, p, split=sp, hybrid=hy == "on", cpu_threads=ct,
                                            chroma=ch)
                    log(f"  producers {p} cpu threads {res['cpu_threads']} split {sp} hybrid {hy} chroma {res['chroma']}: "
                        f"{res['img_s']:,.0f} img/s (best epoch "
                        f"{res['best_epoch_img_s']:,.0f}), {res['cores_busy']:.1f} cores busy, pool growth "
                        f"{res['pool_growth_bytes']} B, device growth {res['device_used_growth_bytes']} B, spills "
                        f"{res['ring_spills']}, stages ms/img {res['stage_ms_per_image']}, split {res.get('split')}")
                    runs.append(res)
        # the headline is the first configuration (the defaults), not the best of the sweep
        keys = ("producers", "cpu_threads", "split", "hybrid", "chroma", "img_s", "best_epoch_img_s", "cores_busy",
                "epochs_img_s")
        return dict(runs[0], sweep=[{k: x[k] for k in keys} for x in runs])

    steps = [("recordtool_loader", sweep)]
    if a.dali:
        steps.append(("dali", lambda: peers.dali_best(ds, "cuda", a.batch, cores, a.epochs)))
        if a.dali_files:
            steps.append(("dali_files", lambda: peers.dali_best(peers.jpeg_files(a.dali_files), "cuda", a.batch,
                                                                cores, a.epochs)))
    if a.ceilings:
        steps += [("nvjpg_full_decode_ceiling", lambda: nvjpg_ceiling(ds, a.batch, threads=4)),
                  ("cpu_full_decode_ceiling", lambda: cpu_ceiling(ds, cores))]
    want = a.peers.split(",")
    if "torchvision" in want:
        steps.append(("torchvision_gpu_peer", lambda: peers.torchvision_rate(ds, a.batch, a.peer_images)))
    if "nvimgcodec" in want:
        steps.append(("nvimgcodec_peer", lambda: peers.nvimgcodec_rate(ds, a.batch, a.peer_images)))
    if "pil" in want:
        steps.append(("pil_pool_peer", lambda: pil_peer(a.packed, ds, cores)))
    for name, fn in steps:
        t = time.perf_counter()
        try:
            r[name] = fn()
        except Exception as e:  # a missing peer is reported, not fatal
            r[name] = {"error": f"{type(e).__name__}: {e}"}
        log(f"{name}: {r[name]}  ({time.perf_counter() - t:.0f} s)")

    def val(x):
        if isinstance(x, dict):
            return x.get("img_s")
        return x[0] if isinstance(x, tuple) else x

    ours = val(r["recordtool_loader"])
    log("\n=== bench_gpu summary (img/s)")
    head = r["recordtool_loader"]
    dali = val(r.get("dali", {}))
    log(f"  recordtool Loader (defaults, fp16 NCHW 224, RRC+flip+normalize)  {ours or 0:>10,.0f}"
        + (f"   {ours / dali:.2f}x DALI" if ours and dali else ""))
    for x in head.get("sweep", [])[1:] if isinstance(head, dict) else []:
        log(f"    sweep: producers {x['producers']} cpu threads {x['cpu_threads']} split {x['split']} hybrid "
            f"{x['hybrid']} chroma {x['chroma']}{'':<4} {x['img_s']:>10,.0f}"
            + (f"   {x['img_s'] / dali:.2f}x DALI" if dali else ""))
    for k in ("dali", "dali_files", "torchvision_gpu_peer", "nvimgcodec_peer", "pil_pool_peer"):
        if k in r:
            v = val(r[k])
            extra = f"  (hw_decoder_load {r[k].get('hw_decoder_load')})" if k.startswith("dali") and v else ""
            log(f"  {k:<56} {v or 0:>10,.0f}{extra}")
    ceil = [val(r.get("nvjpg_full_decode_ceiling", {})), val(r.get("cpu_full_decode_ceiling", {}))]
    log(f"  ceiling: NVJPG full decode (hw subset, 4 submitters)         {ceil[0] or 0:>10,.0f}")
    log(f"  ceiling: CPU full decode (OpenCV), {cores} threads                 {ceil[1] or 0:>10,.0f}")
    if ours and all(ceil):
        log(f"  vs ceilings' sum {100 * ours / sum(ceil):.0f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1, default=str)


if __name__ == "__main__":
    main()
