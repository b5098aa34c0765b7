"""Which CUDA streams share a hardware work queue: a probe of the driver's stream-to-queue
mapping (CUDA_DEVICE_MAX_CONNECTIONS queues, default 8).

Two streams share a queue when work on one waits behind unrelated work queued earlier on the
other (a false dependency): the probe queues spin(2 ms), event A, spin(2 ms) on stream C, then
an empty kernel and event B on stream S; B completes before A when S has a queue of its own
and only after A when S's work sat behind C's second spin.

Prints, for streams made in order (high priority first, then default priority), the probe's
ms against the legacy default stream, the groups of streams that wait on each other, and the
matrix. --under-load instead times single operations on a fresh stream alone and beside spin
kernels queued on a side stream: an empty kernel, a pinned upload and one nvJPEG hardware batch
(recordtool's binding; needs the engines). Needs CuPy and a GPU; results: BENCHMARKS.md.

  python benchmarks/stream_queues.py [--high 10 --low 6]
  CUDA_DEVICE_MAX_CONNECTIONS=32 python benchmarks/stream_queues.py --under-load
"""
from __future__ import annotations

import argparse
import json

import numpy as np

_SPIN_SRC = r'''
extern "C" __global__ void spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}'''
cp = SPIN = NOP = decoder_stream = Waiter = None  # loaded by _load (--help needs none of them)


def _load() -> None:
    global cp, SPIN, NOP, decoder_stream, Waiter
    import cupy

    # the decoders' own stream and wait (decode.gpu.decoder): the probe measures what they use
    from recordtool.decode.gpu.decoder import _stream as decoder_stream, _Waiter as Waiter

    cp = cupy
    SPIN = cupy.RawKernel(_SPIN_SRC, "spin")
    NOP = cupy.RawKernel(r'''extern "C" __global__ void nop() {}''', "nop")


def shares_queue(c, s, ns: int = 2_000_000) -> float:
    """ms from event A (after C's first spin) to event B (after S's empty kernel): about
    -ns/1e6 when S runs at once, >= 0 when S waited behind C's queued work."""
    a, b = cp.cuda.Event(), cp.cuda.Event()
    SPIN((1,), (1,), (np.int64(ns),), stream=c)
    a.record(c)
    SPIN((1,), (1,), (np.int64(ns),), stream=c)
    NOP((1,), (1,), (), stream=s)
    b.record(s)
    b.synchronize()
    c.synchronize()
    return cp.cuda.get_elapsed_time(a, b)


def under_load(reps: int, batch: int) -> dict:
    """Median ms of single operations on a fresh decoder stream (decode.gpu.decoder._stream), alone and
    while a thread keeps 4 x 25 ms of one-thread spin kernels queued on a side stream (no SM
    load): an empty kernel, a 4 MiB pinned upload, one nvJPEG hardware batch (the call's own
    time and until its stream is done)."""
    import io
    import statistics
    import threading
    import time

    from PIL import Image

    from recordtool.decode.gpu.nvjpeg import HardwareDecoder

    rng = np.random.default_rng(0)
    jpegs = []
    for k in range(batch):
        a = rng.integers(0, 255, (375 // 8, 500 // 8, 3), dtype=np.uint8)
        im = Image.fromarray(a).resize((500, 375), Image.BILINEAR)
        b = io.BytesIO()
        im.save(b, "JPEG", quality=90)
        jpegs.append(np.frombuffer(b.getvalue(), np.uint8).copy())
    host = [cp.cuda.alloc_pinned_memory(len(j)) for j in jpegs]
    for h, j in zip(host, jpegs):
        np.frombuffer(h, np.uint8, len(j))[:] = j
    ptrs = np.array([h.ptr for h in host], np.int64)
    lens = np.array([len(j) for j in jpegs], np.int64)
    rois = np.tile(np.array([0, 0, 500, 375], np.int64), (batch, 1))
    dst = cp.empty((batch, 375, 500 * 3), cp.uint8)
    dptrs = np.array([dst[k].data.ptr for k in range(batch)], np.int64)
    pitches = np.full(batch, 1500, np.int64)
    hw = HardwareDecoder(batch)
    s = decoder_stream(cp)
    pin = cp.cuda.alloc_pinned_memory(4 << 20)
    dev = cp.empty(4 << 20, cp.uint8)
    done = Waiter(cp)

    def ops():
        t = {}
        t0 = time.perf_counter(); NOP((1,), (1,), (), stream=s); done(s)
        t["nop"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, pin.ptr, 4 << 20, 1, s.ptr); done(s)
        t["h2d"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        hw.decode(ptrs, lens, rois, dptrs, pitches, s.ptr)
        t["nvjpeg_call"] = time.perf_counter() - t0
        done(s)
        t["nvjpeg_done"] = time.perf_counter() - t0
        return t

    def run(n):
        rows = [ops() for _ in range(n)]
        return {k: round(1e3 * statistics.median(r[k] for r in rows), 2) for k in rows[0]}

    run(3)
    out = {"alone": run(reps)}
    stop = threading.Event()
    side = cp.cuda.Stream(non_blocking=True)

    def load():
        with cp.cuda.Device(0):
            while not stop.is_set():
                for _ in range(4):
                    SPIN((1,), (1,), (np.int64(25_000_000),), stream=side)
                side.synchronize()

    th = threading.Thread(target=load, daemon=True)
    th.start()
    time.sleep(0.2)
    out["beside_spin"] = run(reps)
    stop.set()
    th.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--high", type=int, default=10, help="decoder streams (highest priority, non-blocking) made first")
    ap.add_argument("--low", type=int, default=6, help="default-priority non-blocking streams made next")
    ap.add_argument("--under-load", action="store_true",
                    help="time single operations alone and beside queued spin kernels instead")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    _load()
    if args.under_load:
        print(json.dumps(under_load(args.reps, args.batch)))
        return
    cp.cuda.runtime.free(0)
    null = cp.cuda.Stream.null
    SPIN((1,), (1,), (np.int64(1000),), stream=null)
    NOP((1,), (1,), (), stream=null)
    null.synchronize()
    streams = [("high", decoder_stream(cp)) for _ in range(args.high)]
    streams += [("low", cp.cuda.Stream(non_blocking=True)) for _ in range(args.low)]
    vs_null = [round(shares_queue(null, s), 2) for _, s in streams]
    n = len(streams)
    matrix = [[round(shares_queue(streams[i][1], streams[j][1]), 1) if i != j else None for j in range(n)]
              for i in range(n)]
    # group: streams whose mutual probe shows waiting
    groups, seen = [], set()
    for i in range(n):
        if i in seen:
            continue
        g = [j for j in range(n) if j == i or (matrix[i][j] is not None and matrix[i][j] > -1.0)]
        seen.update(g)
        groups.append(g)
    print(json.dumps({"kinds": [k for k, _ in streams],
                      "vs_legacy_default_ms": vs_null, "groups": groups}, indent=1))
    for row in matrix:
        print(" ".join("  .  " if v is None else f"{v:5.1f}" for v in row))


if __name__ == "__main__":
    main()
