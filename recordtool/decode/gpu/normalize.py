"""`NormalizePass`: with a user op, the decoders write uint8 NHWC images; a producer slot's
second pass of the resize kernel runs the op's compiled kernel on them (if any) and normalises
them at 1:1 into the output ring — queued, not waited for, in one GIL-free call (StreamWork).

Why its own pinned host sets: what is queued reads its host sources when the stream reaches it,
so the sample table and op params of a pass must stay untouched until that pass is done; two
sets used in turn (each pass first waits for the one before it) keep one free to fill.
"""
from __future__ import annotations

import numpy as np

from .buffers import place_whole
from .kernel import SAMPLE_DTYPE, geometry


class NormalizePass:
    """A producer slot's normalising pass (with a user op): two pinned host sets of its sample
    table and op params, used in turn (a pass waits for the one before it, so the set of the
    pass before that is free), their device copies, the event after its last pass and the
    uint8 images that pass reads."""

    def __init__(self, cupy, max_batch: int, nparams: int):
        self.cupy = cupy
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

    def __call__(self, raw, stream, ring, kernel, spec, keep=(), flips=None, op=None, native: bool = True):
        """uint8 NHWC (n, h, w, 3) → spec's output in a batch of `ring`, through `kernel` (the
        resize kernel for spec's dtype and layout) at 1:1, mirrored where flips (default none);
        op: (the compiled op the Loader handed in — decode.backend.CompiledOp, its CUDA kernel
        built —, its params) run on `raw` in place first. Queued on `stream` in one
        call (StreamWork: the uploads, the op's kernel, the normalising kernel; native=False:
        the same CuPy calls one by one, its reference); returns (batch, event after the pass),
        which the consumer's stream waits for. Keeps what it reads (`raw` and `keep`) until the
        next pass, which first waits for this one."""
        from .work import StreamWork  # the nvJPEG binding's module and the native queue: loaded at a pass

        cupy = self.cupy
        n, size = raw.shape[0], spec.size
        raw = cupy.ascontiguousarray(raw)
        samples, host_params = self.host()  # the set is the next one only once this pass is queued
        samples = samples[:n]
        place_whole(samples, np.arange(n), size, raw.data.ptr)
        samples["mirror"] = 0 if flips is None else np.asarray(flips, np.int32)
        work = StreamWork()
        if op is not None and n:
            image_op, params = op
            if params.size:
                host_params = host_params[: params.size]
                host_params[:] = params.reshape(-1)
                work.copy(self.params_dev, host_params)
            work.launch(*image_op.cuda_launch(raw, self.params_dev))
        out, ev = ring.take(n)
        if ev is not None:
            work.wait(ev)
        if n:
            work.copy(self.samples_dev, samples.view(np.uint8))
            work.launch(kernel, *geometry(self.samples_dev, n, out, size, spec.mean, spec.std))
        done = cupy.cuda.Event(disable_timing=True)
        try:
            work.queue(stream, prev=self.done, done=done, native=native)
        except Exception:
            try:  # nothing queued may still read this slot's host sets
                stream.synchronize()
            except Exception:  # noqa: BLE001  (a device in an error state: the first error is the one to raise)
                pass
            self.done, self.held = None, ()
            raise
        self.done, self.held = done, (raw,) + tuple(keep)
        self.used()
        return out, done
