"""The GPU batcher: one GPUDecoder per producer slot (nvJPEG states are per thread), one output
ring shared by all slots, routes from the index, the Loader's CUDA device, and — with a user
op — a uint8 ring plus a second pass of the same kernel that normalises into the output ring.
A compiled per-image op (recordtool.ops.ImageOp) runs there as its CUDA kernel, one launch per
batch, on the unmirrored images (the mirror is done by the normalising pass, as on the CPU)."""
from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np

from .cpu import call_user_op, image_op
from .recipe import ProducedBatch, Recipe


_SCHEDULES = {"auto": 0, "spin": 1, "yield": 2, "block": 4}  # CU_CTX_SCHED_*


def host_wait_policy(gpu_id: int, mode: str | None = None) -> int | None:
    """RECORDTOOL_GPU_SCHEDULE=auto|spin|yield|block, for measurements only: how every host
    thread of this process waits for the GPU's context (cuCtxSetFlags: the CUDA scheduling
    policy, process-wide — the training loop's waits too, which is why no default sets it).
    Returns the context's flags after the call, None when the variable is unset."""
    mode = os.environ.get("RECORDTOOL_GPU_SCHEDULE") if mode is None else mode
    if mode is None:
        return None
    from ..errors import ConfigError

    if mode not in _SCHEDULES:
        raise ConfigError(f"RECORDTOOL_GPU_SCHEDULE must be one of {', '.join(_SCHEDULES)}, not {mode!r}")
    import ctypes

    import cupy

    with cupy.cuda.Device(gpu_id):
        cupy.cuda.runtime.free(0)  # the device's primary context is current on this thread
        lib = ctypes.CDLL("libcuda.so.1")
        if not hasattr(lib, "cuCtxSetFlags"):
            raise ConfigError("RECORDTOOL_GPU_SCHEDULE needs cuCtxSetFlags (a CUDA 12.1 or later driver)")
        rc = lib.cuCtxSetFlags(ctypes.c_uint(_SCHEDULES[mode]))
        flags = ctypes.c_uint(0)
        rc = rc or lib.cuCtxGetFlags(ctypes.byref(flags))
        if rc:
            raise RuntimeError(f"cuCtxSetFlags / cuCtxGetFlags failed with CUDA error {rc}")
        return flags.value


def demand_from_env(environ=None):
    """The Loader's plan.Demand: the CPU first, the engines take a share of the batch only while
    the consumer waits (plan.Demand says why). RECORDTOOL_GPU_DEMAND=engines: the engines first,
    the CPU while it waits; =off: None, the share follows measured rates alone (both for
    measurements); anything else is a ConfigError."""
    from ..decode.gpu.plan import Demand
    from ..errors import ConfigError

    first = (os.environ if environ is None else environ).get("RECORDTOOL_GPU_DEMAND", "cpu")
    if first not in ("cpu", "engines", "off"):
        raise ConfigError(f"RECORDTOOL_GPU_DEMAND must be cpu, engines or off, not {first!r}")
    return None if first == "off" else Demand(first=first)


class GPUBatcher:
    """Makes the batches of a cuda Loader.

    With a user op, each batch's op and normalising pass is queued in one GIL-free call
    (decode.gpu.work.StreamWork); `native_queue = False` makes the same CuPy calls one by one
    (its reference, for the tests).

    Args:
        recipe: what a batch is, and its output (recipe.spec).
        gpu_id: CUDA device id (producer threads do not inherit the caller's current device).
        producers: producer slots (one GPUDecoder each).
        threads: CPU threads in all (shared by the slots' CPU shares).
        user_op: optional op on the uint8 NHWC CuPy batch before normalisation, or a compiled
            per-image op (recordtool.ops.ImageOp: its CUDA kernel).
        split, hybrid, chroma: see GPUDecoder.
        same_pixels: 4:4:4 and gray files to the CPU share (decode.gpu.plan.route).
        slots: output batches alive at once.
        max_batch: images per batch at most.
    """

    native_queue = True

    def __init__(self, recipe: Recipe, *, gpu_id: int, producers: int, threads: int, user_op, split, hybrid: bool,
                 slots: int, max_batch: int, chroma: str | None = None, same_pixels: bool = True):
        from ..decode.gpu import OutputRing, route
        from ..decode.gpu.kernel import kernel
        from ..decode.gpu.decoder import engine_chunk
        from ..decode.gpu.plan import DEFAULT_CHROMA

        # the measurement settings, read once and first: a bad one fails the Loader before any
        # allocation, and they hold for the decoders the producers make later
        demand, self.chunk = demand_from_env(), engine_chunk()
        self.recipe, self.gpu_id, self.producers = recipe, gpu_id, producers
        self.spec = spec = recipe.spec
        self.threads = threads
        self.user_op, self.split, self.hybrid = user_op, split, hybrid
        self.chroma = DEFAULT_CHROMA if chroma is None else chroma
        self.image_op = image_op(user_op)
        if self.image_op is not None:
            import cupy

            from ..ops.cuda import kernel as op_kernel

            with cupy.cuda.Device(gpu_id):
                op_kernel(self.image_op)  # compile now: a refused kernel fails the Loader, not a batch
        self.max_batch = max_batch
        host_wait_policy(gpu_id)
        # native threads of each decoder's CPU share: the cores left by the producers, shared out.
        # Measured on the H200 (BENCHMARKS.md): every core per producer's pool (64 threads on 16
        # cores) ran 15-25 % slower than this, 8 per pool ~13 % slower.
        self.cpu_threads = max(1, (threads - producers) // producers)
        ix = recipe.ds.index
        self.routes = route(ix.chroma, ix.progressive, ix.colorspace, same_pixels=same_pixels)
        h, w = spec.size
        self._decoders: dict = {}
        self._lock = threading.Lock()
        self.ring = OutputRing(spec.buffer_shape(max_batch), spec.storage_dtype, slots, gpu_id)
        # with a user op the decoders write uint8 NHWC here; the op runs on it; the kernel then
        # normalises it into `ring` (a 1:1 resample is an exact copy)
        self.raw_ring = OutputRing((max_batch, h, w, 3), "uint8", slots, gpu_id, producer_owned=True) \
            if user_op is not None else None
        self._passes: dict = {}  # producer slot → its normalising pass (_Pass), with a user op
        self._raw_spec = dataclasses.replace(spec, dtype="uint8", layout="NHWC", memory_format="contiguous")
        self._normalize = kernel(spec.dtype, spec.buffer_layout) if user_op is not None else None
        self.demand = demand

    def consumer_waited(self, wait: float, interval: float) -> None:
        """The consumer's wait for its last batch (EpochIterator), steering the CPU share."""
        if self.demand is not None:
            self.demand.observe(wait, interval)

    def decoder(self, slot: int):
        """The GPUDecoder of a producer slot, made and warmed up on first use, kept across epochs."""
        dec = self._decoders.get(slot)
        if dec is None:
            from ..decode.gpu import GPUDecoder

            with self._lock:
                ix = self.recipe.ds.index
                raw = self.user_op is not None
                dec = GPUDecoder(self._raw_spec if raw else self.spec, max_batch=self.max_batch,
                                 gpu_id=self.gpu_id, split=self.split, hybrid=self.hybrid, chroma=self.chroma,
                                 cpu_threads=self.cpu_threads, ring=self.raw_ring if raw else self.ring,
                                 demand=self.demand, chunk=self.chunk)
                dec.warmup(ix.jpeg_length, ix.width, ix.height, routes=self.routes)
                self._decoders[slot] = dec
        return dec

    def __call__(self, ids, epoch: int, slot: int, drawn: tuple | None = None):
        """The batch of these ids in this epoch, made by producer `slot` on its decoder; drawn:
        its (windows, flips) when the stream drew them (Recipe.draws)."""
        import cupy

        t0 = time.perf_counter()
        b = self.recipe.inputs(ids, epoch, drawn)
        t1 = time.perf_counter()
        dec = self.decoder(slot)
        op = self.image_op
        # a compiled op sees the image before the mirror (as on the CPU): the normalising pass mirrors
        images = dec(b.buffers, b.windows, np.zeros(len(ids), bool) if op is not None else b.flips,
                     self.routes[ids], ids=ids)
        t2 = t3 = time.perf_counter()
        ready = None
        if op is not None:
            h, w = self.spec.size
            params = op.batch_params(len(ids), b.keys, h, w)
            t3 = time.perf_counter()
            with cupy.cuda.Device(self.gpu_id), dec.stream:
                images, ready = self._normalise(images, dec, slot, (images,), flips=b.flips, op=(op, params))
        elif self.user_op is not None:
            with cupy.cuda.Device(self.gpu_id), dec.stream:
                first = images
                images = call_user_op(self.user_op, images, b.keys)
                t3 = time.perf_counter()
                images, ready = self._normalise(images, dec, slot, (first,))
        stages = {"inputs": t1 - t0, "decode": t2 - t1, "user_op": t3 - t2, "normalize": time.perf_counter() - t3}
        stages.update({"gpu." + k: v for k, v in dec.last.stages.items()})
        return ProducedBatch(images, b.labels, dec.last.errors, stages, dec.last, ready)

    def _normalise(self, raw, dec, slot: int, keep=(), flips=None, op=None):
        """uint8 NHWC (n, h, w, 3) → the output format, through the resize kernel at 1:1, mirrored
        where flips (default none); op: (compiled ImageOp, its params) run on `raw` in place
        first. Queued, not waited for, in one call (StreamWork: the uploads, the op's kernel,
        the normalising kernel): returns (batch, event after the pass); the consumer's stream
        waits for the event. The pass has its own sample table and params per slot (two host
        sets: one is filled while the last pass may still read the other), and keeps what it
        reads (`raw` and `keep`, uint8 ring slots) until the slot's next pass, which first
        waits for this one."""
        from ..decode.gpu.buffers import place_whole
        from ..decode.gpu.kernel import geometry
        from ..decode.gpu.work import StreamWork
        from ..ops.cuda import call

        cupy = dec.cupy
        n, size = raw.shape[0], self.spec.size
        p = self._passes.get(slot)
        if p is None:
            with self._lock:  # producers add their slots' passes at once (as decoders, `decoder`)
                nparams = self.image_op.nparams if self.image_op is not None else 0
                p = self._passes[slot] = _Pass(cupy, self.max_batch, nparams)
        raw = cupy.ascontiguousarray(raw)
        samples, host_params = p.host()  # the set is p's next only once this pass is queued
        samples = samples[:n]
        place_whole(samples, np.arange(n), size, raw.data.ptr)
        samples["mirror"] = 0 if flips is None else np.asarray(flips, np.int32)
        work = StreamWork()
        if op is not None and n:
            image_op, params = op
            if params.size:
                host_params = host_params[: params.size]
                host_params[:] = params.reshape(-1)
                work.copy(p.params_dev, host_params)
            work.launch(*call(image_op, raw, p.params_dev))
        out, ev = self.ring.take(n)
        if ev is not None:
            work.wait(ev)
        if n:
            work.copy(p.samples_dev, samples.view(np.uint8))
            work.launch(self._normalize, *geometry(p.samples_dev, n, out, size, self.spec.mean, self.spec.std))
        done = cupy.cuda.Event(disable_timing=True)
        try:
            work.queue(dec.stream, prev=p.done, done=done, native=self.native_queue)
        except Exception:
            try:  # nothing queued may still read this slot's host sets
                dec.stream.synchronize()
            except Exception:  # noqa: BLE001  (a device in an error state: the first error is the one to raise)
                pass
            p.done, p.held = None, ()
            raise
        p.done, p.held = done, (raw,) + tuple(keep)
        p.used()
        return out, done

    def close(self) -> None:
        for p in self._passes.values():
            p.finish()
        self._passes.clear()
        for dec in self._decoders.values():
            dec.close()
        self._decoders.clear()


class _Pass:
    """A producer slot's normalising pass (with a user op): two pinned host sets of its sample
    table and op params, used in turn (a pass waits for the one before it, so the set of the
    pass before that is free), their device copies, the event after its last pass and the
    uint8 images that pass reads."""

    def __init__(self, cupy, max_batch: int, nparams: int):
        from ..decode.gpu import SAMPLE_DTYPE

        table = max_batch * SAMPLE_DTYPE.itemsize  # a multiple of 8: the params that follow are aligned
        self._mem = [cupy.cuda.alloc_pinned_memory(table + 8 * max(1, max_batch * nparams)) for _ in range(2)]
        self._sets = [(np.frombuffer(m, SAMPLE_DTYPE, max_batch),
                       np.frombuffer(m, np.float64, max_batch * nparams, offset=table)) for m in self._mem]
        self._next = 0
        self.samples_dev = cupy.empty(table, np.uint8)
        self.params_dev = cupy.empty(max(1, max_batch * nparams), np.float64)
        self.done, self.held = None, ()

    def host(self):
        """(sample table, params) of the host set to fill: the one the pass before last used
        (its copies are done: the last pass waited for it). The same set until `used`."""
        return self._sets[self._next]

    def used(self) -> None:
        """The set `host` gave is queued: the next pass fills the other one."""
        self._next ^= 1

    def finish(self) -> None:
        """Wait for the last pass; then what it read may be reused."""
        if self.done is not None:
            self.done.synchronize()
            self.done = None
        self.held = ()
