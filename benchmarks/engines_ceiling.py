"""What the NVJPG engines decode per second with an ideal feed: the physical limit of the GPU path.

The dataset's engine-decodable records (plan.route == ENGINE: baseline YCbCr in the layouts the
engines take) are staged once in one pinned host buffer; then, with nothing else running, T
threads each drive their own nvJPEG hardware decoder (own handle state, own non-blocking
stream, own output) through nvjpegDecodeBatchedEx on batches of B consecutive records of that
set, round after round, and wait for each call's device work before the next. Whole images are
decoded (no region of interest: the engines decode every block either way), as interleaved RGB
(what DALI's mixed decoder asks of them) or as planar YCbCr; `yuv-roi` / `rgbi-roi`: the centred
region of 0.73 of each side (0.54 of the area, RandomResizedCrop's mean at scale (0.08, 1)),
its corner on the 16-pixel grid — planar YCbCr of a region is what the Loader asks of them.

Every (format, pipeline, threads, batch) cell reports img/s over all threads, and each call's
host time (until nvJPEG returns) and its time to the stream's completion (medians): whether the
call blocks the thread until the engines are done, and how many calls in flight keep them busy.

--dali-files DIR: DALI's own use of the engines beside the ceiling, on the original files: its
mixed decoder alone (fn.readers.file → fn.decoders.image, device="mixed", whole images, batch
512, hw_decoder_load 0.99 and 1.0, the host's cores as its threads), the best of 3 epochs after
one of warm-up.

Nothing here is the Loader: its rate beside this ceiling is `recordtool bench --device cuda` and
benchmarks/engines_beside_load.py on the same dataset, run in the same call.

Usage (GPU machine):
  python benchmarks/engines_ceiling.py PACKED [--threads 1,2,3,4,6] [--batch 128,256,512]
      [--seconds 1.5] [--formats rgbi,yuv,yuv-roi] [--pipeline off,on] [--vary N] [--trace DIR] [--json FILE]

--trace DIR: each cell recorded by torch's profiler, and the engines' calls found in the trace
(engines_beside_load.engine_calls): how long a call takes and how many run at once — the same
measure `engines_beside_load.py --trace` takes of the Loader's calls.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np


def engine_records(ds, limit: int):
    """Ids (up to `limit`), bytes of the records the engines take, in record order."""
    from recordtool.decode.gpu import route
    from recordtool.decode.gpu.plan import ENGINE

    ix = ds.index
    codes = route(ix.chroma, ix.progressive, ix.colorspace, pixels=ix.width.astype(np.int64) * ix.height)
    ids = np.nonzero(codes == ENGINE)[0][:limit]
    return ids, [bytes(b) for b in ds.jpeg_views(ids)]


class Staged:
    """All the JPEGs in one pinned host buffer (64-byte aligned each): the ideal feed, no copy
    and no page fault on the way to nvJPEG."""

    def __init__(self, cupy, blobs):
        sizes = np.array([len(b) for b in blobs], np.int64)
        spans = (sizes + 63) // 64 * 64
        offs = np.concatenate([[0], np.cumsum(spans)[:-1]])
        self.mem = cupy.cuda.alloc_pinned_memory(int(spans.sum()))
        host = np.frombuffer(self.mem, np.uint8, int(spans.sum()))
        for o, b in zip(offs.tolist(), blobs):
            host[o:o + len(b)] = np.frombuffer(b, np.uint8)
        self.ptrs = self.mem.ptr + offs
        self.lengths = sizes


def run_cell(cupy, staged, widths, heights, *, fmt: str, pipeline: bool, threads: int, batch: int,
             seconds: float, device: int, layout: int, vary: int = 0) -> dict:
    """T threads × their own decoder on batches of `batch` records for about `seconds`;
    `layout`: the records' largest chroma layout (decoder.largest_layout), what the decoders'
    buffers are pre-allocated for; `vary` > 0: each call takes batch − (13·k mod vary) records
    (call k), sizes that differ from call to call as the Loader's engine shares do."""
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder

    n = len(staged.lengths)
    planar = fmt.startswith("yuv")
    region = fmt.endswith("-roi")
    starts = list(range(0, n - batch + 1, batch)) or [0]
    batch = min(batch, n)
    # every batch's outputs laid out once: interleaved RGB (w·3 bytes a row) or Y + Cb + Cr at
    # full size (the engines write the chroma planes at their subsampled size, inside these)
    widths, heights = widths.astype(np.int64), heights.astype(np.int64)
    if region:  # (x, y, w, h) per record: centred, 0.73 of each side, the corner on the 16-pixel grid
        rw, rh = np.maximum(16, (widths * 0.73).astype(np.int64)), np.maximum(16, (heights * 0.73).astype(np.int64))
        rw, rh = np.minimum(rw, widths), np.minimum(rh, heights)
        rx, ry = (widths - rw) // 2 // 16 * 16, (heights - rh) // 2 // 16 * 16
        all_rois = np.stack([rx, ry, rw, rh], 1)
    else:
        rw, rh = widths, heights
        all_rois = np.tile(np.array([0, 0, -1, -1], np.int64), (len(widths), 1))
    # each plane starts on the arena's 256-byte grid, as the Loader places them (room.ALIGN): a
    # plane at an unaligned address costs nvJPEG a slower path, which is not the engines' limit
    from recordtool.decode.gpu.room import ALIGN

    plane = (rw * rh + ALIGN - 1) // ALIGN * ALIGN
    per = plane * 3
    room = max(int(per[s:s + batch].sum()) for s in starts)
    results = [None] * threads
    barrier = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(t: int):
        with cupy.cuda.Device(device):
            dec = HardwareDecoder(batch, planar=planar, pipeline=pipeline)
            # nvJPEG's buffers sized once, as the Loader's warm-up sizes them: grown in 16 MiB
            # steps and pre-allocated for the largest image, so no call allocates (a cudaFree
            # mid-run waits for the whole device, every thread's calls)
            dec.set_padding(16 << 20)
            dec.preallocate(batch, int(widths.max()), int(heights.max()), layout)
            stream = cupy.cuda.Stream(non_blocking=True)
            out = cupy.empty(room, cupy.uint8)
            layouts = []
            for s in starts:
                w, sz = rw[s:s + batch], plane[s:s + batch]
                offs = out.data.ptr + np.concatenate([[0], np.cumsum(sz * 3)[:-1]])
                if planar:
                    planes = np.stack([offs, offs + sz, offs + 2 * sz], 1)
                    layouts.append((planes, np.stack([w, w, w], 1)))
                else:
                    layouts.append((offs, w * 3))

            def size(k: int) -> int:  # call k's records: (vary) sizes that differ as the Loader's engine shares do
                return batch - (k * 13) % vary if vary else batch

            def call(k: int):
                s, m = starts[k % len(starts)], size(k)
                ptrs, lens = staged.ptrs[s:s + m], staged.lengths[s:s + m]
                a, b = (x[:m] for x in layouts[k % len(starts)])
                rois = all_rois[s:s + m]
                if planar:
                    dec.decode_planes(ptrs, lens, a, b, stream.ptr, rois)
                else:
                    dec.decode(ptrs, lens, rois, a, b, stream.ptr)

            for k in range(2):  # warm-up: the state's buffers sized, the engines awake
                call(k + t)
                stream.synchronize()
            host, done, images = [], [], 0
            barrier.wait()
            t0 = time.perf_counter()
            k = t
            while not stop.is_set():
                c0 = time.perf_counter()
                call(k)
                c1 = time.perf_counter()
                stream.synchronize()
                c2 = time.perf_counter()
                host.append(c1 - c0)
                done.append(c2 - c0)
                images += size(k)
                k += threads
            results[t] = (images, time.perf_counter() - t0, host, done)
            dec.close()

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for p in pool:
        p.start()
    barrier.wait()
    time.sleep(seconds)
    stop.set()
    for p in pool:
        p.join()
    images = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results)
    host = [x for r in results for x in r[2]]
    done = [x for r in results for x in r[3]]
    return {"format": fmt, "pipeline": pipeline, "threads": threads, "batch": batch, "images": images,
            "seconds": elapsed, "img_s": images / elapsed, "calls": len(host),
            "call_host_ms": 1e3 * statistics.median(host), "call_done_ms": 1e3 * statistics.median(done)}


def dali_decode_rate(folder: str, load: float, batch: int = 512, epochs: int = 4) -> dict:
    """DALI's mixed decoder on the folder's JPEG files, nothing after it: img/s of the best
    epoch after the first."""
    import os

    from nvidia.dali import fn, pipeline_def, types

    from recordtool.tools.peers import jpeg_files

    files = jpeg_files(folder)
    steps = len(files) // batch
    threads = len(os.sched_getaffinity(0))

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0, prefetch_queue_depth=2, seed=0)
    def pipe():
        jpegs, label = fn.readers.file(files=[p for p, _ in files], labels=[int(y) for _, y in files],
                                       random_shuffle=True)
        return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=load), label

    p = pipe()
    p.build()
    rates = []
    for e in range(epochs):
        t = time.perf_counter()
        for _ in range(steps):
            p.run()  # returns once the batch is decoded
        if e:
            rates.append(steps * batch / (time.perf_counter() - t))
    del p
    return {"hw_decoder_load": load, "img_s": max(rates), "epochs": rates, "threads": threads}


def run_traced(folder, name, run):
    """(run(), None) without a folder; with one, run() recorded by torch's profiler (CUDA
    activity) into folder/NAME.json.gz and the engines' calls found in the trace
    (engines_beside_load.engine_calls, warm-up calls included): (run(), those calls)."""
    if not folder:
        return run(), None
    import importlib.util
    import os

    from torch.profiler import ProfilerActivity, profile

    # the sibling script, by path (python -P leaves a script's own folder off sys.path)
    spec = importlib.util.spec_from_file_location(
        "engines_beside_load", os.path.join(os.path.dirname(os.path.abspath(__file__)), "engines_beside_load.py"))
    sibling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sibling)
    os.makedirs(folder, exist_ok=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = run()
    path = os.path.join(folder, f"{name}.json.gz")
    prof.export_chrome_trace(path)
    return out, sibling.engine_calls(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--threads", default="1,2,3,4,6")
    ap.add_argument("--batch", default="128,256,512")
    ap.add_argument("--formats", default="rgbi,yuv,yuv-roi", help="rgbi, yuv, rgbi-roi, yuv-roi")
    ap.add_argument("--pipeline", default="off,on")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--vary", type=int, default=0,
                    help="calls of batch - (13k mod VARY) records: sizes that change from call to call")
    ap.add_argument("--images", type=int, default=4096, help="engine-decodable records used at most")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--dali-files", help="also DALI's mixed decoder alone on this folder's files")
    ap.add_argument("--trace", metavar="DIR", help="record each cell with torch's profiler into DIR and find the "
                    "engines' calls in it (engines_beside_load.engine_calls): a probe; the profiler slows the run")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not 0 <= a.vary < min(int(x) for x in a.batch.split(",")):
        ap.error("--vary must be at least 0 and below every --batch (a call takes batch - (13k mod VARY) records)")

    import cupy

    import recordtool
    from recordtool.decode.gpu.decoder import largest_layout

    ds = recordtool.open(a.root)
    ids, blobs = engine_records(ds, a.images)
    with cupy.cuda.Device(a.device):
        staged = Staged(cupy, blobs)
    w, h = ds.index.width[ids], ds.index.height[ids]
    layout = largest_layout(ds.index.chroma[ids])
    print(f"{len(ids)} engine-decodable records of {len(ds)}: mean {staged.lengths.mean() / 1e3:.0f} KB, "
          f"mean {w.mean():.0f}x{h.mean():.0f}")
    rows = []
    print(f"{'format':>6} {'pipe':>4} {'thr':>3} {'batch':>5} {'img/s':>8} {'call host ms':>12} {'call done ms':>12}"
          + (f"  (calls of {a.batch} - (13k mod {a.vary}) records)" if a.vary else ""))
    for fmt in a.formats.split(","):
        for pipe in a.pipeline.split(","):
            for t in (int(x) for x in a.threads.split(",")):
                for b in (int(x) for x in a.batch.split(",")):
                    r, calls = run_traced(a.trace, f"{fmt}-{pipe}-t{t}-b{b}", lambda: run_cell(
                        cupy, staged, w, h, fmt=fmt, pipeline=pipe == "on", threads=t, batch=b,
                        seconds=a.seconds, device=a.device, layout=layout, vary=a.vary))
                    if a.trace:
                        r["engine_calls"] = calls
                        print(f"  engine calls: {json.dumps(calls)}", flush=True)
                    rows.append(r)
                    print(f"{fmt:>6} {pipe:>4} {t:>3} {b:>5} {r['img_s']:>8.0f} {r['call_host_ms']:>12.1f} "
                          f"{r['call_done_ms']:>12.1f}", flush=True)
    for fmt in a.formats.split(","):
        top = max((r for r in rows if r["format"] == fmt), key=lambda r: r["img_s"])
        print(f"{fmt}: {top['img_s']:.0f} img/s at best ({top['threads']} threads x batch {top['batch']})")
    best = max(rows, key=lambda r: r["img_s"])
    print(f"ceiling: {best['img_s']:.0f} img/s ({best['format']}, pipeline {best['pipeline']}, "
          f"{best['threads']} threads x batch {best['batch']})")
    dali = []
    if a.dali_files:
        for load in (0.99, 1.0):
            dali.append(dali_decode_rate(a.dali_files, load))
            print(f"DALI mixed decoder alone, hw_decoder_load {load}: {dali[-1]['img_s']:.0f} img/s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"records": len(ids), "mean_bytes": float(staged.lengths.mean()),
                       "mean_width": float(w.mean()), "mean_height": float(h.mean()), "rows": rows,
                       "ceiling": best, "dali": dali}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
