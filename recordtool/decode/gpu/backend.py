"""The GPU backend: one GPUDecoder per producer slot (nvJPEG states are per thread) and, for a
local dataset, one look-ahead lane (ahead.py: the next batch's CPU-routed images decoded
while this one is made) and the next batch's engines' call submitted while this one is
finished (GPUOptions.engines_ahead: the decoder's second phase); one output ring shared by all slots, routes from the index, the
Loader's CUDA device, and — with a user op — a uint8 ring plus a second pass of the same kernel
that normalises into the output ring. The consumer's side: the run-ahead bound and the DLPack
hand-off (handout.py), the steering of the CPU share (plan.Demand).
A compiled per-image op (recordtool.ops.ImageOp) runs there as its CUDA kernel, one launch per
batch, on the unmirrored images (the mirror is done by the normalising pass, as on the CPU)."""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from ..backend import Backend, BatchStats, CompiledOp, ProducedBatch, as_bfloat16, call_user_op, op_params
from ..options import GPUOptions
from ..recipe import Recipe
from .ahead import AheadLane
from .buffers import OutputRing
from .decoder import GPUDecoder, wait_ready
from .handout import RunAhead, to_torch
from .kernel import kernel
from .normalize import NormalizePass
from .plan import CPU, Demand, route


class GPUBackend(Backend):
    """Makes the batches of a cuda Loader (decode.backend.Backend).

    With a user op, each batch's op and normalising pass is queued in one GIL-free call
    (decode.gpu.work.StreamWork); `native_queue = False` makes the same CuPy calls one by one
    (its reference, for the tests).

    Args:
        recipe: what a batch is, and its output (recipe.output).
        gpu_id: CUDA device id (producer threads do not inherit the caller's current device).
        producers: producer slots (one GPUDecoder each).
        threads: CPU threads in all (shared by the slots' CPU shares).
        user_op: optional op on the uint8 NHWC CuPy batch before normalisation, or a compiled
            per-image op (recordtool.ops.ImageOp: its CUDA kernel).
        image_op: `user_op` when it is a compiled per-image op, its CUDA kernel compiled by the
            Loader on this GPU (ImageOp.prepare); else None.
        options: the checked GPUOptions, whole: split, hybrid, chroma (each GPUDecoder's),
            same_pixels (4:4:4 and gray files to the CPU share: plan.route), first (the
            Demand's) and run_ahead (RunAhead's).
        look_ahead: each producer slot decodes its next batch's CPU-routed images ahead
            (`announce`, ahead.py) and, with options.engines_ahead, submits its engines' call
            ahead. False for a dataset URL: its shard cache counts a record served once its
            view is taken, and fetches along the epoch's plan.
        slots: output batches alive at once.
        max_batch: images per batch at most.
    """

    native_queue = True

    def __init__(self, recipe: Recipe, *, gpu_id: int, producers: int, threads: int, user_op,
                 image_op: CompiledOp | None, options: GPUOptions, slots: int, max_batch: int,
                 look_ahead: bool = True):
        self.recipe, self.gpu_id, self.producers = recipe, gpu_id, producers
        self.output = spec = recipe.output
        self.threads = threads
        self.user_op, self.options = user_op, options
        self.image_op = image_op
        self.max_batch = max_batch
        # native threads of each decoder's CPU share: the cores left by the producers, shared out.
        # Not every core per producer's pool: the pools would then hold several threads per core,
        # which contend with each other and with the training loop for the same cores.
        self.cpu_threads = max(1, (threads - producers) // producers)
        ix = recipe.ds.index
        self._pixels = ix.width.astype(np.int64) * ix.height  # each record's (the lanes decode largest first)
        self.routes = route(ix.chroma, ix.progressive, ix.colorspace, same_pixels=options.same_pixels,
                            pixels=self._pixels)
        h, w = spec.size
        self._decoders: dict = {}
        self.announces = look_ahead  # BatchStream tells each producer its next batch (`announce`)
        self._lanes: dict = {}  # producer slot → its AheadLane (made on first use, kept across epochs)
        self.engines_ahead = look_ahead and options.engines_ahead
        # producer slot → (epoch, ids, drawn) of its announced next batch, and → (key, inputs) of
        # the batch whose engines' call its decoder began ahead: each written and read by that
        # slot's producer thread only
        self._next: dict = {}
        self._begun: dict = {}
        self._cpu_routed = self.routes == CPU
        self._lock = threading.Lock()
        self._room = None  # _room_sample's windows, made once
        self.ring = OutputRing(spec.buffer_shape(max_batch), spec.storage_dtype, slots, gpu_id)
        # with a user op the decoders write uint8 NHWC here; the op runs on it; the kernel then
        # normalises it into `ring` (a 1:1 resample is an exact copy)
        self.raw_ring = OutputRing((max_batch, h, w, 3), "uint8", slots, gpu_id, producer_owned=True) \
            if user_op is not None else None
        self._passes: dict = {}  # producer slot → its normalising pass (NormalizePass), with a user op
        self._raw_spec = dataclasses.replace(spec, dtype="uint8", layout="NHWC", memory_format="contiguous")
        self._normalize = kernel(spec.dtype, spec.buffer_layout) if user_op is not None else None
        # one side first (GPUOptions.first), the other takes a share of the batch only while the
        # consumer waits (plan.Demand says why); shared by the producers' decoders
        self.demand = Demand(first=options.first)
        # how far the consumer may queue GPU work ahead of the batches it takes (handout.py)
        self._pace = None if options.run_ahead is None else RunAhead(options.run_ahead, gpu_id)

    def pace(self, stages: dict) -> None:
        """Before the consumer takes a batch: with run_ahead, sleep until the GPU is past the
        work it queued `run_ahead` hand-outs ago (RunAhead), the seconds in stages["run_ahead"]."""
        if self._pace is not None:
            stages["run_ahead"] = stages.get("run_ahead", 0.0) + self._pace.before()

    def consumer_waited(self, wait: float, interval: float) -> None:
        """The consumer's wait for its last batch (EpochIterator), steering the CPU share."""
        self.demand.observe(wait, interval)

    def stats(self, made: ProducedBatch) -> BatchStats:
        """The batch's split (its BatchReport): images per decoder, overflow, decoded ahead."""
        r = made.report
        return BatchStats({"gpu": r.gpu, "hybrid": r.hybrid, "cpu": r.cpu}, r.overflow, r.ahead, r)

    def handout(self, made: ProducedBatch, as_torch: bool) -> tuple:
        """The batch for the consumer's stream: it waits for the producer's last pass (made.ready),
        the images go to torch through DLPack and the labels to the GPU (as_torch); then the
        hand-out is marked for the run-ahead bound."""
        images, labels = made.images, made.labels
        if made.ready is not None:  # its producer queued the batch's last pass without waiting for it
            wait_ready(made.ready, self.gpu_id, as_torch)
        if as_torch:
            import torch

            with torch.cuda.device(self.gpu_id):  # complete, or torch's stream waits for it (made.ready)
                # labels: a plain copy; a batch's labels are a few KiB, which pinning would not speed up
                images, labels = to_torch(images), torch.from_numpy(labels).cuda(self.gpu_id, non_blocking=True)
            images = as_bfloat16(images, self.output)
        images = self.output.arrange(images)  # channels_last: the NCHW-shaped view of the NHWC batch
        if self._pace is not None:
            self._pace.handed()
        return images, labels

    ROOM_SAMPLE = 65_536
    """Records whose windows of two epochs size the decoders' arena (GPUDecoder.warmup's
    `windows`): the mean and spread of a crop's region, not every record's."""

    def _room_sample(self):
        """(ids, windows): the crop windows of epochs 0 and 1 of up to ROOM_SAMPLE records (a
        fixed choice; the first decoder's call computes them, under the lock)."""
        if self._room is None:
            n = len(self.recipe.ds.index.width)
            ids = np.arange(n) if n <= self.ROOM_SAMPLE else \
                np.sort(np.random.default_rng(0).choice(n, self.ROOM_SAMPLE, replace=False))
            self._room = (np.concatenate([ids, ids]),
                          np.concatenate([self.recipe.draws(ids, epoch)[0] for epoch in (0, 1)]))
        return self._room

    def decoder(self, slot: int):
        """The GPUDecoder of a producer slot, made and warmed up on first use, kept across epochs."""
        dec = self._decoders.get(slot)
        if dec is None:
            with self._lock:
                ix = self.recipe.ds.index
                raw = self.user_op is not None
                dec = GPUDecoder(self._raw_spec if raw else self.output, self.options, max_batch=self.max_batch,
                                 gpu_id=self.gpu_id, cpu_threads=self.cpu_threads,
                                 ring=self.raw_ring if raw else self.ring, demand=self.demand,
                                 engines_ahead=self.engines_ahead)
                dec.warmup(ix.jpeg_length, ix.width, ix.height, routes=self.routes, chroma=ix.chroma,
                           windows=self._room_sample())
                self._decoders[slot] = dec
        return dec

    def announce(self, ids, epoch: int, slot: int, drawn: tuple | None = None) -> None:
        """Producer `slot`'s next batch (these ids in this epoch; drawn: its windows and flips):
        its lane starts decoding the batch's CPU-routed images (BatchStream calls this before
        making the slot's current batch, where `announces`)."""
        if not self.announces:
            return
        ids = np.asarray(ids)
        if self.engines_ahead:  # make() hands it to the decoder, which begins it beside this batch's end
            self._next[slot] = (epoch, ids, drawn)
        sel = self._cpu_routed[ids].nonzero()[0]
        lane = self._lanes.get(slot)
        if lane is None:
            with self._lock:
                lane = self._lanes[slot] = AheadLane(self.output.size)
        if not len(sel):
            lane.ahead(epoch, ids[:0], [], np.zeros((0, 4)), ids[:0])
            return
        windows = (self.recipe.draws(ids, epoch) if drawn is None else drawn)[0]
        lane.ahead(epoch, ids[sel], self.recipe.ds.jpeg_views(ids[sel]), np.asarray(windows)[sel],
                   self._pixels[ids[sel]])

    def make(self, ids, epoch: int, slot: int, drawn: tuple | None = None) -> ProducedBatch:
        """The batch of these ids in this epoch, made by producer `slot` on its decoder; drawn:
        its (windows, flips) when the stream drew them (Recipe.draws). The images its lane
        decoded ahead (`announce`) are taken, not decoded again."""
        import cupy

        t0 = time.perf_counter()
        ids = np.asarray(ids)
        key = (epoch, ids.tobytes())
        begun = self._begun.pop(slot, None)  # this batch's inputs, where its engines' call was begun ahead
        b = begun[1] if begun is not None and begun[0] == key else self.recipe.inputs(ids, epoch, drawn)
        lane = self._lanes.get(slot)
        decoded = lane.take(epoch, ids) if lane is not None else None
        t1 = time.perf_counter()
        dec = self.decoder(slot)
        op = self.image_op
        # a compiled op sees the image before the mirror (as on the CPU): the normalising pass mirrors
        images = dec(b.buffers, b.windows, np.zeros(len(ids), bool) if op is not None else b.flips,
                     self.routes[ids], ids=ids, decoded=decoded, key=key, ahead=self._ahead(slot))
        t2 = t3 = time.perf_counter()
        ready = None
        if op is not None:
            h, w = self.output.size
            params = op_params(op, len(ids), b.keys, h, w)
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

    def _ahead(self, slot: int):
        """The decoder's `ahead` for producer `slot`'s announced next batch: (key, inputs), its
        inputs made when the decoder begins it and kept for that batch's own make; None where
        nothing was announced."""
        nxt = self._next.pop(slot, None)
        if nxt is None:
            return None
        epoch, ids, drawn = nxt
        key = (epoch, ids.tobytes())

        def inputs():
            b = self.recipe.inputs(ids, epoch, drawn)
            self._begun[slot] = (key, b)
            return b.buffers, b.windows, self.routes[ids], ids

        return key, inputs

    def _normalise(self, raw, dec, slot: int, keep=(), flips=None, op=None):
        """uint8 NHWC (n, h, w, 3) → the output format in a batch of the ring, queued on the
        slot's decoder's stream by the slot's NormalizePass (made on first use); flips, op: see
        NormalizePass. Returns (batch, event after the pass): the consumer's stream waits for it."""
        p = self._passes.get(slot)
        if p is None:
            with self._lock:  # producers add their slots' passes at once (as decoders, `decoder`)
                nparams = self.image_op.nparams if self.image_op is not None else 0
                p = self._passes[slot] = NormalizePass(dec.cupy, self.max_batch, nparams)
        return p(raw, dec.stream, self.ring, self._normalize, self.output, keep, flips=flips, op=op,
                 native=self.native_queue)

    def close(self) -> None:
        for p in self._passes.values():
            p.finish()
        self._passes.clear()
        for dec in self._decoders.values():
            dec.close()
        self._decoders.clear()
        self._next.clear()
        self._begun.clear()
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()

