"""Where the NVJPG engines' rate goes beside a training model.

The Loader with every image on the engines (`split="gpu", same_pixels=False`) is timed alone and
beside loads that each share one resource with it, all in its process as a training script is:

  alone     nothing else runs
  model     an eager training loop (torchvision ARCH, synthetic batches) on the main thread: the
            GPU's SMs, the GIL and the cores, as in training
  model-sync  the same loop waiting for each step's GPU work (torch.cuda.synchronize): the GIL is
            free while the GPU works, so the GIL held by a host running ahead is taken out
  gpu       bf16 matrix products on a side stream, a few long kernels with an event wait between:
            the SMs busy, the GIL and the cores almost free
  gil       a pure-Python loop on a thread: the GIL and one core, the GPU free
  null-sleep  a one-thread spin kernel (torch.cuda._sleep) kept queued on CUDA's legacy default
            stream — where an eager PyTorch loop queues its kernels — by a thread: the SMs and
            cores almost idle, only that stream busy. The Loader's batches are taken on a side
            stream here (and in side-sleep), so its own hand-out and give-back events do not
            queue behind the spin kernels: any slowdown is a wait on the default stream itself
  side-sleep  the same kernels on a non-blocking side stream: the control for null-sleep
  model-side  the `model` loop queued on a non-blocking side stream instead of the default one

Each run reports the Loader's img/s (batches taken by the main thread or a consumer thread) and
its producers' mean seconds per batch in each stage (Loader.stage_seconds: `gpu.engines_native`
is nvJPEG's batched call without the GIL, `gpu.wait` the time the producer then waits for its CPU
share and the GPU), the load's own rate, and the Loader's device memory: the output ring, the
decoders' buffers and what nvidia-smi says the process holds.

--context green: the Loader's producers (their decoders, streams and nvJPEG handles) run in a
green context made of the whole device's SMs (cuGreenCtxCreate, with its own default stream)
instead of the primary context the loads and the consumer use: whether the engines' waits are
on work of their own context. A probe of the mechanism, not a mode of the library.

--pipeline: the Loader's hardware decoders made with nvJPEG's pipelining of batched calls
(HardwareDecoder(pipeline=True)), which the library turns off: what the engines waited for
beside other streams' work before. A probe, not a mode of the library.

--gate N: at most N engine calls at once in the process (a semaphore around HardwareDecoder's
batched calls): whether producers submitting together, then leaving the engines idle together,
is what holds the engines path under their ceiling. A probe, not a mode of the library.

--whole: the Loader's decoders decode whole images instead of each crop window's region of the
planes (GPUDecoder(planar_roi=False)): whether nvJPEG's per-plane copies of a region out of the
engines' output are what its call spends beside a model. A probe, not a mode of the library.

--trace DIR: the timed part of each load recorded by torch's profiler (CUPTI: the CUDA runtime and
driver calls of every thread, nvJPEG's among them, and every stream's kernels and copies), saved as
DIR/LOAD.json.gz, and summed up: the CUDA calls each thread (by the profiler's thread id) spent
most time in, the producers', the consumer's and the model's alike, and per stream its kernels',
copies' and memsets' time and how long they waited between the end of the call that queued them
and their start.
The engines' calls are found in the same trace (`engine_calls`: nvJPEG's per-image runtime calls
on a producer's thread): their length, their images, how many run at once over the run and the
img/s while k run, and how long a producer spends between its calls.
A probe of where nvJPEG's call waits; the profiler slows the run, so its rates are not the table's.

Usage (on a GPU machine, pinned to a node's share):
  taskset -c 0-3 python benchmarks/engines_beside_load.py PACKED --threads 4 --loads alone,model,gpu,gil
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time


def _cu_check(call, rc):
    if rc:
        raise RuntimeError(f"{call} failed with CUDA error {rc}")


def green_context(device: int = 0):
    """(libcuda, CUcontext) of a new green context over all of `device`'s SMs."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    _cu_check("cuInit", cu.cuInit(0))
    dev = ctypes.c_int()
    _cu_check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), device))
    res = (ctypes.c_ubyte * 4096)()  # a CUdevResource (smaller than this)
    _cu_check("cuDeviceGetDevResource", cu.cuDeviceGetDevResource(dev, res, 1))  # CU_DEV_RESOURCE_TYPE_SM
    desc, green, ctx = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    _cu_check("cuDevResourceGenerateDesc", cu.cuDevResourceGenerateDesc(ctypes.byref(desc), res, 1))
    _cu_check("cuGreenCtxCreate", cu.cuGreenCtxCreate(ctypes.byref(green), desc, dev, 1))  # DEFAULT_STREAM
    _cu_check("cuCtxFromGreenCtx", cu.cuCtxFromGreenCtx(ctypes.byref(ctx), green))
    return cu, ctx


def producers_in(cu, ctx, device: int = 0):
    """Make every producer thread the Loader starts from now on run with `ctx` current."""
    from recordtool.decode.gpu import nvjpeg
    from recordtool.loader import prefetch

    produce = prefetch._produce

    def in_context(*args, **kw):
        _cu_check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
        nvjpeg._thread.devices = {device}  # context_current: keep this context, not the primary one
        return produce(*args, **kw)

    prefetch._produce = in_context


def made_with(cls, **forced):
    """Make every `cls` made from now on get these keywords (a probe's one change to the library)."""
    init = cls.__init__

    def forcing(self, *args, **kw):
        init(self, *args, **{**kw, **forced})

    cls.__init__ = forcing


def engines_pipelined():
    """Make every HardwareDecoder made from now on pipeline its batched calls (nvJPEG's default)."""
    from recordtool.decode.gpu import nvjpeg

    made_with(nvjpeg.HardwareDecoder, pipeline=True)


def engines_gate(n: int):
    """At most n engine calls at once in this process: every HardwareDecoder's batched call
    (nvJPEG's hardware call returns when the engines are done) waits for one of n permits. Two
    producers that submit together share the engines for the whole call and then leave them idle
    together while they plan and finish; with one permit the engines take one call after the
    other, the next producer's batch ready when the last call ends."""
    from recordtool.decode.gpu import nvjpeg

    gate = threading.BoundedSemaphore(n)
    for name in ("decode_planes", "decode"):
        call = getattr(nvjpeg.HardwareDecoder, name)

        def gated(self, *args, _call=call, **kw):
            with gate:
                return _call(self, *args, **kw)

        setattr(nvjpeg.HardwareDecoder, name, gated)


def whole_images():
    """Make every GPUDecoder made from now on decode whole images (planar_roi=False)."""
    from recordtool.decode.gpu import decoder

    made_with(decoder.GPUDecoder, planar_roi=False)


def loader(packed, batch, threads, size, options):
    from recordtool import Loader

    kw = dict(batch_size=batch, size=size, device="cuda", dtype="float16", as_torch=True, threads=threads,
              split="gpu", same_pixels=False)
    kw.update(options)
    return Loader(packed, **kw)


def endless(ld):
    while True:
        yield from ld


class Side(threading.Thread):
    """A load on a thread until `stop`; `count` its units of work."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.stop, self.count, self.error = fn, threading.Event(), 0, None

    def run(self):
        try:
            self.fn(self)
        except BaseException as e:  # reported: a run whose load failed is no measurement
            self.error = e


def gpu_load(side):
    import torch

    s = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(s):
        while not side.stop.is_set():
            for _ in range(4):
                b = a @ a
            ev = torch.cuda.Event()
            ev.record(s)
            ev.synchronize()
            side.count += 4
    del b


def sleep_load(side, on_side_stream):
    """Keep ~0.1 s of spin kernels queued on the legacy default stream (or a side stream)."""
    import torch

    s = torch.cuda.Stream() if on_side_stream else None
    with torch.cuda.stream(s) if s is not None else contextlib.nullcontext():
        while not side.stop.is_set():
            for _ in range(4):
                torch.cuda._sleep(50_000_000)  # one thread spinning ~25 ms
            ev = torch.cuda.Event()
            ev.record()
            ev.synchronize()
            side.count += 4


def gil_load(side):
    while not side.stop.is_set():
        x = 0
        for i in range(20000):
            x += i
        side.count += 1


def consume(it, stop, counter, stream=None):
    import torch

    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        while not stop.is_set():
            next(it)
            counter[0] += 1


def trace_events(trace) -> list:
    """The complete ('X') events of a Chrome trace of torch's profiler: `trace` a .json.gz path,
    or the list this returned (a trace is read once for every summary of it)."""
    if isinstance(trace, list):
        return trace
    import gzip

    with gzip.open(trace, "rt") as f:
        return [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]


def trace_summary(path, top=25):
    """What a Chrome trace of torch's profiler (a path or `trace_events`' list) says about the
    waits: {calls, streams}. calls: the
    `top` (thread id, call) pairs by time spent, runtime and driver calls alike; streams: per
    stream id its GPU work, each piece's wait from the end of the host call that queued it (the
    same correlation id) to its start, 0 where it started before that call returned."""
    import collections

    events = trace_events(path)
    launches = {}  # correlation id -> end of the host call that launched it (us)
    calls = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                launches[corr] = e["ts"] + e.get("dur", 0)
            c = calls[(e.get("tid"), e.get("cat"), e["name"])]
            c[0] += 1
            c[1] += e.get("dur", 0) / 1e3
            c[2] = max(c[2], e.get("dur", 0) / 1e3)
    streams = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0]))
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            a = e.get("args", {})
            k = streams[a.get("stream", -1)][e["name"][:60]]
            k[0] += 1
            k[1] += e.get("dur", 0) / 1e3
            corr = a.get("correlation")
            if corr in launches:
                lag = max(0.0, (e["ts"] - launches[corr]) / 1e3)
                k[2] += lag
                k[3] = max(k[3], lag)
    out_calls = [{"tid": t, "api": n, "cat": c, "count": v[0], "total_ms": round(v[1], 1), "max_ms": round(v[2], 2)}
                 for (t, c, n), v in sorted(calls.items(), key=lambda kv: -kv[1][1])[:top]]
    out_streams = {}
    for sid, ks in streams.items():
        n = sum(v[0] for v in ks.values())
        out_streams[str(sid)] = {
            "ops": n, "busy_ms": round(sum(v[1] for v in ks.values()), 1),
            "lag_ms_mean": round(sum(v[2] for v in ks.values()) / max(1, n), 3),
            "top": [{"name": name, "count": v[0], "ms": round(v[1], 1), "lag_mean_ms": round(v[2] / max(1, v[0]), 3),
                     "lag_max_ms": round(v[3], 2)} for name, v in sorted(ks.items(), key=lambda kv: -kv[1][1])[:6]]}
    return {"calls": out_calls, "streams": out_streams}


NVJPEG_PER_IMAGE = ("cudaMemcpyAsync", "cudaEventRecord", "cudaEventSynchronize", "cudaMemcpy2DAsync")


def engine_calls(path, gap_ms=1.0, min_copies=8, step_ms=0.1):
    """The engines' calls in a Chrome trace of torch's profiler (a path or `trace_events`' list),
    found on the host side: nvJPEG's
    hardware batched call is a loop on the calling thread of runtime calls per image (the
    bitstream's copy, an event, a wait on it, a copy per plane). A call is a run of those four
    calls on one thread without a host gap over `gap_ms` and with at least `min_copies`
    cudaMemcpy2DAsync; its images are its cudaMemcpyAsync. Returns {calls, images, span_s, img_s,
    call_ms (median), images_per_call (median), in_flight: {k: fraction of the span with k calls
    running}, rate_in_flight: {k: img/s while k run}, idle_between_ms (median host time of a
    thread between its calls)}, the span from the first call's start to the last one's end;
    each call's images counted evenly over its duration. None without such calls."""
    import collections

    threads = collections.defaultdict(list)
    for e in trace_events(path):
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            threads[e.get("tid")].append(e)
    calls = []  # (thread, start us, end us, images)

    def close(tid, run, end):
        if sum(x["name"] == "cudaMemcpy2DAsync" for x in run) >= min_copies:
            calls.append((tid, run[0]["ts"], end, sum(x["name"] == "cudaMemcpyAsync" for x in run)))

    for tid, es in threads.items():
        es.sort(key=lambda e: e["ts"])
        run, end = [], None
        for e in es:
            if run and (e["name"] not in NVJPEG_PER_IMAGE or e["ts"] - end > gap_ms * 1e3):
                close(tid, run, end)  # another call, or a gap, ends the run
                run = []
            if e["name"] in NVJPEG_PER_IMAGE:
                run.append(e)
            end = e["ts"] + e.get("dur", 0)
        if run:
            close(tid, run, end)
    if not calls:
        return None
    import numpy as np

    t0, t1 = min(c[1] for c in calls), max(c[2] for c in calls)
    grid = np.arange(t0, t1, step_ms * 1e3)
    running = np.zeros(len(grid), np.int64)
    images_at = np.zeros(len(grid))
    for _, a, b, n in calls:
        i, j = np.searchsorted(grid, a), np.searchsorted(grid, b)
        running[i:j] += 1
        if j > i:
            images_at[i:j] += n / (j - i)
    span = (t1 - t0) / 1e6
    images = sum(c[3] for c in calls)
    gaps = []
    by_thread = collections.defaultdict(list)
    for tid, a, b, _ in calls:
        by_thread[tid].append((a, b))
    for cs in by_thread.values():
        cs.sort()
        gaps += [(cs[k + 1][0] - cs[k][1]) / 1e3 for k in range(len(cs) - 1)]
    in_flight, rate = {}, {}
    for k in range(int(running.max()) + 1):
        sel = running == k
        in_flight[k] = round(float(sel.mean()), 3)
        if sel.any():
            rate[k] = round(float(images_at[sel].sum() / (sel.sum() * step_ms / 1e3)))
    return {"calls": len(calls), "threads": len(by_thread), "images": images, "span_s": round(span, 3),
            "img_s": round(images / span) if span else None,
            "call_ms": round(float(np.median([(b - a) / 1e3 for _, a, b, _ in calls])), 2),
            "images_per_call": float(np.median([c[3] for c in calls])),
            "in_flight": in_flight, "rate_in_flight": rate,
            "idle_between_ms": round(float(np.median(gaps)), 2) if gaps else None}


def run_one(args, load):
    import torch

    from recordtool.tools.train_step import gpu_used_mib, make_model, train_step

    ld = loader(args.packed, args.batch, args.threads, args.size, json.loads(args.options))
    it = endless(ld)
    next(it)  # the decoders made and warmed up
    for _ in range(args.warmup):
        next(it)
    model = opt = x = y = None
    if load in ("model", "model-sync", "model-side"):
        model, opt = make_model(args.arch, torch.device("cuda"), False)
        x = torch.randn(args.model_batch, 3, args.model_size, args.model_size, device="cuda").half()
        x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (args.model_batch,), device="cuda")
        for _ in range(3):
            train_step(model, opt, x, y)
        torch.cuda.synchronize()
    loads = {"gpu": gpu_load, "gil": gil_load, "null-sleep": lambda sd: sleep_load(sd, False),
             "side-sleep": lambda sd: sleep_load(sd, True)}
    side = Side(loads[load]) if load in loads else None
    if side is not None:
        side.start()
        time.sleep(0.5)
    prof = None
    if args.trace:
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
    ld.stage_seconds.clear()
    decoded0 = dict(ld.decoded)
    stop, taken = threading.Event(), [0]
    consumer = None
    steps = 0
    t0 = time.perf_counter()
    c0 = side.count if side is not None else 0
    if model is not None:  # the Loader's batches taken on a thread, the model on the main one
        consumer = threading.Thread(target=consume, args=(it, stop, taken), daemon=True)
        consumer.start()
        model_stream = torch.cuda.Stream() if load == "model-side" else torch.cuda.current_stream()
        with torch.cuda.stream(model_stream):
            while time.perf_counter() - t0 < args.seconds:
                train_step(model, opt, x, y)
                if load == "model-sync":
                    torch.cuda.synchronize()
                steps += 1
        torch.cuda.synchronize()
    elif load in ("null-sleep", "side-sleep"):  # batches taken on a side stream (see the module)
        consumer = threading.Thread(target=consume, args=(it, stop, taken, torch.cuda.Stream()), daemon=True)
        consumer.start()
        while time.perf_counter() - t0 < args.seconds:
            time.sleep(0.05)
    else:
        while time.perf_counter() - t0 < args.seconds:
            next(it)
            taken[0] += 1
    dt = time.perf_counter() - t0
    stop.set()
    if prof is not None:
        prof.__exit__(None, None, None)
    load_rate = None
    if side is not None:
        load_rate = (side.count - c0) / dt
    if consumer is not None:
        consumer.join(timeout=30)
    n = max(1, sum(ld.decoded.get(k, 0) - decoded0.get(k, 0) for k in ("gpu", "hybrid", "cpu")) / args.batch)
    stages = {k: round(v / n * 1e3, 2) for k, v in sorted(ld.stage_seconds.items()) if v}
    mem = gpu_used_mib("cuda")
    ring = ld.backend.ring
    buffers = {}
    for slot, dec in ld.backend._decoders.items():
        b = dec.buf
        buffers[slot] = {"arena_mib": round((b.arena.nbytes if b.arena is not None else 0) / 2**20, 1),
                         "staging_mib": round((b.staging_np.size if b.staging_np is not None else 0) / 2**20, 1)}
    import cupy

    pool = cupy.get_default_memory_pool()
    ix = ld.ds.index
    out = {"max_image": [int(ix.width.max()), int(ix.height.max())], "producers": ld.producers,
           "slots": ring.slots, "load": load, "threads": args.threads, "img_s": round(taken[0] * args.batch / dt),
           "model_img_s": round(steps * args.model_batch / dt) if model is not None else None,
           "load_rate": load_rate and round(load_rate, 1), "stages_ms_per_batch": stages,
           "decoded": {k: ld.decoded.get(k, 0) - decoded0.get(k, 0) for k in ("gpu", "hybrid", "cpu")},
           "process_mib": mem, "cupy_pool_mib": round(pool.total_bytes() / 2**20),
           "cupy_used_mib": round(pool.used_bytes() / 2**20),
           "torch_reserved_mib": round(torch.cuda.memory_reserved() / 2**20),
           "ring_mib": round(ring.nbytes * ring.slots / 2**20),
           "decoder_buffers": buffers}
    if prof is not None:
        os.makedirs(args.trace, exist_ok=True)
        path = os.path.join(args.trace, f"{load}.json.gz")
        prof.export_chrome_trace(path)
        events = trace_events(path)
        out["trace"] = trace_summary(events)
        out["engine_calls"] = engine_calls(events)
    if side is not None:
        side.stop.set()
        side.join(timeout=30)
        if side.error:
            out["load_error"] = repr(side.error)
    ld.close()
    del model, opt, x, y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pool.free_all_blocks()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packed")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--model-batch", type=int, default=256)
    ap.add_argument("--model-size", type=int, default=224)
    ap.add_argument("--loads", default="alone,model,model-sync,gpu,gil")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--options", default="{}", help="the Loader's keywords beside split/same_pixels, as JSON")
    ap.add_argument("--context", choices=("primary", "green"), default="primary",
                    help="where the producers' CUDA work runs (see the module)")
    ap.add_argument("--pipeline", action="store_true",
                    help="the engines' batched calls with nvJPEG's pipelining (see the module)")
    ap.add_argument("--gate", type=int, default=0, help="at most N engine calls at once in the process (a probe)")
    ap.add_argument("--whole", action="store_true", help="decode whole images, not regions (see the module)")
    ap.add_argument("--trace", metavar="DIR", help="record each load's timed part with torch's profiler (see the module)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.gate < 0:
        ap.error("--gate must be 0 (no gate) or a number of calls")
    import torch

    from recordtool.tools.train_step import gpu_used_mib

    torch.backends.cudnn.benchmark = True
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context made current first (cuGreenCtxCreate asks it)
    if args.context == "green":
        producers_in(*green_context())
    if args.pipeline:
        engines_pipelined()
    if args.gate:
        engines_gate(args.gate)
    if args.whole:
        whole_images()
    base = gpu_used_mib("cuda")
    results = []
    for load in args.loads.split(","):
        r = run_one(args, load)
        r["context_mib"], r["context"], r["pipeline"] = base, args.context, args.pipeline
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
