"""Training loader: sampler → windows → fused decode → mirror → user op → normalize, prefetched.

A producer thread builds batches ahead into a bounded queue while the training loop consumes
them; decode runs on the native thread pool (CPU) or the GPU decoder (NVJPG + CPU split), both
outside the GIL. Batches are a pure function of (seed, epoch, rank, world_size, batch index),
so `state_dict()` is just where the epoch stands, and resuming yields exactly the batches an
uninterrupted run would have.
"""
from __future__ import annotations

import os
import queue
import threading
import warnings

import numpy as np

from .decode import center_windows, decode_crop_resize, mirror, normalize, random_flips, random_windows
from .decode.ops import IMAGENET_MEAN, IMAGENET_STD
from .reader import Dataset
from .errors import RecordError  # noqa: F401
from .user_ops import KeyedOp

_END = object()


def _dist_defaults(rank, world_size):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else rank), (dist.get_world_size() if world_size is None
                                                                 else world_size)
    except ImportError:
        pass
    return (int(os.environ.get("RANK", 0)) if rank is None else rank,
            int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size)


class _Failure:
    def __init__(self, exc):
        self.exc = exc


class Loader:
    """Iterate `(images, labels)` batches of a packed dataset.

    device "cpu": images come from the native CPU decoder; "cuda": from the GPU decoder.
    train=True: RandomResizedCrop windows + random horizontal flip (keyed by seed, epoch and
    sample id); train=False: resize 256 + centre crop `size`. Tensors are torch tensors when
    torch imports (DLPack on the GPU), else numpy / CuPy arrays. `user_op(batch)` runs on each
    uint8 NHWC batch before normalization (numpy on CPU, CuPy on GPU) and returns the batch.
    """

    def __init__(self, path, batch_size: int, device: str = "cpu", train: bool = True, size: int = 224,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype: str = "float32", layout: str = "NCHW",
                 seed: int = 0, rank: int | None = None, world_size: int | None = None, drop_last: bool = True,
                 prefetch: int = 2, threads: int | None = None, user_op=None, as_torch: bool | None = None,
                 producers: int | None = None, with_ids: bool = False, split="auto", on_error: str = "raise"):
        if device not in ("cpu", "cuda"):
            raise ValueError("device must be 'cpu' or 'cuda'")
        self.ds = path if isinstance(path, Dataset) else Dataset(path)
        self.batch_size = int(batch_size)
        self.device, self.train, self.size = device, train, int(size)
        self.mean, self.std, self.dtype, self.layout = mean, std, dtype, layout
        self.seed, self.drop_last, self.prefetch = seed, drop_last, max(1, int(prefetch))
        self.threads = threads or os.cpu_count() or 1
        self.user_op = user_op
        self.with_ids = with_ids  # also yield each batch's sample ids (coverage checks, debugging)
        # cuda: how images are shared between the NVJPG engines and the CPU (decode.gpu.GPUDecoder).
        # "auto" follows measured rates, so which path decodes an image varies from run to run and
        # its pixels by a few levels (≥ 40 dB); "gpu" makes every batch bit-identical across runs.
        self.split = split
        # a record whose image neither libjpeg nor Pillow can decode: "raise" (RecordError in the
        # training loop, naming shard and offset) or "warn" (a warning each time; the sample is
        # zeros, its label kept; listed in .bad_records)
        if on_error not in ("raise", "warn"):
            raise ValueError("on_error must be 'raise' or 'warn'")
        self.on_error = on_error
        self.bad_records = {}  # record id → reason
        # producer threads, batches dealt round-robin and handed out in order. On the GPU several
        # keep the NVJPG engines fed while one stages the next batch (BENCHMARKS.md: 4 best); on
        # the CPU two, so one's Python work and user op overlap the other's decode on the pool.
        self.producers = max(1, int(producers or (4 if device == "cuda" else 2)))
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.sampler = self.ds.sampler(seed=seed, rank=self.rank, world_size=self.world_size, drop_last=drop_last)
        if as_torch is None:
            try:
                import torch  # noqa: F401

                as_torch = True
            except ImportError:
                as_torch = False
        self.as_torch = as_torch
        self.epoch = 0
        self._start_batch = 0  # set by load_state_dict: first batch of the next iteration
        self._yielded = 0
        self._threads = []
        self._stop = threading.Event()
        self._gpu = {}  # producer slot → its GPUDecoder
        self._gpu_lock = threading.Lock()
        self._ring = None  # output batches shared by the GPU decoders (decode.gpu.OutputRing)
        self._routes = None  # per record: engines, hybrid or CPU (decode.gpu.route)
        # the GPU to use is the caller's current one (torch.cuda.set_device / cupy Device.use):
        # producer threads do not inherit it, so it is passed down explicitly
        self.gpu_id = 0
        if device == "cuda":
            import cupy

            self.gpu_id = cupy.cuda.runtime.getDevice()
            try:
                import torch

                if torch.cuda.is_initialized():
                    self.gpu_id = torch.cuda.current_device()
            except ImportError:
                pass
        self.last_split = None
        if device == "cpu":
            from .decode import cpu

            cpu.reserve(self.ds.index.width, self.ds.index.height, self.threads)

    # ------------------------------------------------------------------ epoch bookkeeping
    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._start_batch = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self._yielded, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "world_size", "batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state_dict {key}={state[key]} does not match this loader's {getattr(self, key)}")
        self.epoch, self._start_batch = int(state["epoch"]), int(state["batch"])

    def batch_ids(self, epoch: int) -> list:
        order = self.sampler.indices(epoch)
        b = self.batch_size
        stop = len(order) // b * b if self.drop_last else len(order)
        return [order[s:s + b] for s in range(0, stop, b)]

    # ------------------------------------------------------------------ one batch
    def make_batch(self, ids: np.ndarray, epoch: int, producer: int = 0):
        """The batch of these sample ids in this epoch: a pure function of its arguments.
        `producer` picks the GPU decoder (one per producer slot, kept across epochs)."""
        ix = self.ds.index
        if isinstance(self.user_op, KeyedOp):  # keyed randomness, like the crop windows
            self.user_op.ids, self.user_op.epoch = ids, epoch
        bufs = [self.ds[int(i)][0] for i in ids]
        w, h = ix.width[ids], ix.height[ids]
        if self.train:
            win = random_windows(w, h, ids, self.seed, epoch)
            flips = random_flips(ids, self.seed, epoch)
        else:
            win = center_windows(w, h, resize=round(self.size * 256 / 224), crop=self.size)
            flips = np.zeros(len(ids), bool)
        labels = ix.label[ids].astype(np.int64)
        if self.device == "cpu":
            errors = []
            images = decode_crop_resize(bufs, win, size=(self.size, self.size), threads=self.threads,
                                        on_error="skip", fallback=True, errors=errors)
            self._bad(ids, errors)
            if self.user_op is not None:  # the user sees the batch as training will, flips included
                images = self.user_op(mirror(images, flips))
                flips = np.zeros(len(ids), bool)
            images = normalize(images, self.mean, self.std, self.layout, np.dtype(self.dtype), flips=flips,
                               threads=self.threads)
            if self.as_torch:
                import torch

                return torch.from_numpy(images), torch.from_numpy(labels)
            return images, labels
        return self._gpu_batch(bufs, win, flips, ids, labels, producer)

    def _decoder(self, producer: int):
        """The GPU decoder of a producer slot (kept across epochs: each epoch starts new threads).
        All slots share one output ring sized for every batch that can be alive at once: queued,
        being made, and the consumer's current and previous one."""
        from .decode.gpu import GPUDecoder, OutputRing, route

        dec = self._gpu.get(producer)
        if dec is None:
            with self._gpu_lock:
                ix = self.ds.index
                if self._routes is None:
                    self._routes = route(ix.chroma, ix.progressive, ix.colorspace)
                out_dtype = "uint8" if self.user_op is not None else self.dtype
                layout = "NHWC" if self.user_op is not None else self.layout
                dec = GPUDecoder((self.size, self.size), max_batch=self.batch_size, layout=layout, dtype=out_dtype,
                                 mean=self.mean, std=self.std, device=self.gpu_id, split=self.split,
                                 cpu_threads=max(1, (self.threads - self.producers) // self.producers))
                if self._ring is None:
                    slots = self.producers * (self.prefetch + 1) + 2
                    self._ring = OutputRing(dec.output_shape(), out_dtype, slots, self.gpu_id)
                dec.ring = self._ring
                dec.warmup(ix.jpeg_length, ix.width, ix.height, routes=self._routes)
                self._gpu[producer] = dec
        return dec

    def _gpu_batch(self, bufs, win, flips, ids, labels, producer):
        dec = self._decoder(producer)
        images = dec(bufs, win, flips, self._routes[ids])
        self.last_split = dict(dec.last)
        self._bad(ids, dec.last.get("errors", []))
        if self.user_op is not None:  # uint8 NHWC on the device → user op → normalize
            import cupy

            with cupy.cuda.Device(self.gpu_id), dec.stream:
                images = self.user_op(images)
                x = images.astype(cupy.float32) / 255.0
                x = (x - cupy.asarray(self.mean, cupy.float32)) / cupy.asarray(self.std, cupy.float32)
                if self.layout == "NCHW":
                    x = cupy.ascontiguousarray(x.transpose(0, 3, 1, 2))
                images = x.astype(self.dtype)
                dec.stream.synchronize()
        if self.as_torch:
            import torch

            from .decode.gpu import to_torch

            with torch.cuda.device(self.gpu_id):
                return to_torch(images, dec.stream), torch.from_numpy(labels).cuda(self.gpu_id, non_blocking=True)
        return images, labels

    def _bad(self, ids, errors) -> None:
        if not errors:
            return
        c = self.ds.index.columns
        lines = []
        for i, reason in errors:
            r = int(ids[i])
            shard = self.ds.shards[int(c["shard"][r])]["name"]
            where = os.path.join(self.ds.root, shard)
            lines.append(f"record {r} ({where}, image bytes at offset {int(c['jpeg_offset'][r])}, "
                         f"{int(c['jpeg_length'][r])} bytes): {reason}")
            self.bad_records[r] = reason
        if self.on_error == "raise":
            raise RecordError("undecodable image(s): " + "; ".join(lines))
        for line in lines:
            warnings.warn(f"recordtool: {line}; the sample is zeros this time", RuntimeWarning, stacklevel=2)

    # ------------------------------------------------------------------ pipeline
    def __iter__(self):
        self.close()
        epoch, start = self.epoch, self._start_batch
        self._start_batch = 0
        batches = self.batch_ids(epoch)[start:]
        P = self.producers
        queues = [queue.Queue(maxsize=self.prefetch) for _ in range(P)]
        self._stop = stop = threading.Event()

        def put(q, item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce(k):
            try:
                for ids in batches[k::P]:
                    batch = self.make_batch(ids, epoch, k)
                    if self.with_ids:
                        batch = (*batch, ids)
                    if stop.is_set() or not put(queues[k], batch):
                        return
                put(queues[k], _END)
            except BaseException as e:  # surfaces in the training loop, with its traceback
                put(queues[k], _Failure(e))

        self._threads = [threading.Thread(target=produce, args=(k,), name="recordtool-loader", daemon=True)
                         for k in range(P)]
        for t in self._threads:
            t.start()
        self._yielded = start
        try:
            for j in range(len(batches)):
                item = queues[j % P].get()
                if isinstance(item, _Failure):
                    raise item.exc
                self._yielded += 1
                yield item
            self.epoch = epoch + 1  # a finished epoch moves on, as DataLoader users expect with set_epoch
            self._yielded = 0
        finally:
            stop.set()
            self._join()

    def _join(self):
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=30)
        self._threads = []

    def close(self) -> None:
        """Stop the producer thread (also on `del` and at the end of an iteration)."""
        self._stop.set()
        self._join()

    def __del__(self):
        try:
            self.close()
            for dec in self._gpu.values():  # their worker threads and nvJPEG handles
                dec.close()
            self._gpu.clear()
        except Exception:
            pass
