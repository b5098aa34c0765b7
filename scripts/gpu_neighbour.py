"""Where the GPU Loader's producers lose time beside a busy GPU: the Loader consumed alone and
beside a thread that keeps ~`--queue-ms` of bf16 matmuls queued on the GPU (as an eager training
loop keeps its steps queued ahead of the device) — on torch's default stream (what a training
loop uses: CUDA's legacy default stream) or on a stream of its own — or that trains ResNet-50
on one batch (`train`, or `train:ARCH`).

A producer's stage that grows with the load only when the load is on the default stream waits
for the legacy stream (an implicit synchronisation with all the training's queued work); one
that grows with either waits for the SMs or for the device as a whole.

    python scripts/gpu_neighbour.py PACKED --variant "" --variant chroma=replicate \
        --loads none default side train --json OUT.json [--micro] [--trace TRACE_DIR]

--trace profiles one variant beside the default-stream load with torch.profiler and prints the
CUDA runtime / driver calls made off the main thread, longest first.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from recordtool import Loader  # noqa: E402
from recordtool.tools.train_pipelines import endless, parse_options  # noqa: E402


class TrainLoad:
    """A thread training torchvision's `arch` on one synthetic batch (bf16 autocast,
    channels_last, SGD, no synchronisation: the host runs ahead as an eager loop does)."""

    def __init__(self, arch: str = "resnet50", batch: int = 256, size: int = 224):
        import torch

        from recordtool.tools.train_step import make_model, train_step

        self.torch, self._train_step = torch, train_step
        self.model, self.opt = make_model(arch, torch.device("cuda", 0), False)
        self.x = torch.randn(batch, 3, size, size, device="cuda").half().contiguous(memory_format=torch.channels_last)
        self.y = torch.randint(0, 1000, (batch,), device="cuda")
        for _ in range(3):
            self._step()
        torch.cuda.synchronize()
        self.stop, self.launched, self.ms, self.depth = threading.Event(), 0, 0.0, 0
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.thread.start()

    def _step(self):
        self._train_step(self.model, self.opt, self.x, self.y)

    def _run(self):
        while not self.stop.is_set():
            self._step()
            self.launched += 1

    def close(self):
        self.stop.set()
        self.thread.join()
        self.torch.cuda.synchronize()


def make_load(kind: str, queue_ms: float):
    if kind == "none":
        return None
    if kind.startswith("train"):  # train or train:ARCH
        return TrainLoad(kind.partition(":")[2] or "resnet50")
    return Load(kind, queue_ms)


class Load:
    """A thread keeping about `queue_ms` of matmuls queued on `stream` ("default" or "side")."""

    def __init__(self, stream: str, queue_ms: float):
        import torch

        self.torch, self.kind = torch, stream
        self.a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.default_stream() if stream == "default" else torch.cuda.Stream()
        with torch.cuda.stream(self.stream):
            for _ in range(3):
                self.a @ self.b
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(20):
                self.a @ self.b
            torch.cuda.synchronize()
        self.ms = (time.perf_counter() - t) / 20 * 1e3  # one matmul alone
        self.depth = max(2, int(queue_ms / self.ms))
        self.stop, self.launched = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.thread.start()

    def _run(self):
        torch = self.torch
        events = collections.deque()
        with torch.cuda.stream(self.stream):
            while not self.stop.is_set():
                self.a @ self.b
                ev = torch.cuda.Event()
                ev.record(self.stream)
                events.append(ev)
                self.launched += 1
                if len(events) > self.depth:
                    events.popleft().synchronize()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.torch.cuda.synchronize()


def measure(packed: str, spec: str, load: str, batches: int, warmup: int, batch: int, size: int,
            queue_ms: float) -> dict:
    """The Loader of variant `spec` consumed for `batches` batches beside `load` (none, default,
    side, train[:ARCH]): img/s and the producers' stage ms per batch."""
    opts = parse_options(spec)
    return _measure(packed, opts, spec, load, batches, warmup, batch, size, queue_ms)


def _measure(packed, opts, spec, load, batches, warmup, batch, size, queue_ms) -> dict:
    import torch

    ld = Loader(packed, batch_size=batch, size=size, device="cuda", dtype="float16", as_torch=True, **opts)
    it = endless(ld)
    ld_load = None
    try:
        ld_load = make_load(load, queue_ms)
        for _ in range(warmup):
            next(it)
        ld.stage_seconds.clear()
        n0 = ld_load.launched if ld_load else 0
        t = time.perf_counter()
        for _ in range(batches):
            x, _ = next(it)
            del x
        dt = time.perf_counter() - t
        stages = {k: round(1e3 * v / batches, 2) for k, v in ld.stage_seconds.items()}
        out = {"variant": spec or "default", "load": load, "img_s": round(batches * batch / dt),
               "stage_ms_per_batch": stages}
        if ld_load:
            out["load_matmul_ms"] = round(ld_load.ms, 3)
            out["load_depth"] = ld_load.depth
            out["load_steps_s"] = round((ld_load.launched - n0) / dt, 2)  # matmuls or training steps
            if ld_load.ms:  # the matmul load: the share of the GPU it kept busy, roughly
                out["load_busy"] = round((ld_load.launched - n0) * ld_load.ms / 1e3 / dt, 3)
        return out
    finally:
        if ld_load:
            ld_load.close()
        ld.close()
        torch.cuda.synchronize()


def trace(packed: str, spec: str, batch: int, size: int, queue_ms: float, outdir: str, top: int = 30,
          trace_load: str = "default") -> list:
    """torch.profiler over a few batches beside the default-stream load: the CUDA calls made
    off the main thread (the producers), by total time."""
    opts = parse_options(spec)
    path = _trace(packed, opts, batch, size, queue_ms, outdir, trace_load)
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    return _calls(events, top)


def _trace(packed, opts, batch, size, queue_ms, outdir, trace_load) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ld = Loader(packed, batch_size=batch, size=size, device="cuda", dtype="float16", as_torch=True, **opts)
    it = endless(ld)
    lo = make_load(trace_load, queue_ms)
    try:
        for _ in range(6):
            next(it)
        kw = {}
        try:
            kw["experimental_config"] = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        except Exception:
            pass
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], **kw) as prof:
            for _ in range(8):
                next(it)
        os.makedirs(outdir, exist_ok=True)
        path = os.path.join(outdir, "trace.json")
        prof.export_chrome_trace(path)
    finally:
        lo.close()
        ld.close()
    return path


def _calls(events, top: int) -> list:
    """The trace's CUDA calls made off the main thread (the producers) and the device work, by total time."""
    main_tid = threading.main_thread().native_id
    agg: dict = {}
    for e in events:
        cat = str(e.get("cat", ""))
        if e.get("ph") != "X" or not any(c in cat for c in ("cuda_runtime", "cuda_driver", "cuda_sync", "gpu_memcpy",
                                                            "gpu_memset", "kernel")):
            continue
        tid = e.get("tid")
        if "cuda_r" in cat or "cuda_d" in cat:
            if tid == main_tid:
                continue
        key = (cat, e.get("name", "?"), str(e.get("args", {}).get("stream", "")) if "gpu" in cat or "kernel" in cat else "")
        a = agg.setdefault(key, [0, 0.0])
        a[0] += 1
        a[1] += float(e.get("dur", 0.0)) / 1e3
    rows = sorted(([c, n, s, k, round(ms, 2)] for (c, n, s), (k, ms) in agg.items()), key=lambda r: -r[4])
    return rows[:top]


def micro(packed: str, batch: int, queue_ms: float, loads=("none", "default", "side"), sizes=(256,),
          parallel=(1,), calls: int = 12, outputs=("rgbi",)) -> list:
    """The engines' batched decode alone (HardwareDecoder.decode, whole images of engine-
    decodable records staged in pinned memory), timed per call beside each load: `sizes`
    images a call, and `parallel` threads each with its own decoder and stream calling at
    once (the rate is all threads' images over the wall time). outputs: "rgbi" (interleaved
    RGB, as chroma="replicate" decodes), "planes" (whole YUV planes, as chroma="interpolate"
    with planar_roi=False) and "planes_roi" (the YUV planes of each image's
    centre quarter)."""
    import concurrent.futures as cf

    import cupy
    import numpy as np

    import recordtool
    from recordtool.decode.gpu.plan import ENGINE, route
    from recordtool.decode.gpu.nvjpeg import HardwareDecoder

    ds = recordtool.open(packed)
    c = ds.index.columns
    ids = np.nonzero(route(c["chroma"], c["progressive"], c["colorspace"]) == ENGINE)[0][:batch]
    bufs = ds.jpeg_views(ids)
    lens = np.array([len(b) for b in bufs], np.int64)
    w, h = c["width"][ids].astype(np.int64), c["height"][ids].astype(np.int64)
    offs = np.concatenate([[0], np.cumsum((lens + 63) // 64 * 64)])
    stage = cupy.cuda.alloc_pinned_memory(int(offs[-1]))
    arr = np.frombuffer(stage, np.uint8, int(offs[-1]))
    for o, b in zip(offs, bufs):
        arr[o:o + len(b)] = np.frombuffer(b, np.uint8)
    hp = stage.ptr + offs[:-1]
    rois = np.stack([np.zeros_like(w), np.zeros_like(w), w, h], 1)
    nbytes = w * h * 3
    workers = max(parallel)
    dsts = [cupy.cuda.alloc(int(nbytes.sum())) for _ in range(workers)]
    dptrs = [d.ptr + np.concatenate([[0], np.cumsum(nbytes)[:-1]]) for d in dsts]
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(workers)]
    decs = {}
    for out in outputs:
        decs[out] = []
        for _ in range(workers):
            hw = HardwareDecoder(len(ids), planar=out != "rgbi")
            hw.preallocate(len(ids), int(w.max()), int(h.max()), 0)
            hw.set_padding(16 << 20)
            decs[out].append(hw)
    planes = None
    if any(o != "rgbi" for o in outputs):  # Y, Cb, Cr planes of each whole image (or of its centre quarter)
        info = decs[[o for o in outputs if o != "rgbi"][0]][0].image_infos(hp, lens)
        yw, yh = np.maximum(info[:, 3], w), np.maximum(info[:, 4], h)
        cw, ch = np.maximum(info[:, 5], 1), np.maximum(info[:, 6], 1)
        sizes_b = yw * yh + 2 * cw * ch
        pmem = [cupy.cuda.alloc(int(sizes_b.sum())) for _ in range(workers)]
        base = np.concatenate([[0], np.cumsum(sizes_b)[:-1]])
        planes = [np.stack([m.ptr + base, m.ptr + base + yw * yh, m.ptr + base + yw * yh + cw * ch], 1) for m in pmem]
        ppitch = np.stack([yw, cw, cw], 1)
        qrois = np.stack([(cw // 4) // 2 * 2, (ch // 4) // 2 * 2, (cw // 2) // 2 * 2, (ch // 2) // 2 * 2], 1)
    pool = cf.ThreadPoolExecutor(workers)

    def one(out, j, n):
        t = time.perf_counter()
        hw = decs[out][j]
        if out == "rgbi":
            hw.decode(hp[:n], lens[:n], rois[:n], dptrs[j][:n], w[:n] * 3, streams[j].ptr)
        else:
            hw.decode_planes(hp[:n], lens[:n], planes[j][:n], ppitch[:n], streams[j].ptr,
                             rois=None if out == "planes" else qrois[:n])
        streams[j].synchronize()
        return time.perf_counter() - t, hw.last_native_seconds or 0.0

    rows = []
    for load in loads:
        lo = make_load(load, queue_ms)
        try:
            for out, k, n in [(o, k, min(n, len(ids))) for o in outputs for k in parallel for n in sizes]:
                times, native, walls = [], [], []
                for it in range(calls + 2):
                    t = time.perf_counter()
                    res = list(pool.map(lambda j: one(out, j, n), range(k)))
                    if it >= 2:
                        walls.append(time.perf_counter() - t)
                        times += [r[0] for r in res]
                        native += [r[1] for r in res]
                rows.append({"load": load, "output": out, "threads": k, "n": n,
                             "ms_per_call": round(1e3 * float(np.median(times)), 2), "ms_max": round(1e3 * max(times), 2),
                             "native_ms": round(1e3 * float(np.median(native)), 2),
                             "img_s": round(k * n * len(walls) / sum(walls))})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            if lo:
                lo.close()
    pool.shutdown()
    for ds_ in decs.values():
        for hw in ds_:
            hw.close()
    return rows

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("packed")
    p.add_argument("--variant", action="append", default=None, help="Loader options k=v,… ('' = defaults)")
    p.add_argument("--loads", nargs="+", default=["none", "default", "side"])
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--queue-ms", type=float, default=100.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--trace", default=None, help="a folder: profile the first variant beside the default load")
    p.add_argument("--micro", action="store_true", help="also time the engines' batched decode alone")
    p.add_argument("--micro-loads", nargs="+", default=["none", "default", "side"])
    p.add_argument("--micro-sizes", nargs="+", type=int, default=[256])
    p.add_argument("--micro-parallel", nargs="+", type=int, default=[1])
    p.add_argument("--micro-outputs", nargs="+", default=["rgbi"], choices=["rgbi", "planes", "planes_roi"])
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    variants = a.variant if a.variant is not None else [""]
    rows = []
    for rep in range(a.repeats):
        for v in variants:
            for load in a.loads:
                r = measure(a.packed, v, load, a.batches, a.warmup, a.batch, a.size, a.queue_ms)
                r["repeat"] = rep
                rows.append(r)
                print(json.dumps(r), flush=True)
    out = {"rows": rows}
    if a.micro:
        try:
            out["micro"] = micro(a.packed, a.batch, a.queue_ms, a.micro_loads, a.micro_sizes, a.micro_parallel, outputs=a.micro_outputs)
        except Exception as e:
            out["micro_error"] = f"{type(e).__name__}: {e}"
            print("micro failed:", out["micro_error"])
    if a.trace:
        try:
            out["trace"] = trace(a.packed, variants[0], a.batch, a.size, a.queue_ms, a.trace)
        except Exception as e:
            out["trace_error"] = f"{type(e).__name__}: {e}"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    keys = ["gpu.engines_submit", "gpu.engines_native", "gpu.hybrid_decode", "gpu.cpu_decode", "gpu.finish", "decode"]
    print(f"\n{'variant':<24}{'load':<9}{'img/s':>8}" + "".join(f"{k.split('.')[-1][:12]:>13}" for k in keys))
    for r in rows:
        s = r["stage_ms_per_batch"]
        print(f"{r['variant'][:23]:<24}{r['load']:<9}{r['img_s']:>8}" + "".join(f"{s.get(k, 0):>13.1f}" for k in keys))
    for m in out.get("micro", []):
        print(f"micro {m['load']:<9}{m['output']:<11} threads {m['threads']} n={m['n']:<4} {m['ms_per_call']:8.2f} ms/call (max "
              f"{m['ms_max']:.2f}), native {m['native_ms']:.2f}, {m['img_s']:>7} img/s")
    for row in out.get("trace", []):
        print("trace", *row)
    if "trace_error" in out:
        print("trace failed:", out["trace_error"])


if __name__ == "__main__":
    main()
